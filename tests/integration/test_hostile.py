"""What a hostile or buggy job or client sends: each case a reproduction of an attack that once
crashed, stalled or fooled gpuqd (docs/reliability.md, "Untrusted input"). Every test checks the
daemon is still answering afterwards."""
import json
import os
import pty
import signal
import socket
import subprocess
import threading
import time
import unittest

from harness import BIN, DaemonTest, event_line, wait_until


def python_job(code, **spec):
    """A job whose command is a Python program (for bytes a shell cannot write easily)."""
    return dict({"command": ["python3", "-c", code]}, **spec)


class HostileEvents(DaemonTest):
    def assert_alive(self):
        self.assertEqual(self.d.request({"cmd": "hello", "protocol_version": 1})["ok"], True)

    def test_an_event_line_nested_100000_deep_is_one_bad_line_and_survives_a_restart(self):
        # It used to overflow gpuqd's stack, and its offset was never committed, so every restart
        # read it again and died again.
        code = ("import os\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write('{\"type\":\"progress\",\"x\":' + '[' * 100000 + ']' * 100000 + '}\\n')\n"
                "    f.write('{\"type\": \"result\", \"after\": 1}\\n')\n")
        job_id = self.d.submit(python_job(code, name="deep"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["bad_event_lines"], 1)
        self.assertEqual(job["result"], {"after": 1})
        self.assertIn("nests deeper than", job["first_bad_event"])
        self.assertLess(len(job["first_bad_event"]), 400)  # the line's first bytes, not the line
        self.d.kill9()
        self.d.start()
        self.assert_alive()
        self.assertEqual(self.d.show(job_id)["job"]["bad_event_lines"], 1)
        self.assertIn("nests deeper than", self.d.show(job_id)["job"]["first_bad_event"])  # stored

    def test_a_last_event_line_without_a_newline_is_read_once_the_job_ends(self):
        code = ("import json, os\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write(json.dumps({'type': 'result', 'acc': 0.5}))\n")
        job_id = self.d.submit(python_job(code, name="no-newline"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"acc": 0.5})
        self.assertEqual(job["bad_event_lines"], 0)

    def test_a_50_mb_line_counts_once_and_a_result_forged_at_its_end_is_not_taken(self):
        code = ("import os\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write(' ' * (50 << 20) + ',{\"type\": \"result\", \"forged\": 1}\\n')\n"
                "    f.write('{\"type\": \"result\", \"real\": 1}\\n')\n")
        job_id = self.d.submit(python_job(code, name="overlong"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"real": 1})
        self.assertEqual(job["bad_event_lines"], 1)
        self.assert_alive()

    def test_a_10_gb_sparse_events_file_is_read_to_64_mib_and_no_further(self):
        # Reading it through held gpuqd's thread for half a minute at the job's end.
        code = ("import os\n"
                "p = os.environ['GPUQ_EVENTS']\n"
                "with open(p, 'a') as f:\n"
                "    f.write('{\"type\": \"result\", \"first\": 1}\\n')\n"
                "os.truncate(p, 10 << 30)\n"
                "with open(p, 'a') as f:\n"
                "    f.write('\\n{\"type\": \"result\", \"beyond\": 1}\\n')\n")
        job_id = self.d.submit(python_job(code, name="sparse"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"first": 1})
        self.assertGreaterEqual(job["bad_event_lines"], 1)
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            self.assertIn(f"job {job_id}: rank 0's events file is over 64 MiB; the rest of it is not read", f.read())
        self.assert_alive()

    def test_a_forged_exit_record_of_the_wrong_types_fails_the_job_instead_of_gpuqd(self):
        # The job's directory is the job's to write: an exit record with every field of the wrong
        # type, left where the supervisor would write one, must not throw inside gpuqd.
        bad = json.dumps({"ranks": [1, "x", None], "first_failure": {"rank": "r", "signal": "9"},
                          "ended_at": "now", "cancelled": "yes", "error": 7})
        code = ("import os, signal\n"
                "d = os.path.dirname(os.environ['GPUQ_EVENTS'])\n"
                f"open(os.path.join(d, 'exit.json'), 'w').write({bad!r})\n"
                "os.kill(os.getppid(), signal.SIGKILL)\n")  # the supervisor: no record of its own
        job_id = self.d.submit(python_job(code, name="forger"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "failed")
        self.assert_alive()

    def test_an_exit_record_written_by_a_running_job_does_not_end_it_across_a_restart(self):
        release = self.tmp_path("release")
        code = ("import json, os, time\n"
                "d = os.path.dirname(os.environ['GPUQ_EVENTS'])\n"
                "open(os.path.join(d, 'exit.json'), 'w').write(json.dumps({'ranks': [{'exit_code': 0}]}))\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write('{\"type\": \"progress\", \"forged\": 1}\\n')\n"
                f"while not os.path.exists({release!r}):\n"
                "    time.sleep(0.05)\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write('{\"type\": \"result\", \"finished\": 1}\\n')\n")
        job_id = self.d.submit(python_job(code, name="early-record"))["ids"][0]
        wait_until(lambda: (self.d.show(job_id)["job"]["progress"] or {}).get("forged") == 1,
                   what="the forged record to be written")
        self.d.kill9()
        self.d.start()
        self.assertEqual(self.d.show(job_id)["job"]["state"], "running")
        open(release, "w").close()
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"finished": 1})

    def test_what_a_job_writes_reaches_no_terminal_as_control_characters_and_json_stays_exact(self):
        # Escape sequences that set the window title, clear the screen, start a C1 control sequence
        # or reverse the line: in result and progress keys and values, and in a failure's last line.
        key, value = "k\x1b]0;owned\x07", "v\x1b[2J\u009b31m\x7f\u202etxt"
        code = ("import json, os, sys, time\n"
                f"k, v = {key!r}, {value!r}\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write(json.dumps({'type': 'progress', 'step': 1, k: v}) + '\\n')\n"
                "    f.write(json.dumps({'type': 'result', 'acc': 0.5, k: v}) + '\\n')\n")
        done = self.d.submit(python_job(code, name="escapes"))["ids"][0]
        failed = self.d.submit(python_job("import sys; sys.stdout.buffer.write(b'boom \\xc2\\x9b2J\\xe2\\x80\\xae!\\n'); "
                                          "sys.exit(1)", name="fails"))["ids"][0]
        jobs = self.d.wait([done, failed])
        self.assertEqual((jobs[done]["state"], jobs[failed]["state"]), ("succeeded", "failed"))
        # --json is exact: the job's own keys and values, as it wrote them.
        self.assertEqual(jobs[done]["result"], {"acc": 0.5, key: value})
        self.assertEqual(json.loads(self.d.ok("result", str(done), "--json"))["result"][key], value)
        self.assertIn("\u009b2J\u202e!", jobs[failed]["reason"])
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket)
        for args in (["status"], ["status", "--all"], ["show", str(done)], ["show", str(failed)], ["result", str(done)],
                     ["results", str(done), str(failed)], ["why", str(failed)], ["wait", str(done), str(failed)],
                     ["top", "--once"], ["events", str(done)]):
            with self.subTest(command=" ".join(args)):
                r = subprocess.run([os.path.join(BIN, "gpuq"), *args], capture_output=True, env=env, timeout=60)
                out = r.stdout + r.stderr
                self.assertIn(r.returncode, (0, 1), out)
                raw = [c for c in out if c < 0x20 and c not in b"\n" or c == 0x7f]
                self.assertEqual(raw, [], out)
                for seq in (b"\xc2\x9b", b"\xe2\x80\xae"):  # C1 CSI, right-to-left override, as UTF-8
                    self.assertNotIn(seq, out)
        self.assertIn("\\x1b]0;owned\\x07=v\\x1b[2J\\u009b31m\\x7f\\u202etxt", self.d.ok("show", str(done)))


