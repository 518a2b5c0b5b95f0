"""Supervision the kernel enforces (docs/reliability.md): each attempt's processes run in a cgroup
of their own, which gpuqd kills, and finds empty, before the attempt is recorded as ended and its
GPUs are given to another job. A job that kills its own supervisor, leaving `setsid` children
behind, keeps nothing running, whether gpuqd saw it happen or was down at the time."""
import errno
import os
import re
import stat
import subprocess
import tempfile
import unittest

from harness import BIN, Daemon, DaemonTest, alive, pids_matching, wait_until


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
        said = self.d.json("gpus")["containment"]
        self.assertTrue(said.startswith(f"a cgroup per attempt, under cgroup {self.base_kind()} at {self.base}"
                                        + (" (cgroup.kill)" if os.path.exists(os.path.join(self.base, "cgroup.kill")) else "")
                                        + "; limits in force: "), said)
        # Each limit, in force or not (and why not).
        for limit in ("memory per rank", "processes per attempt", "each rank's cores", "the GPUs given"):
            self.assertIn(limit, said)
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
        # Each attempt's cgroup is gone once it ended, in every hierarchy.
        for base in [self.base, *self.d.limit_cgroups]:
            self.assertEqual([e for e in os.listdir(base) if "-attempt-" in e], [], base)

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


