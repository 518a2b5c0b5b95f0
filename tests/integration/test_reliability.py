"""The fault matrix of docs/reliability.md: daemon death under load, a dying DDP rank, cancel
during a retry backoff, log floods, other users, path tricks and the committed bad-input corpus."""
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from harness import BIN, REPO, Daemon, DaemonTest, event_line, pids_matching, wait_until

WORKER = os.path.join(BIN, "gpuq-worker")
CORPUS = os.path.join(REPO, "tests/corpus")


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


class DaemonDeath(DaemonTest):
    def test_kill_9_with_4_running_and_100_queued_runs_every_job_exactly_once(self):
        runs = self.tmp_path("runs")
        release = self.tmp_path("release")
        # Each job appends its id (O_APPEND: one line per run), waits until the test releases the
        # jobs (so the first four hold their GPUs however slow the machine), and reports a result.
        jobs = [{"name": f"j{i}", "gpus": 1, "shell": f'echo "$GPUQ_JOB_ID" >> {runs}; '
                 f'while [ ! -e {release} ]; do sleep 0.02; done; echo out-$GPUQ_JOB_ID; '
                 + event_line(type="result", ok=1)} for i in range(104)]
        ids = self.d.submit(jobs)["ids"]

        def counts():
            states = [j["state"] for j in self.d.json("status", "--all")["jobs"]]
            return states.count("running"), states.count("queued")

        wait_until(lambda: counts() == (4, 100), what="4 running, 100 queued")
        running = [j["id"] for j in self.d.json("status", "--all")["jobs"] if j["state"] == "running"]
        self.d.kill9()
        # The 4 running jobs end while no daemon is there: their supervisors record it.
        open(release, "w").close()
        exits = [os.path.join(self.d.state, "jobs", str(i), "attempt-1", "exit.json") for i in running]
        wait_until(lambda: all(os.path.exists(e) for e in exits), what="the running jobs to end")
        self.d.start()
        # Once more, mid-queue.
        wait_until(lambda: counts()[1] < 60, timeout=60, what="the queue to drain halfway")
        self.d.kill9()
        self.d.start()
        done = self.d.wait(ids, timeout=180)
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        self.assertEqual({json.dumps(j["result"]) for j in done.values()}, {'{"ok": 1}'})
        ran = read_text(runs).split()
        self.assertEqual(sorted(map(int, ran)), sorted(ids), "a job ran twice or not at all")
        for i in ids:
            self.assertEqual(self.d.ok("logs", str(i)).strip(), f"out-{i}")
        self.assertEqual(self.d.show(ids[0])["job"]["attempt"], 1)


@unittest.skipUnless(os.path.exists(WORKER), "gpuq-worker not built")
class DyingRank(DaemonTest):
    def test_a_dying_ddp_rank_stops_its_gang_within_10_s_and_the_retry_resumes_from_the_checkpoint(self):
        train = {"dataset": {"kind": "synthetic", "samples": 40000, "features": 64}, "model": {"hidden": [128, 128]},
                 "epochs": 3, "batch_size": 32, "seed": 5151}
        job_id = self.d.submit({"name": "gang", "mode": "ddp", "ranks": 2, "retries": 1, "train": train})["ids"][0]
        latest = os.path.join(self.d.state, "jobs", str(job_id), "checkpoints", "latest")
        wait_until(lambda: read_text(latest) == "epoch-1", timeout=120, interval=0.02, what="the first checkpoint")
        ranks = {}
        for pid in pids_matching('"seed":5151'):
            env = read_text(f"/proc/{pid}/environ").split("\0")
            rank = [e for e in env if e.startswith("RANK=")]
            if rank:
                ranks[rank[0][5:]] = pid
        self.assertEqual(sorted(ranks), ["0", "1"])
        killed_at = time.time()
        os.kill(ranks["1"], signal.SIGKILL)
        wait_until(lambda: not os.path.exists(f"/proc/{ranks['0']}"), timeout=10, interval=0.05,
                   what="rank 0 to be stopped")
        self.assertLess(time.time() - killed_at, 10)
        job = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.assertEqual(job["attempt"], 2)
        self.assertEqual(job["result"]["resumed_from_epoch"], 1)
        first = self.d.show(job_id)["history"]
        reasons = " ".join(h.get("reason") or "" for h in first)
        self.assertIn("rank 1 was killed by signal 9 (SIGKILL)", reasons)