class VanishedCwd(DaemonTest):
    def test_a_job_whose_cwd_vanished_fails_with_the_reason_and_runs_nowhere_else(self):
        scratch = self.tmp_path("scratch")
        os.mkdir(scratch)
        job_id = self.d.submit({"name": "rm-star", "shell": "pwd; touch CREATED_BY_JOB", "cwd": scratch},
                               "--hold")["ids"][0]
        os.rmdir(scratch)
        self.d.ok("release", str(job_id))
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "failed")
        self.assertIn(f"working directory {scratch} is gone (No such file or directory)", job["reason"])
        created = [os.path.join(root, "CREATED_BY_JOB") for root, _, files in os.walk(self.tmp)
                   if "CREATED_BY_JOB" in files]
        self.assertEqual(created, [])
        self.assertFalse(os.path.exists(os.path.join(os.getcwd(), "CREATED_BY_JOB")))

    def test_the_supervisor_refuses_a_working_directory_that_vanishes_after_gpuqd_checked_it(self):
        # The window between gpuqd's check and the rank's start, driven by hand: the supervisor
        # alone, given a launch document whose directory is gone.
        adir = self.tmp_path("attempt")
        os.mkdir(adir)
        doc = {"job_id": 1, "attempt": 1, "timeout_s": 0, "grace_s": 1, "log_limit_bytes": 0,
               "ranks": [{"rank": 0, "argv": ["/bin/sh", "-c", "touch CREATED_BY_JOB"],
                          "env": {"PATH": "/usr/bin:/bin"}, "cwd": self.tmp_path("gone"),
                          "log": os.path.join(adir, "rank-0.log")}],
               "pid_file": os.path.join(adir, "shim.pid"), "exit_file": os.path.join(adir, "exit.json")}
        with open(os.path.join(adir, "launch.json"), "w") as f:
            json.dump(doc, f)
        r = subprocess.run([os.path.join(BIN, "gpuq-shim"), os.path.join(adir, "launch.json")], cwd=self.tmp,
                           timeout=60)
        self.assertEqual(r.returncode, 1)  # recorded, and the attempt failed
        with open(os.path.join(adir, "exit.json")) as f:
            self.assertEqual(json.load(f)["ranks"][0]["exit_code"], 127)
        with open(os.path.join(adir, "rank-0.log")) as f:
            self.assertIn(f"cannot enter the job's working directory {self.tmp_path('gone')}", f.read())
        self.assertFalse(os.path.exists(self.tmp_path("CREATED_BY_JOB")))