class KernelLimits(DaemonTest):
    """Limits the kernel holds each attempt to, through the controllers gpuqd was given (v2 where
    its cgroup has them, else v1): memory per rank, processes per attempt, each rank's cores, and
    the GPUs' device nodes it was not given. Each test runs where its controller is in force."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.d = Daemon(self.tmp, self.GPUS, extra=["--pids-per-attempt", "40"]).start()
        self.containment = self.d.json("gpus")["containment"]

    def need(self, limit):
        if not re.search(re.escape(limit) + r" \((v2|v1 at [^)]+)\)", self.containment):
            self.skipTest(f"{limit}: not in force here ({self.containment})")

    def run_job(self, spec):
        job_id = self.d.submit([{"retries": 0, **spec}])["ids"][0]
        return job_id, self.d.wait([job_id], timeout=90)[job_id]

    def test_a_rank_over_its_memory_is_killed_and_one_within_it_runs(self):
        self.need("memory per rank")
        grow = "import sys; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); print('held')"
        _, over = self.run_job({"name": "over", "command": ["python3", "-c", grow, "256"], "memory_mb": 64})
        self.assertEqual(over["state"], "out_of_memory", over["reason"])
        self.assertIn("signal 9", over["reason"])
        _, within = self.run_job({"name": "within", "command": ["python3", "-c", grow, "16"], "memory_mb": 64})
        self.assertEqual(within["state"], "succeeded", within["reason"])

    def test_a_fork_bomb_ends_at_the_attempts_process_limit(self):
        self.need("processes per attempt")
        out = self.tmp_path("forks")
        bomb = ("import os, sys, time\n"
                "n = 0\n"
                "try:\n"
                "    while n < 200:\n"
                "        if os.fork() == 0:\n"
                "            time.sleep(60); os._exit(0)\n"
                "        n += 1\n"
                "except OSError as e:\n"
                "    print(n, e.errno, file=open(sys.argv[1], 'w')); sys.exit(3)\n"
                "print(n, 0, file=open(sys.argv[1], 'w'))\n")
        _, done = self.run_job({"name": "bomb", "command": ["python3", "-c", bomb, out], "timeout_s": 60})
        self.assertEqual(done["state"], "failed", done["reason"])
        with open(out) as f:
            forked, err = map(int, f.read().split())
        self.assertEqual(err, errno.EAGAIN)
        self.assertLess(forked, 40)  # --pids-per-attempt 40: the rank itself and its forks

    def test_a_rank_cannot_leave_its_cores(self):
        self.need("each rank's cores")
        out = self.tmp_path("cores")
        grab = ("import os, sys\n"
                "mine = sorted(os.sched_getaffinity(0))\n"
                "try:\n"
                "    os.sched_setaffinity(0, range(os.cpu_count()))\n"
                "except OSError:\n"
                "    pass\n"
                "print(mine, sorted(os.sched_getaffinity(0)), file=open(sys.argv[1], 'w'))\n")
        _, done = self.run_job({"name": "grab", "command": ["python3", "-c", grab, out], "cpus": 1})
        self.assertEqual(done["state"], "succeeded", done["reason"])
        with open(out) as f:
            pinned, after = f.read().split("] [")
        self.assertEqual(pinned + "]", "[" + after.strip().rstrip("]").lstrip("[") + "]",
                         "the rank took cores it was not given")

    def test_an_unpinned_rank_cannot_leave_the_cores_gpuqd_may_use(self):
        self.need("each rank's cores")
        if len(os.sched_getaffinity(0)) < 2:
            self.skipTest("needs two cores: gpuqd on one, the job trying the other")
        core = min(os.sched_getaffinity(0))
        self.d.stop()
        self.d.start(cpus={core})  # as under taskset: gpuqd may use one core, its cgroup allows more
        out = self.tmp_path("unpinned")
        grab = ("import os, sys\n"
                "try:\n"
                "    os.sched_setaffinity(0, range(os.cpu_count()))\n"
                "except OSError:\n"
                "    pass\n"
                "print(sorted(os.sched_getaffinity(0)), file=open(sys.argv[1], 'w'))\n")
        for i in range(2):  # the second shares the first's cpuset where unpinned attempts share one
            _, done = self.run_job({"name": f"unpinned{i}", "command": ["python3", "-c", grab, out]})
            self.assertEqual(done["state"], "succeeded", done["reason"])
            with open(out) as f:
                self.assertEqual(f.read().strip(), str([core]), "an unpinned rank took cores gpuqd may not use")

    def test_a_job_cannot_open_the_device_nodes_of_gpus_it_was_not_given(self):
        self.need("the GPUs given")
        # NVIDIA's major is 195, minor N is /dev/nvidiaN (a fake GPU's minor is its index). Opening
        # one the job may use says ENXIO with no driver for 195, and opens on a GPU machine (whose
        # GPU 0 has a driver); one it may not, EPERM.
        nodes = self.tmp_path("dev")
        os.mkdir(nodes)
        for minor in range(4):
            try:
                os.mknod(os.path.join(nodes, f"nvidia{minor}"), 0o666 | stat.S_IFCHR, os.makedev(195, minor))
            except PermissionError:
                self.skipTest("cannot make device nodes here (mknod needs CAP_MKNOD)")
        probe = ("import os, sys\n"
                 "seen = {}\n"
                 "for m in range(4):\n"
                 "    try:\n"
                 "        os.close(os.open(os.path.join(sys.argv[1], f'nvidia{m}'), os.O_RDWR)); seen[m] = 0\n"
                 "    except OSError as e:\n"
                 "        seen[m] = e.errno\n"
                 "print(os.environ.get('CUDA_VISIBLE_DEVICES', ''), seen, file=open(sys.argv[2], 'w'))\n")
        # The second one-GPU job is given GPU 0 again: the program that refuses the others, loaded
        # for the first, is attached to its cgroup too.
        for i, gpus in enumerate((1, 2, 0, 1)):
            out = self.tmp_path(f"devices-{i}")
            _, done = self.run_job({"name": f"probe{i}", "command": ["python3", "-c", probe, nodes, out], "gpus": gpus})
            self.assertEqual(done["state"], "succeeded", done["reason"])
            with open(out) as f:
                visible, seen = f.read().split(" ", 1)
            mine = {int(g) for g in visible.split(",") if g}
            self.assertEqual(len(mine), gpus)
            seen = eval(seen)  # a dict the probe printed
            for minor, err in seen.items():
                if minor in mine:
                    self.assertIn(err, (0, errno.ENXIO, errno.ENODEV), f"GPU {minor} is the job's: {seen}")
                else:
                    self.assertEqual(err, errno.EPERM, f"GPU {minor} is not the job's ({visible}): {seen}")


def v2_mount():
    """Where this process's cgroup v2 hierarchy is mounted (its root in it), or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            if fields[dash + 1] == "cgroup2" and fields[3] == "/":
                return fields[4]
    return None