def memory_cgroup(name, limit):
    """A cgroup with a memory limit, wherever this host has the memory controller: a cgroup v1
    hierarchy mounted with it, or a cgroup v2 one that offers it (enabled for the new group's
    parent). Returns its directory, or raises OSError saying what was tried."""
    tried = []
    with open("/proc/self/mounts") as f:
        mounts = [line.split() for line in f]
    for _, where, kind, options, *_ in mounts:
        if kind == "cgroup" and "memory" in options.split(","):
            path = os.path.join(where, name)
            try:
                os.mkdir(path)
                with open(os.path.join(path, "memory.limit_in_bytes"), "w") as out:
                    out.write(str(limit))
                return path
            except OSError as e:
                tried.append(f"v1 at {where}: {e}")
    for _, where, kind, *_ in mounts:
        if kind != "cgroup2":
            continue
        try:
            with open(os.path.join(where, "cgroup.controllers")) as f:
                if "memory" not in f.read().split():
                    tried.append(f"v2 at {where}: no memory controller")
                    continue
            with open(os.path.join(where, "cgroup.subtree_control"), "w") as out:
                out.write("+memory")
            path = os.path.join(where, name)
            os.mkdir(path)
            with open(os.path.join(path, "memory.max"), "w") as out:
                out.write(str(limit))
            if os.path.exists(os.path.join(path, "memory.swap.max")):  # else swap is not accounted here
                with open(os.path.join(path, "memory.swap.max"), "w") as out:
                    out.write("0")
            return path
        except OSError as e:
            tried.append(f"v2 at {where}: {e}")
    raise OSError("; ".join(tried) or "no cgroup hierarchy is mounted")


class OutOfMemory(DaemonTest):
    def test_a_job_over_its_memory_ends_out_of_memory_even_through_a_wrapper_and_is_retried_only_if_asked(self):
        containment = self.d.json("gpus")["containment"]
        if not re.search(r"memory per rank \((v2|v1 at [^)]+)\)", containment):
            self.skipTest(f"needs the memory controller for gpuqd's cgroups: {containment}")
        # The program the OOM killer kills runs under a shell that outlives it and exits 137: what
        # died was not the rank, and the job still ends out_of_memory (its cgroup's count).
        shell = "/usr/bin/python3 -c 'x = bytearray(512 << 20); x[::4096] = b\"y\" * len(x[::4096])'; exit $?"
        ids = self.d.submit([{"name": "hog", "retries": 1, "memory_mb": 64, "shell": shell},
                             {"name": "hog-retried", "retries": 1, "memory_mb": 64, "retry_on_oom": True,
                              "shell": shell}])["ids"]
        done = self.d.wait(ids, timeout=90)
        hog, again = done[ids[0]], done[ids[1]]
        self.assertEqual(hog["state"], "out_of_memory", hog["reason"])
        self.assertEqual(hog["attempt"], 1, "an attempt out of memory is not retried unless the spec asks")
        self.assertEqual(hog["exit_code"], 137)  # the wrapper's: it was not killed itself
        self.assertRegex(hog["reason"], r"^out of memory: the OOM killer killed 1 process of it "
                                        r"\(its limit: 64 MiB a rank\); rank 0 exited with code 137")
        self.assertEqual(again["state"], "out_of_memory", again["reason"])
        self.assertEqual(again["attempt"], 2, "retry_on_oom: retried within its retries")
        self.assertIn("out_of_memory", self.d.ok("status", "-s", "out_of_memory"))
        # A client of protocol minor 0 does not know the state: it reads the failure it is.
        def state_seen(*hello):
            return self.d.requests([*hello, {"cmd": "show", "id": ids[0]}])[-1]["job"]["state"]
        hello = {"cmd": "hello", "protocol_version": 1, "client": "test"}
        self.assertEqual(state_seen(), "failed")  # no hello: minor 0
        self.assertEqual(state_seen({**hello, "protocol_minor": 0}), "failed")
        self.assertEqual(state_seen({**hello, "protocol_minor": 1}), "out_of_memory")


    def test_a_kill_outside_the_jobs_own_cgroups_reads_most_likely_the_oom_killer_and_is_retried(self):
        # Where gpuqd does not count the kill (no memory controller of its own; here the job left
        # its memory cgroup), only the supervisor's reading of /proc/vmstat says what it likely was:
        # not certain, so the job fails and is retried like any failure.
        try:
            cgroup = memory_cgroup(f"gpuq-test-{os.getpid()}", 64 << 20)
        except OSError as e:
            self.skipTest(f"needs a writable memory cgroup (v1 or v2) to cause a real OOM kill: {e}")
        self.addCleanup(lambda: os.rmdir(cgroup))
        # The job moves itself into a 64 MiB cgroup, then asks for 512 MiB.
        shell = (f"echo $$ > {cgroup}/cgroup.procs && "
                 "exec /usr/bin/python3 -c 'x = bytearray(512 << 20); print(\"survived\")'")
        job_id = self.d.submit({"name": "hog", "retries": 1, "shell": shell})["ids"][0]
        job = self.d.wait([job_id], timeout=60)[job_id]
        self.assertEqual(job["state"], "failed", job["reason"])
        self.assertEqual(job["attempt"], 2, "an OOM-killed job is retried like any failure")
        self.assertEqual(job["exit_signal"], 9)
        self.assertEqual(job["reason"], "rank 0 was killed by signal 9 (SIGKILL), most likely by the kernel's out-of-memory killer")
        self.assertTrue(self.d.show(job_id)["first_failure"]["oom_kill"])