class LaunchDocument(DaemonTest):
    @unittest.skipUnless(os.geteuid() == 0, "the check is a root supervisor's")
    def test_a_root_supervisor_runs_only_a_launch_document_root_wrote(self):
        # Started by a root gpuqd, the supervisor takes whom to run as from this file: one the
        # job's owner made, linked or pointed at is refused, and nothing of it runs.
        def attempt(name, make):
            adir = self.tmp_path(name)
            os.mkdir(adir)
            marker = os.path.join(adir, "RAN")
            doc = {"job_id": 1, "attempt": 1, "timeout_s": 0, "grace_s": 1, "log_limit_bytes": 0,
                   "ranks": [{"rank": 0, "argv": ["/bin/sh", "-c", f"touch {marker}"], "env": {"PATH": "/usr/bin:/bin"},
                              "cwd": adir, "log": os.path.join(adir, "rank-0.log")}],
                   "pid_file": os.path.join(adir, "shim.pid"), "exit_file": os.path.join(adir, "exit.json")}
            path = make(adir, json.dumps(doc))
            r = subprocess.run([os.path.join(BIN, "gpuq-shim"), path], cwd=self.tmp, timeout=60,
                               capture_output=True, text=True)
            log = os.path.join(adir, "shim.log")
            said = open(log).read() if os.path.exists(log) else ""
            return r.returncode, os.path.exists(marker), said

        def write(path, text):
            with open(path, "w") as f:
                f.write(text)
            return path

        def owned_by_nobody(adir, text):
            path = write(os.path.join(adir, "launch.json"), text)
            os.chown(path, 65534, 65534)
            return path

        def hard_linked(adir, text):
            path = write(os.path.join(adir, "root.json"), text)
            os.link(path, os.path.join(adir, "launch.json"))  # root's file, but two names: refused too
            return os.path.join(adir, "launch.json")

        def symlinked(adir, text):
            path = write(os.path.join(adir, "root.json"), text)
            os.symlink(path, os.path.join(adir, "launch.json"))
            return os.path.join(adir, "launch.json")

        code, ran, _ = attempt("roots", lambda adir, text: write(os.path.join(adir, "launch.json"), text))
        self.assertEqual((code, ran), (0, True))  # the control: root's own document runs
        for name, make, why in (("nobodys", owned_by_nobody, "is not root's own file"),
                                ("linked", hard_linked, "is not root's own file"),
                                ("symlinked", symlinked, "cannot read")):
            code, ran, said = attempt(name, make)
            self.assertNotEqual(code, 0, name)
            self.assertFalse(ran, f"{name}: the document was run")
            self.assertIn(why, said, name)


class BoundedReplies(DaemonTest):
    def test_a_result_asked_for_1000_times_comes_once(self):
        # A 7 KB request naming one job with a 1 MB result 1,000 times made a 1 GB reply.
        code = ("import json, os\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write(json.dumps({'type': 'result', 'blob': 'x' * 900000}) + '\\n')\n")
        job_id = self.d.submit(python_job(code, name="big-result"))["ids"][0]
        self.assertEqual(len(self.d.wait([job_id])[job_id]["result"]["blob"]), 900000)
        for cmd in ("results", "wait"):
            reply = self.d.request({"cmd": cmd, "ids": [job_id] * 1000})
            self.assertTrue(reply["ok"], reply)
            self.assertEqual([j["id"] for j in reply["jobs"]], [job_id])

    def test_lists_are_cut_at_the_reply_bound_and_the_cli_pages_through_all_of_them(self):
        n = 2500  # over k_max_reply_jobs (2,000)
        ids = self.d.submit([{"name": f"q{i}", "shell": "true"} for i in range(n)], "--hold")["ids"]
        status = self.d.request({"cmd": "status", "queued": -1})
        self.assertEqual(len(status["jobs"]), 2000)
        self.assertTrue(status["more"])
        self.assertEqual(status["queued_total"], n)
        self.assertEqual(len(self.d.json("status", "--all")["jobs"]), n)
        page = self.d.request({"cmd": "results", "batch": 1})
        self.assertEqual(len(page["jobs"]), 2000)
        self.assertTrue(page["more"])
        self.assertEqual([j["id"] for j in self.d.json("results", "--batch", "1")["jobs"]], ids)
        self.d.ok("cancel", "--batch", "1")
        r = self.d.run("wait", *map(str, ids), "--json")
        self.assertEqual(r.returncode, 1, r.stderr)  # cancelled is not success
        self.assertEqual([j["id"] for j in json.loads(r.stdout)["jobs"]], ids)

    def test_request_integers_out_of_range_are_refused_not_wrapped(self):
        job_id = self.d.submit({"name": "one", "shell": "true"})["ids"][0]
        self.d.wait([job_id])
        for request, field in (({"cmd": "events", "id": job_id, "attempt": 4294967297}, "attempt"),
                               ({"cmd": "events", "id": job_id, "page": 4294967297}, "page"),
                               ({"cmd": "status", "limit": 4294967296}, "limit"),
                               ({"cmd": "status", "limit": 1000000}, "limit"),
                               ({"cmd": "status", "all": True, "page": 0}, "page"),
                               ({"cmd": "status", "queued": 10 ** 9}, "queued"),
                               ({"cmd": "show", "id": 18446744073709551615}, "id"),
                               ({"cmd": "results", "ids": [18446744073709551615]}, "ids"),
                               ({"cmd": "hello", "protocol_version": 4294967297}, "protocol_version")):
            with self.subTest(request=request):
                reply = self.d.request(request)
                self.assertFalse(reply["ok"], reply)
                self.assertEqual(reply["error"]["code"], "bad_request")
                self.assertIn(f"`{field}`", reply["error"]["message"])


