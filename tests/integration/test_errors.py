"""Bad input gets a clear error that names the problem, loses nothing, and never takes the daemon
down."""
import json
import os
import resource
import select
import socket
import subprocess
import time
import unittest

from harness import BIN, Daemon, DaemonTest, wait_until
from loadgen import assert_rss_grew_less, rss_kib


class SpecErrors(DaemonTest):
    def submit_error(self, spec_text):
        r = self.d.run("submit", "-", input=spec_text)
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        return r.stderr

    def test_spec_errors_name_the_field_and_nothing_is_queued(self):
        self.assertIn("unknown field `gpu` (did you mean `gpus`?)", self.submit_error('{"command":["true"],"gpu":2}'))
        self.assertIn("field `gpus` must be between 0 and 1024, got -1",
                      self.submit_error('{"command":["true"],"gpus":-1}'))
        self.assertIn("dependency cycle", self.submit_error(
            '[{"name":"a","command":["true"],"after":["b"]},{"name":"b","command":["true"],"after":["a"]}]'))
        self.assertEqual(self.d.json("status")["total"], 0)

    def test_machine_checks_more_gpus_than_exist_missing_program_unknown_dependency(self):
        self.assertIn("asks for 8 GPUs; this machine has 4", self.submit_error('{"command":["true"],"gpus":8}'))
        self.assertIn("command `no-such-program-here` is not an executable file in PATH",
                      self.submit_error('{"command":["no-such-program-here"]}'))
        self.assertIn("`after` names job 999, which does not exist",
                      self.submit_error('{"command":["true"],"after":[999]}'))
        self.assertIn("cwd /nonexistent-dir cannot be the job's working directory (No such file or directory)",
                      self.submit_error('{"command":["true"],"cwd":"/nonexistent-dir"}'))

    def test_a_batch_with_problems_of_every_kind_names_them_all_in_one_answer(self):
        # A spec's own (a field's type), the machine's (GPUs, a program, a directory, RE2's word
        # on a pattern) and the queue's (`after` a job that is not there): one submit, all of them.
        err = self.submit_error(json.dumps([
            {"name": "typo", "command": ["true"], "retries": "two", "gpus": 9},
            {"name": "big", "command": ["true"], "gpus": 8},
            {"name": "nowhere", "command": ["no-such-program-here"], "cwd": "/nonexistent-dir"},
            {"name": "pattern", "command": ["true"], "report": {"result": ["(?P<x>1"]}},
            {"name": "orphan", "command": ["true"], "after": [999]}]))
        self.assertIn("invalid job spec (6 problems):", err)
        for said in ["job[0] (typo): field `retries` must be", "job[0] (typo): asks for 9 GPUs; this machine has 4",
                     "job[1] (big): asks for 8 GPUs; this machine has 4",
                     "job[2] (nowhere): cwd /nonexistent-dir cannot be the job's working directory",
                     "job[3] (pattern): `report.result[0]` is not a pattern gpuq can use",
                     "job[4] (orphan): `after` names job 999, which does not exist"]:
            self.assertIn(said, err)
        # Where the directory is not there, whether the program is is not asked; a job whose spec
        # has problems of its own is not looked for on disk.
        self.assertNotIn("not an executable file", err)
        self.assertEqual(self.d.json("status")["total"], 0)

    def test_a_batch_is_rejected_whole(self):
        err = self.submit_error('[{"name":"good","command":["true"]},{"name":"bad","command":["true"],"gpus":99}]')
        self.assertIn("job[1] (bad)", err)
        self.assertEqual(self.d.json("status")["total"], 0)

    def test_a_file_that_is_not_json_is_reported_by_the_cli(self):
        path = self.tmp_path("broken.json")
        with open(path, "w") as f:
            f.write('{"command": ["true"],,}')
        r = self.d.run("submit", path)
        self.assertEqual(r.returncode, 2)
        self.assertIn("broken.json is not valid JSON", r.stderr)
        self.assertIn("line 1", r.stderr)

    def test_unknown_job_ids(self):
        for cmd in (["show", "424242"], ["cancel", "424242"], ["wait", "424242"], ["result", "424242"],
                    ["logs", "424242"]):
            r = self.d.run(*cmd)
            self.assertEqual(r.returncode, 4, cmd)
            self.assertIn("no job 424242", r.stderr)


