"""Supervision the kernel enforces (docs/reliability.md): each attempt's processes run in a cgroup
of their own, which gpuqd kills, and finds empty, before the attempt is recorded as ended and its
GPUs are given to another job. A job that kills its own supervisor, leaving `setsid` children
behind, keeps nothing running, whether gpuqd saw it happen or was down at the time."""
import os
import unittest

from harness import DaemonTest, alive, pids_matching, wait_until


def read_pid(path):
    with open(path) as f:
        return int(f.read().strip())


class AttemptCgroups(DaemonTest):
    def setUp(self):
        super().setUp()
        self.base = self.d.cgroups
        if not self.base:
            self.skipTest("this host gives gpuqd no cgroup to make attempts' cgroups under (see gpuqd.log)")

    def escaping_job(self, name, go=None):
        """A job that leaves a `setsid` child (its pid in <name>.pid), then SIGKILLs its supervisor
        (its parent) once `go` exists (at once without one), and waits."""
        pid_file = self.tmp_path(f"{name}.pid")
        wait = f"while [ ! -e {go} ]; do sleep 0.02; done; " if go else ""
        shell = (f"setsid sh -c 'echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; exec sleep 1000' & "
                 f"while [ ! -e {pid_file} ]; do sleep 0.02; done; {wait}kill -9 $PPID; exec sleep 1000")
        return {"name": name, "gpus": 4, "shell": shell, "retries": 0}, pid_file

    def test_gpus_says_what_holds_each_jobs_processes(self):
        self.assertEqual(self.d.json("gpus")["containment"], f"a cgroup per attempt, under cgroup {self.base_kind()} at {self.base}"
                         + (" (cgroup.kill)" if os.path.exists(os.path.join(self.base, "cgroup.kill")) else ""))
        self.assertIn(f"each job's processes held by a cgroup per attempt, under cgroup", self.d.ok("gpus"))

    def base_kind(self):
        return "v2" if os.path.exists(os.path.join(self.base, "cgroup.controllers")) else "v1"

    def test_a_job_that_kills_its_supervisor_keeps_nothing_running_and_its_gpus_wait_for_that(self):
        job, pid_file = self.escaping_job("escape")
        follower = {"name": "next", "gpus": 4, "shell": "true"}
        ids = self.d.submit([job, follower])["ids"]
        done = self.d.wait(ids[:1], timeout=60)[ids[0]]
        self.assertEqual(done["state"], "failed")
        self.assertIn("supervisor ended without recording an outcome", done["reason"])
        # Recorded as ended only once nothing of it was left: its setsid child is dead by now.
        self.assertFalse(alive(read_pid(pid_file)), "the job's setsid child outlived its attempt")
        self.assertEqual(self.d.wait(ids[1:], timeout=60)[ids[1]]["state"], "succeeded")
        # Each attempt's cgroup is gone once it ended.
        self.assertEqual([e for e in os.listdir(self.base) if "-attempt-" in e], [])

    def test_processes_left_by_a_supervisor_killed_while_gpuqd_was_down_are_killed_when_it_is_back(self):
        go = self.tmp_path("go")
        job, pid_file = self.escaping_job("escape", go=go)
        job_id = self.d.submit([job])["ids"][0]
        wait_until(lambda: os.path.exists(pid_file), what="the job's setsid child")
        self.d.kill9()
        open(go, "w").close()
        cgroup = os.path.join(self.base, f"{job_id}-attempt-1")
        # The supervisor dies (the job killed it); the setsid child lives on, with no one to kill it.
        wait_until(lambda: not pids_matching(f"gpuq-shim {self.tmp}/"), timeout=30, what="the supervisor to die")
        self.assertTrue(alive(read_pid(pid_file)))
        self.d.start()
        done = self.d.wait([job_id], timeout=60)[job_id]
        self.assertEqual(done["state"], "failed")
        self.assertFalse(alive(read_pid(pid_file)), "the job's setsid child outlived gpuqd's restart")
        self.assertFalse(os.path.exists(cgroup))

    def test_a_job_that_also_removes_its_supervisors_pid_file_is_killed_before_it_runs_again(self):
        # Without a pid file gpuqd takes the attempt for one that never started and runs it again;
        # what the first run left in the cgroup must be gone before the second begins.
        go, first, verdict = self.tmp_path("go"), self.tmp_path("first.pid"), self.tmp_path("verdict")
        shell = (f"if [ -e {first} ]; then "  # the second run: is the first one's child still there?
                 f"  state=$(cut -d' ' -f3 /proc/$(cat {first})/stat 2>/dev/null); "
                 f"  echo \"${{state:-gone}}\" > {verdict}; exit 0; fi; "
                 f"setsid sh -c 'echo $$ > {first}.tmp && mv {first}.tmp {first}; exec sleep 1000' & "
                 f"while [ ! -e {first} ] || [ ! -e {go} ]; do sleep 0.02; done; "
                 f"rm -f \"$(dirname \"$GPUQ_EVENTS\")/shim.pid\"; kill -9 $PPID; exec sleep 1000")
        job_id = self.d.submit([{"name": "tamper", "shell": shell, "retries": 0}])["ids"][0]
        wait_until(lambda: os.path.exists(first), what="the job's setsid child")
        self.d.kill9()
        open(go, "w").close()
        wait_until(lambda: not pids_matching(f"gpuq-shim {self.tmp}/"), timeout=30, what="the supervisor to die")
        self.assertTrue(alive(read_pid(first)))
        self.d.start()
        done = self.d.wait([job_id], timeout=60)[job_id]
        self.assertEqual(done["state"], "succeeded", done["reason"])  # the second run
        with open(verdict) as f:
            self.assertIn(f.read().strip(), ("gone", "Z"), "the first run's child lived on into the second")
        self.assertFalse(alive(read_pid(first)))

    def test_a_job_that_stops_its_supervisor_is_still_timed_out_and_cancelled_and_leaves_nothing(self):
        # In single-user mode the job shares its supervisor's uid and may SIGSTOP it, so that the
        # supervisor enforces nothing: gpuqd kills a supervisor that has not ended its attempt a
        # grace period and k_overdue_s after the attempt's timeout or a stop, and the cgroup with it.
        def stopper(name, **spec):
            child = self.tmp_path(f"{name}.pid")
            shell = (f"setsid sh -c 'echo $$ > {child}.tmp && mv {child}.tmp {child}; exec sleep 1000' & "
                     f"while [ ! -e {child} ]; do sleep 0.02; done; kill -STOP $PPID; touch {child}.stopped; "
                     f"exec sleep 1000")
            return {"name": name, "shell": shell, "retries": 0, **spec}, child
        # Its timeout leaves the job time to stop its supervisor first, however loaded the machine.
        timing_out, child_t = stopper("times-out", timeout_s=20)
        cancelled, child_c = stopper("cancelled")
        ids = self.d.submit([timing_out, cancelled])["ids"]
        wait_until(lambda: os.path.exists(f"{child_c}.stopped"), timeout=60, what="the job to stop its supervisor")
        self.d.ok("cancel", str(ids[1]))
        done = self.d.wait(ids, timeout=90)
        self.assertEqual(done[ids[0]]["state"], "timed_out", done[ids[0]]["reason"])
        self.assertEqual(done[ids[1]]["state"], "cancelled", done[ids[1]]["reason"])
        for child in (child_t, child_c):
            self.assertTrue(os.path.exists(f"{child}.stopped"), "the job did not get to stop its supervisor")
            self.assertFalse(alive(read_pid(child)), "the job's setsid child outlived its attempt")
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            log = f.read()
        self.assertRegex(log, rf"job {ids[0]}: its supervisor \(pid \d+, stopped\) has not ended it [\d.]+ s after its timeout;")
        self.assertRegex(log, rf"job {ids[1]}: its supervisor \(pid \d+, stopped\) has not ended it [\d.]+ s after its stop;")


if __name__ == "__main__":
    unittest.main()