class RefusedAtSubmit(DaemonTest):
    def test_a_command_and_environment_past_exec_s_limit_is_refused_at_submit(self):
        # Under `ulimit -s 1024` exec takes 256 KiB of arguments and environment; each variable
        # here is under the 128 KiB a single one may have, all of them are not.
        self.d.stop()
        self.d.start(stack_kb=1024)
        env = {f"V{i}": "x" * 100000 for i in range(3)}
        r = self.d.run("submit", "-", input=json.dumps({"name": "fat-env", "shell": "true", "env": env}))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("exec takes at most 256 KiB in all", r.stderr)
        self.assertEqual(self.d.json("status", "--all")["jobs"], [])

    def test_dry_run_refuses_what_submit_refuses_and_a_large_batch_prints_one_short_line(self):
        # A matrix makes a 3.8 MiB command from a 100 KB spec: past exec's limit. --dry-run once passed it.
        big = {"name": "big-{i}", "command": ["echo"] + ["{x}"] * 39, "matrix": {"x": ["a" * 100000], "i": [1]}}
        dry = self.d.run("submit", "--dry-run", "-", input=json.dumps(big))
        real = self.d.run("submit", "-", input=json.dumps(big))
        self.assertEqual((dry.returncode, real.returncode), (4, 4), (dry.stderr, real.stderr))
        for r in (dry, real):
            self.assertIn("job[0] (big-1): its command and environment come to", r.stderr)
        # A request over gpuqd's 1 MiB: said by the dry run as by gpuqd, not passed
        wide = [{"name": f"w{i}", "command": ["echo", "a" * 1000]} for i in range(1100)]
        dry = self.d.run("submit", "--dry-run", "-", input=json.dumps(wide))
        real = self.d.run("submit", "-", input=json.dumps(wide))
        self.assertEqual((dry.returncode, real.returncode), (4, 4), (dry.stderr, real.stderr))
        self.assertIn("gpuqd takes at most 1048576", dry.stderr)
        self.assertIn("longer than 1048576 bytes", real.stderr)
        # on_finish past its argument limit names the limit
        r = self.d.run("submit", "--dry-run", "-", input=json.dumps({"command": ["true"], "on_finish": ["x"] * 5000}))
        self.assertEqual(r.returncode, 4)
        self.assertIn("field `on_finish` has 5000 arguments; at most 4096", r.stderr)
        self.assertEqual(self.d.json("status", "--all")["jobs"], [])
        # 3,000 ids as a range, not 3,000 numbers
        r = self.d.run("submit", "--hold", "-", input=json.dumps({"name": "s-{i}", "command": ["true"],
                                                                   "matrix": {"i": list(range(3000))}}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^submitted batch \d+: jobs 1-3000, held")
        self.assertLess(len(r.stdout), 200)

    def test_a_nul_byte_in_a_command_or_after_a_request_is_refused(self):
        r = self.d.run("submit", "-", input=json.dumps({"command": ["echo", "safe\0; touch PWNED"]}))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("field `command[1]` contains a NUL byte", r.stderr)
        reply = self.d.request(b'{"cmd": "hello", "protocol_version": 1}\0junk\n')
        self.assertFalse(reply["ok"])
        self.assertIn("NUL byte", reply["error"]["message"])
        reply = self.d.request({"cmd": "status", "name": "a\0*"})
        self.assertFalse(reply["ok"])
        self.assertIn("`name`", reply["error"]["message"])


def read_all(fd, out):
    """Appends what a pseudo-terminal's other side writes to `out` until it closes."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            return
        if not chunk:
            return
        out.append(chunk.decode(errors="replace"))


class ClientsOutliveRestarts(DaemonTest):
    """`systemctl restart gpuqd` (or a crash and its restart) under someone's scripted wait."""

    def blocked_job(self, first="", second=""):
        release, started = self.tmp_path("release"), self.tmp_path("started")
        job_id = self.d.submit({"name": "slow", "shell": f"touch {started}; echo {first or 'started'}; "
                                f"while [ ! -e {release} ]; do sleep 0.05; done; echo {second or 'done'}"})["ids"][0]
        # Its command runs (recorded running, its supervisor may not have announced itself yet).
        wait_until(lambda: os.path.exists(started), what="the job to run")
        return job_id, release

    def restart_daemon(self, release):
        self.d.kill9()
        self.d.start()
        open(release, "w").close()

    def client(self, *args, reconnect_s=None):
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket)
        if reconnect_s is not None:
            env["GPUQ_RECONNECT_S"] = str(reconnect_s)
        return subprocess.Popen([os.path.join(BIN, "gpuq"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)

    def test_wait_reconnects_and_exits_with_the_job_s_outcome(self):
        job_id, release = self.blocked_job()
        p = self.client("wait", str(job_id))
        self.assertIn("running", p.stdout.readline())  # connected: it has seen the job run
        self.restart_daemon(release)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertIn("succeeded", out)

    def test_wait_json_reconnects_and_exits_with_the_job_s_outcome(self):
        # Whether the wait has connected when gpuqd dies or connects only to its stale socket,
        # it waits the outage out (the human wait and logs -f below lose a live connection).
        job_id, release = self.blocked_job()
        p = self.client("wait", "--json", str(job_id))
        self.restart_daemon(release)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertEqual([j["state"] for j in json.loads(out)["jobs"]], ["succeeded"])

    def test_a_wait_started_while_gpuqd_is_down_waits_for_it_to_come_back(self):
        job_id, release = self.blocked_job()
        self.d.kill9()  # its socket stays, unanswered
        p = self.client("wait", "--json", str(job_id))
        self.d.start()
        open(release, "w").close()
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertEqual([j["state"] for j in json.loads(out)["jobs"]], ["succeeded"])
        # No socket at all is no daemon: said at once, not waited for.
        self.d.stop()
        r = self.d.run("wait", str(job_id), timeout=10)
        self.assertEqual(r.returncode, 3)
        self.assertIn("gpuqd is not running", r.stderr)

    def test_logs_follow_reconnects_and_prints_what_follows(self):
        job_id, release = self.blocked_job("first-line", "second-line")
        p = self.client("logs", "-f", str(job_id))
        self.assertEqual(p.stdout.readline().strip(), "first-line")
        self.restart_daemon(release)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertEqual(out.split(), ["second-line"])

    def test_on_a_terminal_it_says_it_lost_gpuqd_and_reconnected(self):
        job_id, release = self.blocked_job("first-line", "second-line")
        leader, follower = pty.openpty()
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket)
        p = subprocess.Popen([os.path.join(BIN, "gpuq"), "logs", "-f", str(job_id)], stdin=follower, stdout=follower,
                             stderr=follower, env=env)
        os.close(follower)
        out = []
        reader = threading.Thread(target=lambda: read_all(leader, out))
        reader.start()
        try:
            wait_until(lambda: "first-line" in "".join(out), what="the first line")
            self.restart_daemon(release)
            self.assertEqual(p.wait(timeout=120), 0)
        finally:
            reader.join(timeout=30)
            os.close(leader)
        text = "".join(out)
        self.assertIn("gpuq: lost gpuqd (", text)
        self.assertIn("reconnecting for up to 60 s", text)
        self.assertIn("gpuq: reconnected", text)
        self.assertIn("second-line", text)

    def test_a_wait_on_a_daemon_that_never_comes_back_still_fails_and_says_so(self):
        job_id, _ = self.blocked_job()
        p = self.client("wait", "--json", str(job_id), reconnect_s=2)
        self.d.kill9()  # and no restart: it gives up after its reconnect window
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 3, out + err)
        self.assertIn("gpuqd is not running", err)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class LongRequestsInParts(DaemonTest):
    """A submit's jobs are written into the store, and a clean's jobs cleaned, a part per turn of
    gpuqd's loop, so 100,000 jobs hold no other client up for more than a part's time. The test
    hook GPUQ_TEST_PAUSE_PARTS makes parts of 64 jobs and stops such a request after its first
    part while its file exists: the test looks at gpuqd there, then lets it go on."""

    def setUp(self):
        super().setUp()
        self.d.stop()
        self.pause = os.path.join(self.tmp, "pause")
        open(self.pause, "w").close()
        self.d.env = dict(os.environ, GPUQ_TEST_PAUSE_PARTS=self.pause)
        self.d.start()

    def start_submit(self, jobs, *extra):
        spec = os.path.join(self.tmp, "sweep.json")
        with open(spec, "w") as f:
            json.dump(jobs, f)
        return self.start("submit", spec, *extra)

    def start(self, *args):
        """gpuq ARGS --json, left running once gpuqd has paused after the request's first part."""
        proc = subprocess.Popen([os.path.join(BIN, "gpuq"), *args, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, GPUQ_SOCKET=self.d.socket), cwd=self.tmp)
        wait_until(lambda: os.path.exists(self.pause + ".reached") or proc.poll() is not None,
                   what="gpuqd to pause after the request's first part")
        self.assertIsNone(proc.poll(), proc.poll() is not None and proc.stderr.read())
        return proc

    def sweep(self, n, command=("true",)):
        return {"name": "sweep-{i}", "command": list(command), "matrix": {"i": list(range(n))}}

    def test_others_are_answered_mid_submit_and_never_see_the_batch_half_written(self):
        before = self.d.submit({"name": "before", "command": ["true"]}, "--hold")["ids"][0]
        proc = self.start_submit(self.sweep(200), "--hold")
        # gpuqd's thread is free: other clients are answered while the batch is half written ...
        self.assertEqual(self.d.request({"cmd": "hello", "protocol_version": 1})["ok"], True)
        status = self.d.json("status")
        self.assertEqual([j["id"] for j in status["jobs"]], [before])
        self.assertEqual((status["total"], status["queued_total"]), (1, 1))
        # ... and none of them sees a job of it: not by id, not by batch, not in a dependency.
        r = self.d.run("show", str(before + 1))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"no job {before + 1}", r.stderr)
        r = self.d.run("submit", "-", input=json.dumps({"command": ["true"], "after": [before + 1]}))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"`after` names job {before + 1}, which does not exist", r.stderr)
        os.unlink(self.pause)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        ids = json.loads(out)["ids"]
        self.assertEqual(ids, list(range(before + 1, before + 201)))
        status = self.d.json("status")
        self.assertEqual((status["total"], status["queued_total"]), (201, 201))
        self.assertEqual(self.d.show(ids[-1])["job"]["state"], "queued")

    def test_a_batch_half_written_when_gpuqd_is_killed_is_gone_at_restart(self):
        proc = self.start_submit(self.sweep(300))
        self.d.kill9()
        out, err = proc.communicate(timeout=60)
        self.assertNotEqual(proc.returncode, 0)  # never acknowledged ...
        os.unlink(self.pause)
        self.d.start()
        status = self.d.json("status", "--all")
        self.assertEqual(status["jobs"], [])  # ... and nothing of it is left
        self.assertEqual(self.d.run("show", "1").returncode, 4)
        ids = self.d.submit(self.sweep(100), "--hold")["ids"]
        self.assertEqual(ids, list(range(1, 101)))  # its ids were never handed out

    def test_a_clean_goes_in_parts_others_are_answered_and_a_job_restarted_meanwhile_is_kept(self):
        os.unlink(self.pause)
        submitted = self.d.submit(self.sweep(200, ["sleep", "600"]), "--hold")
        ids = submitted["ids"]
        self.d.ok("cancel", "--batch", str(submitted["batch"]))
        open(self.pause, "w").close()
        proc = self.start("clean", "--forget", "--batch", str(submitted["batch"]))
        self.assertEqual(self.d.request({"cmd": "hello", "protocol_version": 1})["ok"], True)
        self.assertIn(f"job {ids[0]} was forgotten", self.d.run("show", str(ids[0])).stderr)
        self.d.ok("restart", str(ids[-1]))  # not reached by the clean yet: it runs, no longer ended
        os.unlink(self.pause)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(json.loads(out)["forgotten"], ids[:-1])
        self.assertEqual(self.d.show(ids[-1])["job"]["id"], ids[-1])
        self.assertEqual(self.d.json("status", "--all")["jobs"][0]["id"], ids[-1])


    def failed_chain(self, n):
        """A chain of n jobs, each after the one before, submitted last link first (so each waits
        for a job with a higher id), that failed at its head. The head, when run again, waits for
        the file `go` and then succeeds if `ok` exists. Returns the ids from the head on."""
        go, ok = self.tmp_path("go"), self.tmp_path("ok")
        chain = [{"name": "c0", "shell": f"while [ ! -e {go} ]; do sleep 0.05; done; [ -e {ok} ]"}] + \
                [{"name": f"c{i}", "command": ["true"], "after": [f"c{i - 1}"]} for i in range(1, n)]
        ids = self.d.submit(chain[::-1])["ids"][::-1]
        open(go, "w").close()
        wait_until(lambda: self.d.show(ids[-1])["job"]["state"] == "failed", what="the chain to fail")
        os.unlink(go)
        return ids

    def let_the_chain_succeed(self, ids):
        open(self.tmp_path("ok"), "w").close()
        open(self.tmp_path("go"), "w").close()
        jobs = self.d.wait(ids, timeout=120)
        self.assertEqual({j["state"] for j in jobs.values()}, {"succeeded"})
        for i in ids:  # each queued again exactly once
            history = self.d.request({"cmd": "show", "id": i})["history"]
            self.assertEqual(len([t for t in history if t["reason"].startswith("restarted")]), 1, history)

    def states(self):
        return {j["id"]: j["state"] for j in self.d.json("status", "--all")["jobs"]}

    def states_of(self, ids):
        """The set of states of these jobs, from one `gpuq status` (not one per job)."""
        states = self.states()
        return {states[i] for i in ids}

    def test_a_restart_requeues_dependencies_first_a_part_at_a_time_and_holds_its_jobs_meanwhile(self):
        os.unlink(self.pause)
        ids = self.failed_chain(150)
        open(self.pause, "w").close()
        proc = self.start("restart", str(ids[0]))
        self.assertEqual(self.d.request({"cmd": "hello", "protocol_version": 1})["ok"], True)
        # The first part: the head and the 63 links nearest it (the highest ids), each after the
        # one it waits for, so no job is queued behind one still failed. The rest are as they were.
        states = self.states()
        self.assertIn(states[ids[0]], ("queued", "running"))
        self.assertEqual({states[i] for i in ids[1:64]}, {"queued"})
        self.assertEqual({states[i] for i in ids[64:]}, {"failed"})
        # Those not yet requeued are the restart's: no other restart or clean takes them.
        r = self.d.run("restart", str(ids[100]))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"job {ids[100]} (c100) is being restarted by another request under way", r.stderr)
        r = self.d.run("clean", "--forget", str(ids[100]))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("a restart under way is queueing it again", r.stderr)
        os.unlink(self.pause)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        reply = json.loads(out)
        self.assertEqual((reply["total"], reply["was"], reply["along"], reply["more"]), (150, {"failed": 150}, 149, False))
        self.assertEqual([j["id"] for j in reply["jobs"]], sorted(ids))
        self.let_the_chain_succeed(ids)

    def test_a_restart_cut_short_by_gpuqd_s_death_is_finished_at_its_next_start(self):
        os.unlink(self.pause)
        ids = self.failed_chain(150)
        open(self.pause, "w").close()
        proc = self.start("restart", str(ids[0]))
        self.d.kill9()
        proc.communicate(timeout=60)
        os.unlink(self.pause)
        self.d.start()
        wait_until(lambda: "failed" not in self.states_of(ids), what="the restart to be finished")
        with open(os.path.join(self.tmp, "gpuqd.log"), errors="replace") as f:
            self.assertIn("finishing a restart of 150 job(s) that stopped after 64 of them", f.read())
        self.let_the_chain_succeed(ids)

    def test_a_restart_part_that_cannot_be_stored_is_tried_again_and_the_reply_waits_for_it(self):
        full = self.tmp_path("disk-full")
        self.d.stop()
        self.d.env = dict(self.d.env, GPUQ_TEST_STORE_FAULTS="file:" + full)
        os.unlink(self.pause)
        self.d.start()
        ids = self.failed_chain(150)
        open(self.pause, "w").close()
        proc = self.start("restart", str(ids[0]))
        open(full, "w").close()
        os.unlink(self.pause)
        def logged():
            with open(os.path.join(self.tmp, "gpuqd.log"), errors="replace") as f:
                return f.read()

        wait_until(lambda: "could not requeue its jobs after the first 64 of 150" in logged(), what="the second part to fail")
        self.assertIsNone(proc.poll())  # no answer yet: the restart is not done
        self.assertEqual(self.states_of(ids[64:]), {"failed"})
        os.unlink(full)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(json.loads(out)["total"], 150)
        self.let_the_chain_succeed(ids)

