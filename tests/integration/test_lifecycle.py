"""Process supervision and durability: cancel kills whole trees, jobs survive a killed daemon,
one daemon per socket, private socket files, clean shutdown."""
import json
import pathlib
import os
import signal
import stat
import subprocess
import time
import unittest

from harness import BIN, Daemon, DaemonTest, alive, event_line, pids_matching, wait_until


def cmdline(pid):
    """A process's command line, its empty words (what a rewritten one leaves at its end) dropped."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [w.decode() for w in f.read().split(b"\0") if w]


def stat_fields(pid):
    """(ppid, session id) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[3])


class Cancel(DaemonTest):
    def test_cancel_kills_the_whole_tree_including_escaped_processes(self):
        # A background child, a child that escapes into its own session, and a foreground one.
        sub = self.d.submit({"name": "tree", "shell": "sleep 7301 & (setsid sleep 7302 &); sleep 7303"})
        job_id = sub["ids"][0]
        wait_until(lambda: len(pids_matching("^sleep 730[123]$")) == 3, what="the three sleeps")
        out = self.d.ok("cancel", str(job_id))
        self.assertIn("stopping", out)
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "cancelled")
        self.assertEqual(pids_matching("^sleep 730[123]$"), [])

    def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(self):
        sub = self.d.submit({"name": "stubborn", "shell": "trap '' TERM; sleep 7311 & wait; sleep 7312"})
        job_id = sub["ids"][0]
        wait_until(lambda: pids_matching("^sleep 7311$"), what="the job to start")
        t0 = time.time()
        self.d.ok("cancel", str(job_id))
        self.assertEqual(self.d.wait([job_id])[job_id]["state"], "cancelled")
        self.assertLess(time.time() - t0, 10)  # grace is 2 s in the harness
        self.assertEqual(pids_matching("^sleep 731[12]$"), [])

    def test_cancel_of_queued_and_finished_jobs(self):
        blocker = self.d.submit({"name": "all-gpus", "gpus": 4, "shell": "sleep 30"})["ids"][0]
        queued = self.d.submit({"name": "waits", "gpus": 1, "command": ["true"]})["ids"][0]
        wait_until(lambda: self.d.show(blocker)["job"]["state"] == "running", what="the blocker")
        self.assertEqual(self.d.show(queued)["job"]["state"], "queued")
        reason = self.d.show(queued)["job"]["reason"]
        self.assertIn("waiting for 1 free GPU", reason)
        self.assertEqual(self.d.json("results", str(queued))["jobs"][0]["state"], "queued")
        status = {j["id"]: j for j in self.d.json("status")["jobs"]}
        self.assertEqual(status[queued]["reason"], reason)
        self.assertIn("cancelled", self.d.ok("cancel", str(queued)))
        self.assertEqual(self.d.show(queued)["job"]["state"], "cancelled")
        self.assertIn("already cancelled", self.d.ok("cancel", str(queued)))
        self.d.ok("cancel", str(blocker))
        self.assertEqual(self.d.wait([blocker])[blocker]["state"], "cancelled")

    def test_cancel_of_a_whole_batch_counts_what_it_did(self):
        done = self.d.submit({"name": "done", "command": ["true"]})["ids"][0]
        self.d.wait([done])
        sub = self.d.submit([{"name": f"s{i}", "gpus": 1, "shell": "sleep 9187"} for i in range(24)])
        wait_until(lambda: sum(j["state"] == "running" for j in self.d.json("status")["jobs"]) == 4,
                   what="four jobs to start")
        out = self.d.ok("cancel", "--batch", str(sub["batch"]), str(done))
        self.assertEqual(out.strip(), "20 queued jobs cancelled, 4 running jobs stopping (SIGTERM to all their "
                                      "processes), 1 had already ended")
        states = {j["state"] for j in self.d.wait(sub["ids"]).values()}
        self.assertEqual(states, {"cancelled"})
        self.assertEqual(self.d.run("cancel").returncode, 2)

    def test_leftover_background_processes_are_stopped_when_a_job_ends(self):
        sub = self.d.submit({"name": "leaky", "shell": "sleep 7321 & echo started"})
        self.assertEqual(self.d.wait(sub["ids"])[sub["ids"][0]]["state"], "succeeded")
        self.assertEqual(pids_matching("^sleep 7321$"), [])