class InheritedDescriptors(DaemonTest):
    def test_a_job_holds_none_of_gpuqds_descriptors(self):
        # A client connected while the job starts: its connection, the listening socket, the store
        # and the rest of gpuqd's are all open in gpuqd then.
        with socket.socket(socket.AF_UNIX) as held:
            held.connect(self.d.socket)
            job = self.d.submit({"name": "fds", "shell": 'for f in /proc/$$/fd/*; do echo "$f $(readlink $f)"; done'})
            job_id = job["ids"][0]
            self.assertEqual(self.d.wait([job_id])[job_id]["state"], "succeeded")
        lines = self.d.ok("logs", str(job_id)).splitlines()
        fds = {int(line.split()[0].rsplit("/", 1)[1]): line.split(" ", 1)[1] for line in lines if line.startswith("/proc/")}
        # stdin, stdout and stderr, and the shell's own descriptor for the directory it lists
        self.assertLessEqual(set(fds), {0, 1, 2, 3}, fds)
        self.assertFalse([t for t in fds.values() if t.startswith("socket:") or "gpuq.db" in t], fds)


class Cancel(DaemonTest):
    def test_cancel_sends_sigterm_first_and_waits_the_grace_for_the_job_to_clean_up(self):
        # The local executor's promise (docs/reliability.md): SIGTERM to every rank, then the grace
        # (60 s here), then SIGKILL. The job's cleanup waits for a file the test makes once it has
        # seen the SIGTERM: a SIGKILL at once, or before the grace, leaves no cleanup behind.
        self.d.stop()
        self.d = Daemon(self.tmp, extra=["--grace", "60"]).start()
        started, term, release, cleaned = (self.tmp_path(n) for n in ("started", "term", "release", "cleaned"))
        shell = (f"trap 'echo term > {term}; while [ ! -e {release} ]; do sleep 0.05; done; echo done > {cleaned}; "
                 f"exit 0' TERM; touch {started}; while :; do sleep 0.05; done")
        job_id = self.d.submit({"name": "graceful", "shell": shell})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the job to start")
        self.d.ok("cancel", str(job_id))
        wait_until(lambda: os.path.exists(term), what="the job's SIGTERM handler")
        self.assertEqual(self.d.show(job_id)["job"]["state"], "running")  # cleaning up, in its grace
        open(release, "w").close()
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "cancelled")
        self.assertEqual(read_text(cleaned).strip(), "done")
        # One that ignores SIGTERM is killed once the grace is over (1 s here).
        self.d.stop()
        self.d = Daemon(self.tmp, extra=["--grace", "1"]).start()
        stubborn = self.d.submit({"name": "stubborn", "shell": f"trap '' TERM; touch {started}2; "
                                                             "while :; do sleep 0.05; done"})["ids"][0]
        wait_until(lambda: os.path.exists(started + "2"), what="the stubborn job to start")
        self.d.ok("cancel", str(stubborn))
        self.assertEqual(self.d.wait([stubborn])[stubborn]["state"], "cancelled")
        wait_until(lambda: not pids_matching(f"gpuq-shim {self.tmp}/"), what="the supervisors to exit")

    def test_cancel_during_a_retry_backoff_ends_the_job_and_nothing_runs_again(self):
        self.d.stop()
        self.d = Daemon(self.tmp, extra=["--retry-backoff", "30"]).start()
        runs = self.tmp_path("runs")
        job_id = self.d.submit({"name": "flaky", "retries": 5, "shell": f"echo run >> {runs}; exit 3"})["ids"][0]
        # Back in the queue after attempt 1, waiting out a 30 s backoff.
        wait_until(lambda: (lambda j: (j["state"], j["attempt"]))(self.d.show(job_id)["job"]) == ("queued", 1),
                   what="the retry backoff")
        self.d.ok("cancel", str(job_id))
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "cancelled")
        self.assertEqual(read_text(runs).split(), ["run"])
        self.assertEqual(pids_matching(f"gpuq-shim {self.tmp}/"), [])