class OutOfDescriptors(DaemonTest):
    def test_out_of_file_descriptors_accepting_pauses_instead_of_spinning_and_then_recovers(self):
        self.d.stop()
        self.d.start(nofile=64)
        log = os.path.join(self.tmp, "gpuqd.log")
        held = []
        try:
            for _ in range(100):  # more than gpuqd can hold open: the rest wait in the backlog
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.d.socket)
                held.append(s)
            wait_until(lambda: "cannot accept connections" in open(log).read(), what="gpuqd to run out of fds")
            # A measurement over one second: a spinning accept loop burns most of it.
            before = cpu_seconds(self.d.proc.pid)
            time.sleep(1.0)
            self.assertLess(cpu_seconds(self.d.proc.pid) - before, 0.5)
        finally:
            for s in held:
                s.close()
        self.assertEqual(self.d.request({"cmd": "hello", "protocol_version": 1})["ok"], True)
        wait_until(lambda: "accepting connections again" in open(log).read(), what="the recovery to be logged")

    def test_gpuqd_raises_its_soft_limit_and_jobs_get_the_one_it_was_started_with(self):
        self.d.stop()
        self.d.start(nofile=(64, 4096))
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            self.assertIn("descriptor limit raised from 64 to 4096 (jobs get 64)", f.read())
        job = self.d.submit({"name": "limits", "shell": 'echo "{\\"type\\":\\"result\\",\\"soft\\":$(ulimit -Sn),'
                                                        '\\"hard\\":$(ulimit -Hn)}" >> "$GPUQ_EVENTS"'})["ids"][0]
        got = self.d.wait([job])[job]
        self.assertEqual(got["state"], "succeeded", got)
        self.assertEqual(got["result"], {"soft": 64, "hard": 4096})

    def test_jobs_wait_for_descriptors_instead_of_failing(self):
        # ulimit -n 64 and 60 jobs once failed 13 of them ("dup2() failed: Bad file descriptor").
        self.d.stop()
        self.d.extra = ["--cpu-slots", "100"]
        self.d.start(nofile=64)
        release = self.tmp_path("release")
        ids = self.d.submit([{"name": f"j{i}", "shell": f'while [ ! -e "{release}" ]; do sleep 0.05; done'}
                             for i in range(60)])["ids"]

        seen = {}

        def looked():
            jobs = self.d.json("status", "--all")["jobs"]
            seen["short"] = [j for j in jobs if j["state"] == "queued" and "short of file descriptors" in j["reason"]]
            seen["failed"] = [(j["id"], j["reason"]) for j in jobs if j["state"] == "failed"]
            return seen["short"] or seen["failed"]
        wait_until(looked, timeout=60, what="a job to wait for descriptors")
        self.assertEqual(seen["failed"], [])
        self.assertIn("raise its limit", seen["short"][0]["reason"])
        open(release, "w").close()
        ended = self.d.wait(ids, timeout=300)
        self.assertEqual({j["state"] for j in ended.values()}, {"succeeded"},
                         [(i, j["reason"]) for i, j in ended.items() if j["state"] != "succeeded"])
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            log = f.read()
        # Said when a shortage starts and when it ends, not at every pass in between.
        shortages, ends = log.count("is short of file descriptors"), log.count("file descriptors free again")
        self.assertGreaterEqual(shortages, 1, log)
        self.assertIn(ends, (shortages, shortages - 1), log)
        self.assertGreater(log.rfind("file descriptors free again"), log.rfind("is short of file descriptors"), log)