class Durability(DaemonTest):
    GPUS = "fake:1"

    def test_kill_9_then_restart_keeps_queue_history_and_running_jobs(self):
        runs = self.tmp_path("runs")
        done_before = self.d.submit({"name": "early", "command": ["true"]})["ids"][0]
        self.d.wait([done_before])
        # One GPU: the first job runs, the other two queue behind it. Each waits until the test
        # releases it, so the first is still running when the daemon comes back however slow the
        # machine is.
        release = self.tmp_path("release")
        jobs = [{"name": f"q{i}", "gpus": 1, "shell": f"echo q{i} >> {runs}; "
                 f"while [ ! -e {release} ]; do sleep 0.02; done; " + event_line(type="result", n=i)}
                for i in range(3)]
        ids = self.d.submit(jobs)["ids"]
        # Its process has started (its first line is written): `running` alone is the launch
        # recorded, which comes before the supervisor and the job exist.
        wait_until(lambda: os.path.exists(runs) and "q0" in open(runs).read(), what="the first job")
        self.d.kill9()
        self.assertTrue(pids_matching(f"{self.d.state}/jobs/{ids[0]}/"), "the job died with the daemon")
        self.d.start()
        status = {j["id"]: j for j in self.d.json("status")["jobs"]}
        self.assertEqual(status[done_before]["state"], "succeeded")
        self.assertEqual(status[ids[0]]["state"], "running")
        self.assertEqual([status[i]["state"] for i in ids[1:]], ["queued", "queued"])
        open(release, "w").close()
        done = self.d.wait(ids)
        self.assertTrue(all(j["state"] == "succeeded" for j in done.values()), done)
        self.assertEqual([done[i]["result"] for i in ids], [{"n": 0}, {"n": 1}, {"n": 2}])
        # Every job ran exactly once.
        self.assertEqual(sorted(open(runs).read().split()), ["q0", "q1", "q2"])
        self.assertIn("re-adopted job", pathlib.Path(self.tmp_path("gpuqd.log")).read_text())

    def test_a_job_that_ends_while_the_daemon_is_down_is_recorded(self):
        release = self.tmp_path("release")
        job_id = self.d.submit({"name": "quick", "shell": f"while [ ! -e {release} ]; do sleep 0.02; done; exit 4"})["ids"][0]
        wait_until(lambda: self.d.show(job_id)["job"]["state"] == "running", what="the job")
        self.d.kill9()
        open(release, "w").close()  # it ends now, with no daemon: its supervisor records the end
        exit_record = os.path.join(self.d.state, "jobs", str(job_id), "attempt-1", "exit.json")
        wait_until(lambda: os.path.exists(exit_record), what="the job to end")
        self.d.start()
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "failed")
        self.assertEqual(job["exit_code"], 4)

    def test_a_job_marked_running_that_never_started_runs_again_after_a_crash(self):
        # gpuqd records `running` before it spawns the supervisor; a crash between the two leaves
        # a running job with no shim.pid. Made here by killing daemon and job and removing the file.
        flag = self.tmp_path("second-run")
        # A sleep of its own, so that only this job's is killed (other modules' tests run alongside).
        job_id = self.d.submit({"name": "orphan", "gpus": 1, "shell": f"[ -e {flag} ] || sleep 7331"})["ids"][0]
        wait_until(lambda: self.d.show(job_id)["job"]["state"] == "running", what="the job")
        self.d.kill9()
        for pid in pids_matching(f"gpuq-shim {self.tmp}/") + pids_matching("^sleep 7331$"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # the shim took it down first
                pass
        wait_until(lambda: not pids_matching(f"gpuq-shim {self.tmp}/"), what="the supervisor to die")
        os.remove(os.path.join(self.d.state, "jobs", str(job_id), "attempt-1", "shim.pid"))
        open(flag, "w").close()
        self.d.start()
        job = self.d.wait([job_id], timeout=30)[job_id]
        # The launch gpuqd withdrew keeps its number; the run is the next, and no retry is spent.
        self.assertEqual((job["state"], job["attempt"], job["attempt_base"]), ("succeeded", 2, 1))
        with open(os.path.join(self.d.state, "jobs", str(job_id), "attempt-1", "shim.pid")) as f:
            self.assertIn("withdrawn_by", json.loads(f.read()))
        self.assertIn("requeued: gpuqd stopped before the job started",
                      [h["reason"] for h in self.d.show(job_id)["history"]])
        self.assertEqual(self.d.json("gpus")["gpus"][0]["jobs"], [])  # its GPU is free again

    def test_sigterm_stops_the_daemon_cleanly_and_jobs_keep_running(self):
        job_id = self.d.submit({"name": "survivor", "shell": "sleep 1; " + event_line(type="result", alive=True)})["ids"][0]
        wait_until(lambda: self.d.show(job_id)["job"]["state"] == "running", what="the job")
        self.d.stop()
        self.assertEqual(self.d.proc.returncode, 0)
        self.assertFalse(os.path.exists(self.d.socket), "socket left behind after a clean stop")
        self.d.start()
        self.assertEqual(self.d.wait([job_id])[job_id]["result"], {"alive": True})


class LostStore(DaemonTest):
    """A store that does not know every job directory: lost, emptied, or an older copy put back."""

    def start_refused(self, *extra):
        return subprocess.run([os.path.join(BIN, "gpuqd"), "--foreground", "--socket", self.d.socket, "--state-dir",
                               self.d.state, "--gpus", "fake:4", *extra], capture_output=True, text=True, timeout=30)

    def run_job(self, name):
        job_id = self.d.submit({"name": name, "shell": f"echo I am {name}"})["ids"][0]
        self.assertEqual(self.d.wait([job_id])[job_id]["state"], "succeeded")
        return job_id

    def db_files(self):
        return [os.path.join(self.d.state, f) for f in ("gpuq.db", "gpuq.db-wal", "gpuq.db-shm")]

    def test_a_missing_or_empty_store_is_refused_and_forgetting_the_old_jobs_never_reuses_their_ids(self):
        old = [self.run_job("old-1"), self.run_job("old-2")]
        self.d.stop()
        for lose in ("missing", "empty"):
            with self.subTest(store=lose):
                for f in self.db_files():
                    if os.path.exists(f):
                        os.unlink(f)
                if lose == "empty":
                    open(self.db_files()[0], "w").close()
                r = self.start_refused()
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(f"holds 2 job directories (jobs/{old[0]} to jobs/{old[1]}) that its store, gpuq.db, "
                              "does not know", r.stderr)
                self.assertIn("--forget-unknown-jobs", r.stderr)
        self.d.extra.append("--forget-unknown-jobs")
        self.d.start()
        new = self.run_job("new")
        self.assertEqual(new, old[1] + 1)
        self.assertEqual(self.d.ok("logs", str(new)), "I am new\n")
        with open(os.path.join(self.d.state, "jobs", str(old[0]), "attempt-1", "rank-0.log")) as f:
            self.assertEqual(f.read(), "I am old-1\n")  # left as it was
        self.assertIn("was forgotten", self.d.run("show", str(old[0])).stderr)
        # Once recorded, the flag is not needed again.
        self.d.extra.remove("--forget-unknown-jobs")
        self.d.stop()
        self.d.start()
        self.assertEqual(self.run_job("newer"), new + 1)

    def test_an_older_copy_of_the_store_put_back_is_refused(self):
        self.run_job("kept")
        self.d.stop()  # a clean stop leaves the whole database in gpuq.db
        backup = self.tmp_path("gpuq.db.bak")
        with open(self.db_files()[0], "rb") as f, open(backup, "wb") as out:
            out.write(f.read())
        self.d.start()
        later = [self.run_job("later-1"), self.run_job("later-2")]
        self.d.stop()
        for f in self.db_files():
            if os.path.exists(f):
                os.unlink(f)
        os.rename(backup, self.db_files()[0])
        r = self.start_refused()
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(f"(jobs/{later[0]} to jobs/{later[1]}) that its store, gpuq.db, does not know", r.stderr)


class VisibleDevices(unittest.TestCase):
    def test_the_daemon_hands_out_only_the_gpus_in_its_cuda_visible_devices(self):
        import tempfile
        tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        d = Daemon(tmp, "fake:4").start(env=dict(os.environ, CUDA_VISIBLE_DEVICES="3,1"))
        try:
            self.assertEqual([g["index"] for g in d.json("gpus")["gpus"]], [3, 1])
            ids = d.submit([{"name": f"g{i}", "gpus": 1, "shell": 'echo "$CUDA_VISIBLE_DEVICES"; sleep 0.5'}
                            for i in range(2)])["ids"]
            d.wait(ids)
            self.assertEqual(sorted(d.ok("logs", str(i)).strip() for i in ids), ["1", "3"])
        finally:
            d.stop()


class OneDaemon(DaemonTest):
    def test_a_second_daemon_on_the_same_socket_is_refused(self):
        other = Daemon(self.tmp, "fake:1")
        other.state = self.tmp_path("other-state")
        r = subprocess.run([os.path.join(BIN, "gpuqd"), "--foreground", "--socket", self.d.socket, "--state-dir",
                            other.state, "--gpus", "fake:1"], capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 1)
        self.assertIn("another gpuqd is already serving", r.stderr)
        self.d.ok("status")  # the first one is unharmed

    def test_a_second_daemon_on_the_same_state_dir_is_refused(self):
        r = subprocess.run([os.path.join(BIN, "gpuqd"), "--foreground", "--socket", self.tmp_path("s2"),
                            "--state-dir", self.d.state], capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 1)
        self.assertIn("another gpuqd is using the state dir", r.stderr)

    def test_a_stale_socket_file_is_replaced(self):
        self.d.kill9()
        self.assertTrue(os.path.exists(self.d.socket))
        self.d.start()
        self.d.ok("status")

    def test_socket_and_state_dir_are_private(self):
        self.assertEqual(stat.S_IMODE(os.stat(self.d.socket).st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(self.d.socket)).st_mode) & 0o077, 0)
        self.assertEqual(stat.S_IMODE(os.stat(self.d.state).st_mode), 0o700)

    def test_daemon_start_and_stop_through_the_cli(self):
        sock = self.tmp_path("cli.sock")
        env = dict(os.environ, GPUQ_SOCKET=sock)
        gpuq = os.path.join(BIN, "gpuq")
        r = subprocess.run([gpuq, "daemon", "start", "--state-dir", self.tmp_path("cli-state"), "--gpus", "fake:2"],
                           env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        st = json.loads(subprocess.run([gpuq, "daemon", "status", "--json"], env=env, capture_output=True,
                                       text=True).stdout)
        self.assertTrue(st["running"])
        r = subprocess.run([gpuq, "daemon", "stop"], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(subprocess.run([gpuq, "daemon", "status"], env=env, capture_output=True).returncode, 3)



class SupervisorServer(DaemonTest):
    """Each attempt's supervisor is forked by one `gpuq-shim --serve`, gpuqd's child, instead of an
    exec of gpuq-shim per attempt: the supervisor is the same (a session of its own, named by its
    launch document, which is how a restarted gpuqd knows it), and neither the server's end nor
    gpuqd's touches it."""
    GPUS = "fake:2"

    def gated_job(self, name):
        release = self.tmp_path(f"release-{name}")
        job = self.d.submit({"name": name, "gpus": 1, "shell": f"while [ ! -e {release} ]; do sleep 0.02; done"})["ids"][0]
        wait_until(lambda: self.d.show(job)["job"]["state"] == "running", what=f"job {name} to run")
        attempt = os.path.join(self.d.state, "jobs", str(job), "attempt-1")
        wait_until(lambda: os.path.exists(f"{attempt}/shim.pid"), what="its supervisor's pid file")
        with open(f"{attempt}/shim.pid") as f:
            return job, json.load(f)["pid"], attempt, release

    def server_of(self, supervisor):
        server, _ = stat_fields(supervisor)
        self.assertEqual(cmdline(server), ["gpuq-shim", "--serve"], "the supervisor's parent is not the server")
        self.assertEqual(stat_fields(server)[0], self.d.proc.pid, "the server is not gpuqd's child")
        return server

    def test_a_forked_supervisor_is_named_by_its_attempt_outlives_the_server_and_is_adopted_again(self):
        job, supervisor, attempt, release = self.gated_job("a")
        self.assertEqual(cmdline(supervisor), ["gpuq-shim", f"{attempt}/launch.json"])
        self.assertEqual(stat_fields(supervisor)[1], supervisor, "the supervisor has no session of its own")
        with open(f"/proc/{supervisor}/environ", "rb") as f:
            names = {v.split(b"=", 1)[0] for v in f.read().split(b"\0") if v}
        self.assertLessEqual(names, {b"PATH", b"ASAN_OPTIONS", b"LSAN_OPTIONS", b"UBSAN_OPTIONS"},
                             "the supervisor holds gpuqd's environment")
        server = self.server_of(supervisor)
        self.d.kill9()
        wait_until(lambda: not alive(server), what="the server to end with gpuqd")
        self.assertTrue(alive(supervisor), "the supervisor died with the server")
        self.d.start()
        self.assertEqual(self.d.show(job)["job"]["state"], "running")
        self.assertIn(f"re-adopted job {job} (supervisor pid {supervisor})", pathlib.Path(self.tmp_path("gpuqd.log")).read_text())
        open(release, "w").close()
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")

    def test_a_server_that_dies_harms_no_running_job_and_the_next_start_gets_a_new_one(self):
        job, supervisor, _, release = self.gated_job("b")
        server = self.server_of(supervisor)
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: not alive(server), what="the server to die")
        after, next_supervisor, _, next_release = self.gated_job("c")
        self.assertNotEqual(self.server_of(next_supervisor), server)
        self.assertNotIn("starting supervisors one exec each", pathlib.Path(self.tmp_path("gpuqd.log")).read_text())
        open(release, "w").close()
        open(next_release, "w").close()
        done = self.d.wait([job, after])
        self.assertEqual([done[job]["state"], done[after]["state"]], ["succeeded", "succeeded"])


if __name__ == "__main__":
    unittest.main()