class CgroupParent(DaemonTest):
    """`--cgroup-parent DIR`: attempts' cgroups under a cgroup v2 directory of the admin's instead of
    below gpuqd's own, which cannot hand controllers down while processes are in it (gpuqd's; a
    container's others), and which a restart of gpuqd's service must find as it left it."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.d = Daemon(self.tmp, self.GPUS)  # started by each test

    def refused(self, parent):
        """gpuqd's start with `--cgroup-parent parent`: its exit status and what it said."""
        r = subprocess.run([os.path.join(BIN, "gpuqd"), "--foreground", "--socket", self.d.socket,
                            "--state-dir", self.d.state, "--gpus", "fake:1", "--cgroup-parent", parent],
                           capture_output=True, text=True, timeout=60)
        self.assertFalse(os.path.exists(self.d.socket), "gpuqd must not have started")
        return r.returncode, r.stderr

    def v2_dir(self, name):
        """A fresh cgroup v2 directory below the hierarchy's root, removed after the test."""
        mount = v2_mount()
        if not mount:
            self.skipTest("no cgroup v2 hierarchy mounted at its root here")
        path = os.path.join(mount, f"gpuq-it-{name}-{os.getpid()}")
        try:
            os.mkdir(path)
        except OSError as e:
            self.skipTest(f"cannot make a cgroup v2 directory here: {e}")
        self.addCleanup(lambda: os.path.isdir(path) and os.rmdir(path))
        return mount, path

    def test_a_parent_that_is_no_cgroup_v2_directory_stops_gpuqd_at_start_naming_it(self):
        for parent in (self.tmp, "relative/dir", self.tmp_path("missing/gpuq-no-such-dir")):
            status, said = self.refused(parent)
            self.assertNotEqual(status, 0, parent)
            self.assertRegex(said, r"(cgroup_parent|--cgroup-parent)[^\n]*" + re.escape(parent), said)

    def test_a_parent_others_may_write_or_with_processes_in_it_is_refused(self):
        _, parent = self.v2_dir("open")
        os.chmod(parent, 0o777)
        status, said = self.refused(parent)
        self.assertNotEqual(status, 0)
        self.assertIn(f"cgroup_parent {parent}: owned by uid {os.geteuid()} with mode 511: it must be gpuqd's", said)
        os.chmod(parent, 0o755)
        sleeper = subprocess.Popen(["sleep", "60"])
        self.addCleanup(lambda: (sleeper.kill(), sleeper.wait()))
        with open(os.path.join(parent, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        status, said = self.refused(parent)
        self.assertNotEqual(status, 0)
        self.assertIn(f"cgroup_parent {parent}: has processes in it", said)
        sleeper.kill()
        sleeper.wait()
        def procs():
            with open(os.path.join(parent, "cgroup.procs")) as f:
                return f.read().strip()
        wait_until(lambda: not procs(), what="the sleeper to go")

    def held_job(self, name):
        """A job that records its cgroup, leaves a `setsid` child (its pid in <name>.pid) and waits
        for <name>.go."""
        where, pid_file, go = self.tmp_path(f"{name}.cgroup"), self.tmp_path(f"{name}.pid"), self.tmp_path(f"{name}.go")
        shell = (f"cat /proc/self/cgroup > {where}.tmp && mv {where}.tmp {where}; "
                 f"setsid sh -c 'echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; exec sleep 1000' & "
                 f"while [ ! -e {go} ]; do sleep 0.05; done")
        job = self.d.submit([{"name": name, "retries": 0, "shell": shell}])["ids"][0]
        wait_until(lambda: os.path.exists(where) and os.path.exists(pid_file), what="the job to start")
        with open(where) as f:
            v2 = next(line.strip().split(":", 2)[2] for line in f if line.startswith("0::"))
        return job, v2, read_pid(pid_file)

    def test_attempts_run_under_the_parent_and_a_restarted_gpuqd_kills_them_there(self):
        mount, parent = self.v2_dir("parent")
        self.d.extra = ["--cgroup-parent", parent]
        self.d.start()
        self.assertIsNotNone(self.d.cgroups, "gpuqd made no cgroup for its attempts")
        self.assertTrue(self.d.cgroups.startswith(parent + "/gpuq-"), self.d.cgroups)
        # Every controller of a limit that the parent is given is handed down and in force on v2.
        containment = self.d.json("gpus")["containment"]
        with open(os.path.join(parent, "cgroup.controllers")) as f:
            given = f.read().split()
        for controller, limit in (("memory", "memory per rank"), ("pids", "processes per attempt"),
                                  ("cpuset", "each rank's cores")):
            if controller in given:
                self.assertIn(f"{limit} (v2)", containment)
        job, v2, child = self.held_job("held")
        self.assertTrue((mount.rstrip("/") + v2).startswith(self.d.cgroups + "/"), (v2, self.d.cgroups))
        # gpuqd killed and started again: the attempt is found in its cgroup under the same parent,
        # and cancelling it kills its `setsid` child there too.
        self.d.kill9()
        self.d.start()
        self.assertTrue(self.d.cgroups.startswith(parent + "/gpuq-"), self.d.cgroups)
        self.d.ok("cancel", str(job))
        self.assertEqual(self.d.wait([job], timeout=60)[job]["state"], "cancelled")
        wait_until(lambda: not alive(child), what="the job's setsid child to be killed")

    def test_the_packaged_jobs_cgroup_frees_its_units_cgroup_and_gpuqd_runs_attempts_below_it(self):
        # packaging/gpuq-jobs-cgroup, as gpuq-jobs.service runs it: started in a cgroup of its own
        # (the unit's), it moves itself into a leaf, hands down what it is given, makes `jobs`, and
        # says where in the file gpuqd-lab.service reads.
        mount, unit = self.v2_dir("unit")
        keeper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "packaging", "gpuq-jobs-cgroup")
        env_file = self.tmp_path("jobs-cgroup.env")
        p = subprocess.Popen(["sh", "-c", f'echo $$ > {unit}/cgroup.procs && exec "$0"', keeper],
                             env=dict(os.environ, GPUQ_JOBS_ENV=env_file), stderr=subprocess.PIPE, text=True)

        def stop_keeper():
            p.kill()
            p.wait()
            p.stderr.close()
            wait_until(lambda: not procs(os.path.join(unit, "keeper")), what="the keeper to go")
            for leaf in ("jobs", "keeper"):
                if os.path.isdir(os.path.join(unit, leaf)):
                    os.rmdir(os.path.join(unit, leaf))
        self.addCleanup(stop_keeper)

        def procs(cgroup):
            with open(os.path.join(cgroup, "cgroup.procs")) as f:
                return f.read().split()
        wait_until(lambda: os.path.exists(env_file) or p.poll() is not None, what="the keeper to say where")
        self.assertIsNone(p.poll(), p.stderr.read() if p.poll() is not None else "")
        with open(env_file) as f:
            self.assertEqual(f.read(), f"GPUQ_JOBS_ARGS=--cgroup-parent {unit}/jobs\n")
        self.assertIn(str(p.pid), procs(os.path.join(unit, "keeper")))
        self.assertEqual(procs(unit), [], "the unit's cgroup still holds a process: it can hand nothing down")
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(unit, "jobs")).st_mode), 0o755)
        with open(os.path.join(unit, "cgroup.controllers")) as f, open(os.path.join(unit, "jobs", "cgroup.controllers")) as g:
            given, handed = set(f.read().split()), set(g.read().split())
        self.assertLessEqual(given & {"memory", "pids", "cpuset"}, handed, "a controller given was not handed down")

        self.d.extra = ["--cgroup-parent", f"{unit}/jobs"]
        self.d.start()
        self.assertTrue(self.d.cgroups.startswith(f"{unit}/jobs/gpuq-"), self.d.cgroups)
        job, v2, child = self.held_job("kept")
        self.assertTrue((mount.rstrip("/") + v2).startswith(self.d.cgroups + "/"), (v2, self.d.cgroups))
        open(self.tmp_path("kept.go"), "w").close()
        self.assertEqual(self.d.wait([job], timeout=60)[job]["state"], "succeeded")
        wait_until(lambda: not alive(child), what="the job's setsid child to be killed at its end")
        self.d.stop()

    def test_no_start_while_attempts_run_where_gpuqd_no_longer_looks(self):
        _, parent = self.v2_dir("moved")
        self.d.extra = ["--cgroup-parent", parent]
        self.d.start()
        if not self.d.cgroups or not self.d.cgroups.startswith(parent):
            self.fail(f"no attempts' cgroup under {parent}: {self.d.cgroups}")
        job, _, child = self.held_job("moved")
        old_base = self.d.cgroups
        self.d.kill9()
        # Without the parent the attempt would not be found: its cgroup is elsewhere.
        self.d.extra = []
        with self.assertRaises(AssertionError):
            self.d.start()
        with open(self.tmp_path("gpuqd.log")) as f:
            self.assertIn(f"attempts of this state dir still run in {old_base}, where gpuqd put them before "
                          f"cgroup_parent changed", f.read())
        self.assertTrue(alive(child))
        # Back where they are: found, and ended by a cancel.
        self.d.extra = ["--cgroup-parent", parent]
        self.d.start()
        self.d.ok("cancel", str(job))
        self.assertEqual(self.d.wait([job], timeout=60)[job]["state"], "cancelled")
        wait_until(lambda: not alive(child), what="the job's setsid child to be killed")

if __name__ == "__main__":
    unittest.main()