class FakeDaemon:
    """A unix socket that answers hello as gpuqd would, then each request with `answer(request)`:
    bytes to send (None: send nothing and keep the connection open)."""

    def __init__(self, path, answer):
        self.path, self.answer, self.requests = path, answer, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.open = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.open.append(conn)
            threading.Thread(target=self.talk, args=(conn,), daemon=True).start()

    def talk(self, conn):
        buf = b""
        try:
            while True:
                while b"\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                self.requests.append(req)
                if req.get("cmd") == "hello":
                    conn.sendall(json.dumps({"ok": True, "protocol_version": 1, "daemon_version": "fake",
                                             "pid": os.getpid(), "state_dir": "/nonexistent"}).encode() + b"\n")
                    continue
                reply = self.answer(req)
                if reply is not None:
                    conn.sendall(reply)
        except OSError:
            return

    def close(self):
        self.sock.close()
        for c in self.open:
            c.close()


class HostileDaemon(unittest.TestCase):
    """gpuq against a daemon that is broken, hostile or of another version: a clear error and an
    exit code, never an abort, a hang or memory without bound."""

    def setUp(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="gpuq-fake-")
        self.socket = os.path.join(self.dir, "fake.sock")

    def tearDown(self):
        import shutil
        if hasattr(self, "fake"):
            self.fake.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def serve(self, answer):
        self.fake = FakeDaemon(self.socket, answer)

    def gpuq(self, *args, timeout=60, **env):
        e = dict(os.environ, GPUQ_CONFIG=os.path.join(self.dir, "none.json"), **env)
        e.pop("GPUQ_SOCKET", None)
        return subprocess.run([os.path.join(BIN, "gpuq"), "--socket", self.socket, *args],
                              capture_output=True, text=True, timeout=timeout, env=e)

    def test_replies_of_the_wrong_types_name_the_field_and_exit_4(self):
        replies = {
            "status": {"ok": True, "jobs": {"a": 1}},
            "wait": {"ok": True, "jobs": [{"id": 1, "state": "running", "name": ["not", "a", "string"]}]},
            "show": {"ok": True, "job": {"id": "seven"}},
        }
        self.serve(lambda req: json.dumps(replies.get(req["cmd"], {"ok": True})).encode() + b"\n")
        for args, field in ((["status"], "`jobs`"), (["wait", "1", "--json"], "`jobs[0].name`"),
                            (["show", "1"], "`job.id`"), (["status", "--json"], "`jobs`")):
            r = self.gpuq(*args)
            self.assertEqual(r.returncode, 4, (args, r.returncode, r.stderr))
            self.assertIn("gpuqd's reply is not one this gpuq", r.stderr)
            self.assertIn(field, r.stderr, args)

    def test_a_daemon_that_never_answers_times_out_with_exit_3(self):
        self.serve(lambda req: None)
        for args in (["status"], ["cancel", "1"]):
            t0 = time.monotonic()
            r = self.gpuq(*args, GPUQ_REPLY_TIMEOUT_S="1")
            self.assertEqual(r.returncode, 3, (args, r.stderr))
            self.assertIn("sent no reply within 1 s", r.stderr)
            self.assertLess(time.monotonic() - t0, 30)
        # the same for the hello exchange: a socket that accepts and never speaks
        self.fake.close()
        os.unlink(self.socket)
        mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mute.bind(self.socket)
        mute.listen(8)
        try:
            r = self.gpuq("status", GPUQ_REPLY_TIMEOUT_S="1")
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn("sent no reply within 1 s", r.stderr)
        finally:
            mute.close()

    def test_a_reply_line_without_end_is_read_to_a_bound_and_refused(self):
        sent = []

        # Send the flood from the fake's own thread, then keep the connection open.
        class Flood(FakeDaemon):
            def talk(inner, conn):
                buf = b""
                while b"\n" not in buf:
                    buf += conn.recv(65536)
                line, buf = buf.split(b"\n", 1)
                conn.sendall(json.dumps({"ok": True, "protocol_version": 1, "daemon_version": "fake",
                                         "pid": 1, "state_dir": "/x"}).encode() + b"\n")
                while b"\n" not in buf:
                    buf += conn.recv(65536)
                try:
                    for _ in range(200):
                        conn.sendall(b"x" * (1 << 20))
                        sent.append(1)
                except OSError:
                    pass
        self.fake = Flood(self.socket, lambda req: None)
        r = self.gpuq("status", "--json")
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("longer than 80 MiB without ending its line", r.stderr)
        self.assertLess(len(sent), 200)  # gpuq stopped reading: the rest was never taken


if __name__ == "__main__":
    unittest.main()
