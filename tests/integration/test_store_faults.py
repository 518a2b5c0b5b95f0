"""Store failures on every path: with GPUQ_TEST_STORE_FAULTS a write transaction fails as on a
full disk (daemon/store.hpp). Each failure must be retried or reported to the client who asked,
never leave a job in a state nothing will change, and never take gpuqd down."""
import json
import os
import subprocess
import tempfile
import shutil
import time
import unittest

from harness import BIN, Daemon, DaemonTest, ensure_account, event_line, gid_of, pids_matching, uid_of, wait_until

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


def log_text(d):
    with open(os.path.join(d.tmp, "gpuqd.log"), errors="replace") as f:
        return f.read()


@unittest.skipUnless(os.geteuid() == 0, "mounting a tmpfs needs root (CI runs as root)")
@unittest.skipUnless(os.geteuid() == 0, "runs gpuqd as an ordinary user, made for the test")
class StateDirNotWritable(unittest.TestCase):
    """gpuqd runs as an ordinary user, for whom permissions apply (root's gpuqd writes through
    them), and its state dir turns read-only: what a mistaken chmod or chown does. Nothing is lost:
    a job is still taken (the open database is written), waits with the reason while its
    directory cannot be made, and runs once the state dir can be written again."""
    # A user of its own: test_lab's jobs, run as its users, SIGSTOP every process of their owner's.
    USER = "gpuq-faults"

    def setUp(self):
        ensure_account(self.USER)
        path = os.path.abspath(BIN)
        while path != "/":
            if os.stat(path).st_mode & 0o005 != 0o005:
                raise unittest.SkipTest(f"{path} is not open to other users; gpuqd cannot run from it as {self.USER}")
            path = os.path.dirname(path)
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        os.chown(self.tmp, uid_of(self.USER), gid_of(self.USER))
        self.d = Daemon(self.tmp, "fake:1").start(user=self.USER)

    def tearDown(self):
        for path in (self.d.state, os.path.join(self.d.state, "jobs")):
            if os.path.isdir(path):
                os.chmod(path, 0o700)
        self.d.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_a_job_waits_with_the_reason_while_the_state_dir_is_read_only_and_runs_once_it_is_writable(self):
        first = self.d.submit({"name": "before", "shell": "echo before"})["ids"][0]
        self.assertEqual(self.d.wait([first])[first]["state"], "succeeded")
        jobs = os.path.join(self.d.state, "jobs")
        for path in (self.d.state, jobs):
            os.chmod(path, 0o555)
        # as gpuqd's user sees it: root's own check would pass through the permissions
        self.assertNotEqual(subprocess.run(["runuser", "-u", self.USER, "--", "touch", os.path.join(jobs, "probe")],
                                           capture_output=True).returncode, 0)
        job = self.d.submit({"name": "later", "shell": "echo later"})["ids"][0]
        wait_until(lambda: "Permission denied" in self.d.show(job)["job"]["reason"], timeout=60,
                   what="the reason the job cannot start")
        shown = self.d.show(job)["job"]
        self.assertEqual(shown["state"], "queued")
        self.assertIn(f"cannot create directory {jobs}/{job}", shown["reason"])
        self.assertIsNone(self.d.proc.poll())  # gpuqd is still up
        for path in (self.d.state, jobs):
            os.chmod(path, 0o700)
        done = self.d.wait([job], timeout=60)[job]
        self.assertEqual(done["state"], "succeeded", done["reason"])
        self.assertEqual(self.d.ok("logs", str(job)), "later\n")
        self.assertEqual(self.d.ok("logs", str(first)), "before\n")