class LaunchErrors(DaemonTest):
    def test_a_program_that_cannot_be_executed_fails_with_127_and_says_why(self):
        bad = self.tmp_path("not-a-program")
        with open(bad, "wb") as f:
            f.write(b"\x01\x02 garbage")
        os.chmod(bad, 0o755)
        job_id = self.d.submit({"name": "badexec", "command": [bad]})["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "failed")
        self.assertEqual(job["exit_code"], 127)
        self.assertIn("Exec format error", self.d.ok("logs", str(job_id)))


    def test_the_longest_environment_value_exec_takes_runs_and_one_byte_more_is_refused_at_submit(self):
        # "V=" + value + NUL is at most 128 KiB (the kernel's MAX_ARG_STRLEN).
        longest = "x" * (128 * 1024 - 3)
        shell = 'printf "%s" "${#V}" > ' + self.tmp_path("length")
        job_id = self.d.submit({"name": "long-env", "shell": shell, "env": {"V": longest}})["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        with open(self.tmp_path("length")) as f:
            self.assertEqual(f.read(), str(len(longest)))
        r = self.d.run("submit", "-", input=json.dumps({"name": "too-long", "shell": shell, "env": {"V": longest + "x"}}))
        self.assertEqual(r.returncode, 4)
        self.assertIn("field `env.V` is 131070 bytes; exec takes at most 128 KiB in one environment variable", r.stderr)
        self.assertEqual(len(self.d.json("status", "--all")["jobs"]), 1)


    def test_a_launch_that_fails_is_tried_again_on_a_timer_once_the_cause_is_gone(self):
        go = self.tmp_path("go")
        blocker = self.d.submit({"name": "blocker", "shell": f"while [ ! -e {go} ]; do sleep 0.05; done"})["ids"][0]
        job_id = self.d.submit({"name": "later", "command": ["true"], "after": [blocker]})["ids"][0]
        # A file where the job's directory must go: its launch fails.
        obstacle = os.path.join(self.d.state, "jobs", str(job_id))
        with open(obstacle, "w") as f:
            f.write("in the way\n")
        open(go, "w").close()
        wait_until(lambda: self.d.show(job_id)["job"]["reason"].startswith("cannot start: "), what="the failed launch")
        job = self.d.show(job_id)["job"]
        self.assertEqual(job["state"], "queued")
        self.assertIn("trying again every 5 s", job["reason"])
        # Nothing else happens in gpuqd from here: the retry timer alone starts the job.
        os.remove(obstacle)
        done = self.d.wait([job_id], timeout=30)[job_id]
        self.assertEqual(done["state"], "succeeded")
        self.assertEqual(done["attempt"], 1)


class NoGpus(DaemonTest):
    GPUS = "none"

    def test_zero_gpus_is_a_valid_machine_for_cpu_jobs(self):
        job_id = self.d.submit({"name": "cpu", "shell": 'test -z "$CUDA_VISIBLE_DEVICES"'})["ids"][0]
        self.assertEqual(self.d.wait([job_id])[job_id]["state"], "succeeded")
        r = self.d.run("submit", "-", input='{"command": ["true"], "gpus": 1}')
        self.assertEqual(r.returncode, 4)
        self.assertIn("asks for 1 GPUs; this machine has 0", r.stderr)


class ProtocolAbuse(DaemonTest):
    def restart_with_idle_timeout(self, seconds):
        self.d.stop()
        self.d = Daemon(self.tmp, extra=["--idle-timeout", str(seconds)]).start()

    def test_malformed_requests_get_error_replies_and_the_daemon_lives(self):
        cases = [
            (b"this is not json\n", "bad_request"),
            (b"[1,2,3]\n", "bad_request"),
            (b'{"cmd": 7}\n', "bad_request"),
            (b'{"cmd": "explode"}\n', "unknown_command"),
            (b'{"cmd": "show", "id": "x"}\n', "bad_request"),
            (b'{"cmd": "hello", "protocol_version": 99}\n', "version_mismatch"),
            (b'{"cmd": "submit", "jobs": {"command": ["true"]}}\n', "bad_request"),  # no cwd
            (b'{"cmd": "status", "limit": -1}\n', "bad_request"),
            (b'{"cmd": "show", "id": 1}\xff\xfe\n', "bad_request"),  # invalid UTF-8
            (b"[" * 10000 + b"\n", "bad_request"),  # deep nesting
        ]
        for data, code in cases:
            reply = self.d.request(data)
            self.assertFalse(reply["ok"], data[:40])
            self.assertEqual(reply["error"]["code"], code, data[:40])
            self.assertTrue(reply["error"]["message"])
        self.assertEqual(self.d.request({"cmd": "status"})["ok"], True)

    def test_an_oversized_line_is_refused_without_killing_the_daemon(self):
        reply = self.d.request(b'{"cmd":"status","pad":"' + b"x" * (2 << 20) + b'"}\n')
        self.assertEqual(reply["error"]["code"], "too_large")
        self.d.ok("status")

    def test_a_silent_client_does_not_block_others_and_is_dropped_after_the_idle_timeout(self):
        self.restart_with_idle_timeout(1)
        with socket.socket(socket.AF_UNIX) as idle:
            idle.connect(self.d.socket)
            idle.sendall(b'{"cmd": "sta')  # half a request, then nothing
            self.d.ok("status")
            self.d.ok("gpus")
            # Dropped: the read ends (end of file), rather than running into the test's own 60 s.
            idle.settimeout(60)
            self.assertEqual(idle.recv(1), b"")

    def test_lines_that_are_not_requests_do_not_keep_a_connection_open(self):
        self.restart_with_idle_timeout(1)
        # A line every 0.2 s, each refused (not JSON, an unknown command, too long): the idle
        # limit counts from the last request answered, here the connection's start, so gpuqd
        # closes it after 1 s. Each line used to start the idle timeout again: it stayed open.
        junk = [b"x\n", b'{"cmd": "keepalive"}\n', b"{" * 100 + b"\n", b"y" * (1 << 20) + b"z\n"]
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.d.socket)
            s.settimeout(0.2)
            deadline = time.monotonic() + 60
            closed = False
            sent = 0
            while not closed and time.monotonic() < deadline:
                try:
                    s.sendall(junk[sent % len(junk)])
                    sent += 1
                    while True:  # its refusals, until gpuqd has nothing more to say for now
                        chunk = s.recv(65536)
                        if not chunk:
                            closed = True
                            break
                except socket.timeout:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
            self.assertTrue(closed, f"gpuqd kept a connection open past its idle limit for {sent} lines that were "
                                    "not requests")
            self.assertGreater(sent, 1)
        self.d.ok("status")

    def test_a_line_too_long_left_unended_is_still_closed_at_the_idle_limit(self):
        self.restart_with_idle_timeout(1)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.d.socket)
            s.settimeout(60)
            s.sendall(b"x" * ((1 << 20) + 10))  # past the request bound, and never ended
            f = s.makefile("rb")
            self.assertEqual(json.loads(f.readline())["error"]["code"], "too_large")
            # gpuqd skips the rest of the line; the idle limit runs on (the refusal's writing
            # stopped it: the connection was held for ever).
            self.assertEqual(f.read(), b"")

    def test_a_hang_up_on_a_held_wait_with_lines_behind_it_harms_nothing(self):
        job = self.d.submit({"name": "held", "command": ["true"]}, "--hold")["ids"][0]
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.d.socket)
            # A wait answered in 1 s, then 60,000 empty lines, read in as the wait is held; the
            # client hangs up. Answering the wait, gpuqd went on to read those lines from a closed
            # connection, each refusal reading the next one: 60,000 calls deep, and it crashed.
            s.sendall(json.dumps({"cmd": "wait", "ids": [job], "timeout_s": 1}).encode() + b"\n" * 60001)
        # A wait of 2 s asked after it is answered after it.
        reply = self.d.request({"cmd": "wait", "ids": [job], "timeout_s": 2})
        self.assertTrue(reply["ok"] and reply["timed_out"], reply)
        self.assertIsNone(self.d.proc.poll())
        self.d.ok("status")

    def test_connections_waiting_past_one_turns_accepts_are_all_served(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
        # 300 clients connect and ask while gpuqd is stopped: all wait in the backlog at once, more
        # than it takes in one turn (256). The rest are taken in the next turn, not when another
        # client happens to connect (the reactor is edge-triggered: a wait begun with connections
        # still waiting waits for a new one).
        conns = []
        with self.d.paused():
            for _ in range(300):
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.d.socket)
                s.sendall(b'{"cmd": "hello", "protocol_version": 1}\n')
                conns.append(s)
        try:
            for s in conns:
                s.settimeout(60)
                self.assertTrue(json.loads(s.makefile("rb").readline())["ok"])
        finally:
            for s in conns:
                s.close()

    def test_a_client_that_asks_and_hangs_up_while_gpuqd_is_busy_leaves_no_wait_behind(self):
        job = self.d.submit({"name": "held", "command": ["true"]}, "--hold")["ids"][0]
        # Its request and its hang-up come together, before gpuqd looks: the hang-up is seen when
        # the wait is held, not waited for (an edge that came already).
        with self.d.paused(), socket.socket(socket.AF_UNIX) as s:
            s.connect(self.d.socket)
            s.sendall(json.dumps({"cmd": "wait", "ids": [job]}).encode() + b"\n")
        wait_until(lambda: self.d.json("gpus")["connections_open"] == 1, what="the client's connection to go")
        self.assertEqual(self.d.json("gpus")["waits_held"], 0)

    def test_idle_connections_hold_no_read_buffer(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
        self.d.ok("status")
        before = rss_kib(self.d.proc.pid)
        conns = []
        try:
            for _ in range(1500):  # each says hello, is answered, and waits for its next request
                s = socket.socket(socket.AF_UNIX)
                s.connect(self.d.socket)
                s.sendall(b'{"cmd": "hello", "protocol_version": 1}\n')
                conns.append(s)
            for s in conns:
                s.settimeout(60)
                self.assertTrue(json.loads(s.makefile("rb").readline())["ok"])
            # A few KiB each; a buffer of 64 KiB each would be 94 MiB.
            assert_rss_grew_less(self, self.d.proc.pid, before, 24 * 1024)
        finally:
            for s in conns:
                s.close()

    def test_a_client_that_sends_and_never_reads_is_held_back_and_dropped(self):
        self.restart_with_idle_timeout(2)
        # A job whose show reply is ~100 KB; 200,000 pipelined requests (5 MB) would be 20 GB of
        # replies. gpuqd buffers at most one request line (1 MiB) and one reply per connection.
        job = self.d.submit({"name": "big", "command": ["true"], "env": {"PAD": "x" * 100000}})["ids"][0]
        rss_before = rss_kib(self.d.proc.pid)
        hog = socket.socket(socket.AF_UNIX)
        hog.connect(self.d.socket)
        hog.setblocking(False)
        request = (json.dumps({"cmd": "show", "id": job}) + "\n").encode() * 200000
        sent = 0
        try:
            while sent < len(request):
                sent += hog.send(request[sent:sent + 65536])
        except BlockingIOError:
            pass  # gpuqd stopped reading: backpressure
        self.assertLess(sent, len(request), "gpuqd kept reading requests it could not answer")
        self.d.ok("status")  # others are served meanwhile
        assert_rss_grew_less(self, self.d.proc.pid, rss_before, 20 * 1024)
        # The hog never reads: after the idle timeout gpuqd drops it. Its end of the socket says
        # so (POLLHUP) without a read, which would let gpuqd write on.
        poller = select.poll()
        poller.register(hog, select.POLLHUP | select.POLLRDHUP)
        hung_up = 0
        deadline = time.monotonic() + 60
        while not hung_up and time.monotonic() < deadline:
            hung_up = sum(ev & (select.POLLHUP | select.POLLRDHUP) for _, ev in poller.poll(1000))
        hog.close()
        self.assertTrue(hung_up, "gpuqd kept a client that reads nothing past its idle timeout")
        self.d.ok("status")

    def test_a_client_that_disconnects_mid_wait_is_harmless(self):
        job = self.d.submit({"name": "w", "shell": "sleep 0.5"})["ids"][0]
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.d.socket)
            s.sendall((json.dumps({"cmd": "wait", "ids": [job]}) + "\n").encode())
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
        self.d.ok("status")

    def test_clients_that_hang_up_on_a_held_wait_or_watch_are_let_go_at_once(self):
        release = self.tmp_path("release")
        job = self.d.submit({"name": "held", "shell": f"while [ ! -e {release} ]; do sleep 0.05; done"})["ids"][0]
        wait_until(lambda: self.d.show(job)["job"]["state"] == "running", what="the job to run")

        def held():  # connections gpuqd holds now, the asking one's included
            return self.d.json("gpus")["connections_open"]
        clients = []
        for i in range(20):
            s = socket.socket(socket.AF_UNIX)
            s.connect(self.d.socket)
            request = {"cmd": "wait", "ids": [job]} if i % 2 else {"cmd": "watch", "ids": [job], "timeout_s": 300}
            s.sendall((json.dumps(request) + "\n").encode())
            clients.append(s)
        # All held (none answered: the job runs on), each a connection of gpuqd's.
        wait_until(lambda: held() >= 21, what="gpuqd to hold the 20 connections")
        for s in clients:
            s.close()
        # Each hang-up noticed while its request is held: let go at once (its descriptor closed and
        # what it held freed), not when the job ends or the watch's 300 s are up.
        wait_until(lambda: held() == 1, what="gpuqd to let the 20 connections go")
        # And their waits and watches with them: each kept what it asked about until the job
        # ended (a wait on jobs that never end: for ever), so a loop of them grew gpuqd.
        gpus = self.d.json("gpus")
        self.assertEqual((gpus["waits_held"], gpus["watches_held"]), (0, 0))
        open(release, "w").close()
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
        self.d.ok("status")


class NoDaemon(unittest.TestCase):
    def test_the_cli_says_the_daemon_is_not_running_and_how_to_start_it(self):
        env = dict(os.environ, GPUQ_SOCKET="/tmp/gpuq-no-such-daemon.sock")
        r = subprocess.run([os.path.join(BIN, "gpuq"), "status"], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 3)
        self.assertIn("gpuqd is not running on /tmp/gpuq-no-such-daemon.sock", r.stderr)
        self.assertIn("gpuq daemon start", r.stderr)


if __name__ == "__main__":
    unittest.main()