def try_mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", path], capture_output=True)
    return r.returncode == 0


class FullDisk(DaemonTest):
    def setUp(self):
        # The daemon's state dir on a small tmpfs of its own, so the test can fill it.
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.state_mount = os.path.join(self.tmp, "state")
        if os.geteuid() != 0 or not try_mount_tmpfs(self.state_mount, "4m"):
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.skipTest("needs root and tmpfs mounts to fill a disk")
        self.addCleanup(lambda: subprocess.run(["umount", "-l", self.state_mount]))
        self.d = Daemon(self.tmp).start()

    def fill(self):
        filler = os.path.join(self.state_mount, "filler")
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        return filler

    def test_a_full_disk_refuses_submits_with_a_clear_error_and_loses_nothing(self):
        ids = self.d.submit([{"name": f"before{i}", "command": ["true"]} for i in range(3)])["ids"]
        self.d.wait(ids)
        filler = self.fill()
        big = {"name": "big", "command": ["true"], "env": {"PAYLOAD": "x" * 100000}}
        r = self.d.run("submit", "-", input=json.dumps(big))
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("state store", r.stderr)
        self.assertIn("full", r.stderr)
        status = self.d.json("status", "--all")
        self.assertEqual([j["state"] for j in status["jobs"]], ["succeeded"] * 3)
        self.assertEqual(status["total"], 3)
        # Space comes back: the same daemon takes and runs jobs again.
        os.remove(filler)
        job_id = self.d.submit(big)["ids"][0]
        self.assertEqual(self.d.wait([job_id])[job_id]["state"], "succeeded")
        r = subprocess.run(["/usr/bin/sqlite3", os.path.join(self.state_mount, "gpuq.db"), "PRAGMA integrity_check"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            self.assertEqual(r.stdout.strip(), "ok")


class BadStore(unittest.TestCase):
    def test_a_foreign_or_corrupt_database_is_refused_at_start_and_left_untouched(self):
        for name, content in (("foreign", b"precious notes, not a database\n"),
                              ("corrupt", b"SQLite format 3\x00" + os.urandom(4096))):
            with self.subTest(case=name):
                tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
                state = os.path.join(tmp, "state")
                os.makedirs(state, mode=0o700)
                db = os.path.join(state, "gpuq.db")
                with open(db, "wb") as f:
                    f.write(content)
                r = subprocess.run([os.path.join(BIN, "gpuqd"), "--foreground", "--socket", os.path.join(tmp, "s.sock"),
                                    "--state-dir", state, "--gpus", "fake:1"], capture_output=True, text=True, timeout=30)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(db, r.stderr)
                with open(db, "rb") as f:
                    self.assertEqual(f.read(), content, "gpuqd changed a file it refused")
                subprocess.run(["rm", "-rf", tmp])


class LogFlood(DaemonTest):
    def test_a_job_flooding_its_output_rotates_its_log_and_the_daemon_does_not_grow(self):
        self.d.stop()
        self.d = Daemon(self.tmp, extra=["--log-limit-mb", "1"]).start()
        rss_before = daemon_rss_kib(self.d.proc.pid)
        # 40 MB of output in 100-byte lines, then a last line.
        shell = "yes $(printf '%099d' 7) | head -c 40000000; echo the-last-line"
        job_id = self.d.submit({"name": "flood", "shell": shell})["ids"][0]
        job = self.d.wait([job_id], timeout=120)[job_id]
        self.assertEqual(job["state"], "succeeded")
        log = self.d.show(job_id)["logs"][0]["path"]
        self.assertLessEqual(os.path.getsize(log), 1 << 20)
        self.assertLessEqual(os.path.getsize(log + ".1"), 1 << 20)
        out = self.d.ok("logs", str(job_id))
        self.assertTrue(out.endswith("the-last-line\n"), out[-200:])
        self.assertIn("[gpuq: log limit of 1048576 bytes reached", out)
        self.assertLess(len(out), 2 * (1 << 20) + 4096)
        self.assertLess(daemon_rss_kib(self.d.proc.pid) - rss_before, 8 * 1024, "gpuqd grew with the job's output")


def daemon_rss_kib(pid):
    for line in read_text(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


class OtherUsers(DaemonTest):
    @unittest.skipUnless(os.geteuid() == 0, "needs root to act as another uid")
    def test_a_client_of_another_uid_is_refused_even_when_the_socket_is_reachable(self):
        # The directory (0700) and socket (0600) keep other users out; open them up to reach the
        # second check, the peer's credentials.
        os.chmod(os.path.dirname(self.d.socket), 0o755)
        os.chmod(self.d.socket, 0o666)
        # The refusal is sent as soon as the connection is accepted, and the socket closed: the
        # request may meet a closed socket, the reply is still there to read.
        probe = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                 "try: s.sendall(b'{\"cmd\":\"status\"}\\n')\n"
                 "except BrokenPipeError: pass\n"
                 "print(s.recv(4096).decode())")
        r = subprocess.run(["/usr/bin/python3", "-c", probe, self.d.socket], capture_output=True, text=True,
                           user=65534, group=65534, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        reply = json.loads(r.stdout)
        self.assertFalse(reply["ok"])
        self.assertEqual(reply["error"]["code"], "forbidden")
        self.assertIn("uid 65534", reply["error"]["message"])
        self.d.ok("status")


class PathTricks(DaemonTest):
    def test_names_ids_and_log_requests_cannot_reach_outside_the_state_dir(self):
        r = self.d.run("submit", "-", input=json.dumps({"name": "../../etc", "command": ["true"]}))
        self.assertEqual(r.returncode, 4)
        self.assertIn("field `name` must be 1-128 characters", r.stderr)
        for bad in (b'{"cmd": "show", "id": "../../etc/passwd"}\n', b'{"cmd": "show", "id": -1}\n',
                    b'{"cmd": "cancel", "ids": ["1/../2"]}\n'):
            reply = self.d.request(bad)
            self.assertFalse(reply["ok"], bad)
            self.assertIn(reply["error"]["code"], ("bad_request", "not_found"), bad)
        r = self.d.run("logs", "../../etc/passwd")
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("root:", r.stdout)


class BadInputCorpus(DaemonTest):
    """tests/corpus/requests/<code>--<what>: raw request lines, each answered with that error code.
    tests/corpus/specs/<what>.json + .expect: job specs `gpuq submit` refuses with that message."""

    def test_every_bad_request_in_the_corpus_gets_its_error_and_the_daemon_lives(self):
        files = sorted(glob.glob(os.path.join(CORPUS, "requests", "*")))
        self.assertGreater(len(files), 10)
        for path in files:
            code = os.path.basename(path).split("--")[0]
            with open(path, "rb") as f:
                data = f.read()
            with self.subTest(case=os.path.basename(path)):
                reply = self.d.request(data if data.endswith(b"\n") else data + b"\n")
                self.assertFalse(reply["ok"])
                self.assertEqual(reply["error"]["code"], code)
                self.assertTrue(reply["error"]["message"])
        self.d.ok("status")

    def test_every_bad_job_spec_in_the_corpus_is_refused_with_its_message(self):
        files = sorted(glob.glob(os.path.join(CORPUS, "specs", "*.json")))
        self.assertGreater(len(files), 10)
        for path in files:
            with open(path[:-len(".json")] + ".expect") as f:
                expect = f.read().strip()
            code = 4  # gpuqd refused it; "exit N: message" when the CLI refuses it first
            if expect.startswith("exit "):
                code, expect = int(expect[5:expect.index(":")]), expect[expect.index(":") + 1:].strip()
            with self.subTest(case=os.path.basename(path)):
                r = self.d.run("submit", path)
                self.assertEqual(r.returncode, code, r.stdout + r.stderr)
                self.assertIn(expect, r.stderr)
        self.assertEqual(self.d.json("status", "--all")["jobs"], [])


if __name__ == "__main__":
    unittest.main()