class StateDirFull(DaemonTest):
    """The state dir's filesystem is full when a job ends: nothing can be written there, not even
    the job's exit record (what a filesystem remounted read-only after an error does too)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.mnt = os.path.join(self.tmp, "mnt")
        os.mkdir(self.mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", self.mnt], capture_output=True, text=True)
        if r.returncode != 0:
            raise unittest.SkipTest(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        self.d = Daemon(self.tmp, "fake:1")
        self.d.state = os.path.join(self.mnt, "state")
        self.d.start()

    def tearDown(self):
        super().tearDown()
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)

    def test_a_job_that_succeeds_while_the_state_dir_is_full_is_recorded_succeeded_once_there_is_room(self):
        gate, done, started = self.tmp_path("gate"), self.tmp_path("done"), self.tmp_path("started")
        job = self.d.submit({"name": "full", "shell": f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done; "
                                                      f"touch {done}"})["ids"][0]
        # Its command runs (recorded running is not enough: a supervisor that has not yet written
        # its pid file when the disk fills never starts the command).
        wait_until(lambda: os.path.exists(started), what="the job to start")
        filler = os.path.join(self.mnt, "filler")
        with open(filler, "wb") as f:  # to the last byte
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass
        open(gate, "w").close()
        wait_until(lambda: os.path.exists(done), what="the job's command to end")
        # Its supervisor cannot write the exit record. It used to give up at once, and the job was
        # recorded `failed` (its supervisor gone without an outcome); now it keeps trying, and the
        # job stays running. (A few seconds for the old supervisor to exit; where it keeps trying,
        # the check below passes at once, whatever the load.)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and pids_matching(f"gpuq-shim {self.mnt}/"):
            time.sleep(0.1)
        self.assertTrue(pids_matching(f"gpuq-shim {self.mnt}/"), "the supervisor gave up on its record")
        self.assertEqual(self.d.show(job)["job"]["state"], "running")
        wait_until(lambda: "its outcome is unknown" in self.d.show(job)["job"]["reason"],
                   what="status to say the outcome is unknown")
        self.assertIn("its supervisor cannot write the exit record", self.d.ok("status"))
        os.unlink(filler)
        done_job = self.d.wait([job], timeout=120)[job]
        self.assertEqual(done_job["state"], "succeeded", done_job["reason"])


class WriteAheadLog(DaemonTest):
    """gpuq.db-wal stays bounded while jobs run and is emptied once gpuqd is idle."""

    def test_the_log_stays_bounded_through_two_thousand_jobs_and_is_emptied_when_idle(self):
        self.d.stop()
        self.d.extra += ["--cpu-slots", "8"]
        self.d.start()
        wal = os.path.join(self.d.state, "gpuq.db-wal")
        ids = self.d.submit([{"name": f"j{i}", "command": ["true"]} for i in range(2000)])["ids"]
        done = self.d.wait(ids, timeout=600)
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        # ~39 KB a job went into a log that was never checkpointed: 76 MB here. Checkpointed every
        # 1,000 pages (4 MiB) or 5 s, and started over once past 2,000 pages, it stays near 8 MiB.
        size = os.path.getsize(wal)
        self.assertLess(size, 16 << 20, f"the log is {size} bytes after 2,000 jobs")
        # Idle for 5 s, gpuqd empties it.
        wait_until(lambda: os.path.getsize(wal) == 0, timeout=60, interval=0.5, what="the idle log to be emptied")
        self.assertEqual(self.d.json("status", "--all")["total"], 2000)  # all there, read from the database itself


class DiskFullAtJobEnd(DaemonTest):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.full = os.path.join(self.tmp, "disk-full")
        self.d = Daemon(self.tmp, "fake:2", env=dict(os.environ, GPUQ_TEST_STORE_FAULTS="file:" + self.full)).start()

    def test_a_job_that_ends_while_the_store_fails_is_recorded_once_it_works_again(self):
        release = self.tmp_path("release")
        job_id = self.d.submit({"name": "ends-on-full-disk",
                                "shell": f"while [ ! -e {release} ]; do sleep 0.05; done; "
                                + event_line(type="result", done=1)})["ids"][0]
        wait_until(lambda: self.d.show(job_id)["job"]["state"] == "running", what="the job to run")
        open(self.full, "w").close()
        open(release, "w").close()
        wait_until(lambda: f"job {job_id} ended, but its end cannot be recorded" in log_text(self.d),
                   what="gpuqd to fail recording the end")
        # Still answering, and honest: the end is not recorded yet.
        self.assertEqual(self.d.show(job_id)["job"]["state"], "running")
        r = self.d.run("submit", "-", input=json.dumps({"shell": "true"}))  # refused, saying why
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("database or disk is full", r.stderr)
        os.unlink(self.full)
        job = self.d.wait([job_id], timeout=60)[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"done": 1})
        history = [t["state"] for t in self.d.show(job_id)["history"]]
        self.assertEqual(history.count("succeeded"), 1, history)


    def test_a_cancel_that_cannot_be_stored_cancels_nothing_running_or_queued(self):
        release = self.tmp_path("release")
        running = self.d.submit({"name": "running", "gpus": 2,
                                 "shell": f"while [ ! -e {release} ]; do sleep 0.05; done"})["ids"][0]
        queued = self.d.submit({"name": "queued", "gpus": 1, "command": ["true"]})["ids"][0]  # behind it
        wait_until(lambda: self.d.show(running)["job"]["state"] == "running", what="the job to run")
        open(self.full, "w").close()
        r = self.d.run("cancel", str(running), str(queued))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("database or disk is full", r.stderr)
        os.unlink(self.full)
        # Neither was cancelled, nor told to stop: the running one ends as it would have.
        self.assertEqual(self.d.show(queued)["job"]["state"], "queued")
        open(release, "w").close()
        jobs = self.d.wait([running, queued], timeout=60)
        self.assertEqual((jobs[running]["state"], jobs[queued]["state"]), ("succeeded", "succeeded"))


class FaultWalk(unittest.TestCase):
    """One failed write at each point of a scenario that passes through submit, launch, events,
    a retry, a dependency failing, restart, cancel and clean --forget."""

    def scenario(self, d):
        def retrying(*args):  # a store_error reply is the client's to retry: nothing happened
            for _ in range(3):
                r = d.run(*args, "--json")
                if r.returncode == 0:
                    return json.loads(r.stdout)
                self.assertIn("state store", r.stderr, r.stderr)
            self.fail(f"gpuq {' '.join(args)} kept failing")

        jobs = [{"name": "a", "shell": event_line(type="result", ok=1)},
                {"name": "b", "shell": "exit 3", "retries": 1},
                {"name": "c", "shell": "true", "after": ["b"]},
                {"name": "d", "shell": "true", "after": ["c"]}]
        with open(os.path.join(d.tmp, "jobs.json"), "w") as f:
            json.dump(jobs, f)
        ids = retrying("submit", os.path.join(d.tmp, "jobs.json"))["ids"]

        def all_ended():
            r = d.run("status", "--all", "--json")
            return r.returncode == 0 and {j["state"] for j in json.loads(r.stdout)["jobs"]} <= TERMINAL

        wait_until(all_ended, timeout=60, what="every job to end")
        retrying("restart", str(ids[1]))  # b, with c and d that failed waiting for it
        retrying("cancel", str(ids[3]))  # d, queued behind c
        wait_until(all_ended, timeout=60, what="every job to end after the restart")
        retrying("clean", str(ids[0]), "--forget")
        return ids

    def test_one_failed_write_anywhere_is_retried_or_reported_and_no_job_is_left_hanging(self):
        # Write n fails, for n = 1, 2, ... until a run makes fewer than n writes: every write of
        # the scenario has failed once.
        for n in range(1, 80):
            tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
            d = Daemon(tmp, "fake:2", env=dict(os.environ, GPUQ_TEST_STORE_FAULTS=str(n))).start()
            with self.subTest(failing_write=n):
                try:
                    ids = self.scenario(d)
                    states = {j["id"]: j["state"] for j in d.json("status", "--all")["jobs"]}
                    self.assertNotIn(ids[0], states)  # forgotten
                    self.assertEqual(states[ids[1]], "failed")
                    self.assertEqual(states[ids[2]], "failed")
                    self.assertIn(states[ids[3]], ("failed", "cancelled"))
                    self.assertIsNone(d.proc.poll(), "gpuqd died")
                finally:
                    d.stop()
                text = log_text(d)
                self.assertNotIn("internal error", text)
            shutil.rmtree(tmp, ignore_errors=True)
            if f"failed write {n} (GPUQ_TEST_STORE_FAULTS)" not in text:
                self.assertGreater(n, 10, "the scenario makes more writes than that")
                return
        self.fail("the scenario never ran out of writes to fail")


if __name__ == "__main__":
    unittest.main()
