"""gpuq on a real Slurm (tests/slurm/start-slurm.sh: slurmctld and two slurmd on this machine, two
emulated nodes, auth/none, two fake GPUs each as GRES): what `gpuq export --slurm` writes is
submitted with sbatch and run by Slurm, ranks started by srun with the torchrun environment made
from Slurm's; and `gpuqd --executor slurm` hands each attempt to Slurm, ddp gangs across both
nodes, driven through the real gpuq."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import unittest

from harness import BIN, REPO, Daemon, wait_until
from test_preempt import history, stepper
from test_ddp import TORCH_PYTHON, have_torch
from test_worker import HAVE_WORKER, SYNTHETIC, WORKER, load, max_diff

START = os.path.join(REPO, "tests/slurm/start-slurm.sh")
HAVE_SLURM = shutil.which("slurmctld") and os.geteuid() == 0
NEEDS = "needs Debian's slurm-wlm and root (slurmd); CI installs it"
SLURM_DIR = None


def setUpModule():
    """One Slurm for the module's tests (its start takes seconds)."""
    global SLURM_DIR
    if not HAVE_SLURM:
        return
    SLURM_DIR = tempfile.mkdtemp(prefix="gpuq-slurm-")
    # PREEMPT: partition "urgent" preempts the default one (SlurmPreemption)
    r = subprocess.run([START, os.path.join(SLURM_DIR, "slurm")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, NODES="2", PREEMPT="1"))
    if r.returncode != 0:
        raise AssertionError(f"Slurm did not start: {r.stderr}")
    os.environ["SLURM_CONF"] = r.stdout.strip()  # for gpuqd, gpuq's jobs and the tests' own squeue


def tearDownModule():
    if SLURM_DIR:
        subprocess.run([START, "--stop", os.path.join(SLURM_DIR, "slurm")])
        shutil.rmtree(SLURM_DIR, ignore_errors=True)


def squeue():
    """The Slurm ids still queued or running (an array's tasks each on its own)."""
    r = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=60, check=True)
    return r.stdout.split()


@unittest.skipUnless(HAVE_SLURM, NEEDS)
class SlurmExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=SLURM_DIR)
        cls.env = dict(os.environ)

    def gpuq(self, *args, input=None, cwd=None):
        r = subprocess.run([os.path.join(BIN, "gpuq"), *args], input=input, capture_output=True, text=True,
                           cwd=cwd, env=self.env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def slurm(self, *argv, cwd=None):
        r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=self.env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def finished(self, *ids):
        """Waits until Slurm has none of `ids` queued or running; returns each one's JobState."""
        wait_until(lambda: not self.slurm("squeue", "-h", "-j", ",".join(ids)).strip(), timeout=120,
                   interval=0.2, what=f"Slurm jobs {ids} to end")
        states = {}
        for i in ids:
            fields = dict(f.split("=", 1) for f in self.slurm("scontrol", "-o", "show", "job", i).split() if "=" in f)
            states[i] = fields["JobState"]
        return states

    def test_a_ddp_job_runs_its_ranks_under_srun_with_torchrun_variables(self):
        work = tempfile.mkdtemp(dir=self.dir)
        probe = ["/bin/sh", "-c", 'env > "$PROBE_DIR/rank-$RANK.env"']
        spec = {"name": "probe", "command": probe, "mode": "ddp", "gpus": 2, "env": {"PROBE_DIR": work},
                "timeout_s": 600}
        script = self.gpuq("export", "--slurm", "-", input=json.dumps(spec), cwd=work)
        self.assertIn("#SBATCH --gpus-per-node=2\n", script)
        with open(os.path.join(work, "probe.sbatch"), "w") as f:
            f.write(script)
        job = self.slurm("sbatch", "--parsable", "probe.sbatch", cwd=work).strip().split(";")[0]
        self.assertEqual(self.finished(job), {job: "COMPLETED"})
        ranks = {}
        for r in (0, 1):
            with open(os.path.join(work, f"rank-{r}.env")) as f:
                ranks[r] = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        for r, env in ranks.items():
            self.assertEqual(env["SLURM_JOB_ID"], job)  # it really ran under Slurm
            self.assertEqual((env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]), (str(r), str(r), "0"))
            self.assertEqual((env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]), ("2", "2", "1"))
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")  # the first node's NodeAddr
            self.assertEqual(env["MASTER_PORT"], str(10000 + int(job) % 20000))
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "False")
            self.assertEqual(env["CUDA_VISIBLE_DEVICES"], "0,1")  # Slurm's GRES: the node's two GPUs
            self.assertEqual(env["GPUQ_JOB_NAME"], "probe")
            self.assertTrue(env["GPUQ_EVENTS"].endswith(f"/slurm-{job}/events-{r}.jsonl"), env["GPUQ_EVENTS"])
            self.assertEqual(env["PROBE_DIR"], work)
            self.assertNotIn("GPUQ_BIN_DIR", env)  # the submitting shell's environment stays behind
        self.assertTrue(os.path.isdir(os.path.join(work, "gpuq-probe", "checkpoints")))

    def test_a_batch_becomes_scripts_and_a_submit_script_whose_dependencies_slurm_holds(self):
        work = tempfile.mkdtemp(dir=self.dir)
        batch = [{"name": "second", "shell": f"test -f {work}/first.done && touch {work}/second.done",
                  "after": ["first"]},
                 {"name": "first", "shell": f"touch {work}/first.done"}]
        r = subprocess.run([os.path.join(BIN, "gpuq"), "export", "--slurm", "-"], input=json.dumps(batch),
                           capture_output=True, text=True, cwd=work, env=self.env, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("give -o DIR", r.stderr)
        out = os.path.join(work, "scripts")
        self.gpuq("export", "--slurm", "-", "-o", out, input=json.dumps(batch), cwd=work)
        self.assertEqual(sorted(os.listdir(out)), ["000-second.sbatch", "001-first.sbatch", "submit.sh"])
        said = self.slurm(os.path.join(out, "submit.sh"))
        ids = {line.split(":")[0]: line.rsplit(" ", 1)[1] for line in said.splitlines()}
        self.assertEqual(list(ids), ["001-first.sbatch", "000-second.sbatch"])  # dependencies first
        first, second = ids["001-first.sbatch"], ids["000-second.sbatch"]
        self.assertEqual(self.finished(first, second), {first: "COMPLETED", second: "COMPLETED"})
        self.assertTrue(os.path.exists(os.path.join(work, "second.done")))


    def test_an_exported_script_runs_in_a_working_directory_that_cannot_be_an_sbatch_line(self):
        for name in ("my project", "x --partition=nonesuch", "a#b"):
            with self.subTest(cwd=name):
                work = os.path.join(tempfile.mkdtemp(dir=self.dir), name)
                os.mkdir(work)
                spec = {"name": "where", "shell": "pwd > here.txt"}
                script = self.gpuq("export", "--slurm", "-", input=json.dumps(spec), cwd=work)
                self.assertNotIn("#SBATCH --chdir", script)
                path = os.path.join(os.path.dirname(work), "where.sbatch")
                with open(path, "w") as f:
                    f.write(script)
                job = self.slurm("sbatch", "--parsable", path, cwd=os.path.dirname(work)).strip().split(";")[0]
                self.assertEqual(self.finished(job), {job: "COMPLETED"})
                with open(os.path.join(work, "here.txt")) as f:
                    self.assertEqual(f.read(), work + "\n")


class SlurmTask(unittest.TestCase):
    """gpuq-shim --slurm-task on its own, as srun starts it (no Slurm needed)."""

    def run_task(self, adir, stop_first):
        marker = os.path.join(adir, "RAN")
        doc = {"job_id": 1, "attempt": 1, "timeout_s": 0, "grace_s": 1, "log_limit_bytes": 0,
               "ranks": [{"rank": 0, "argv": ["/bin/sh", "-c", f"touch {marker}"], "env": {"PATH": "/usr/bin:/bin"},
                          "cwd": adir, "log": os.path.join(adir, "rank-0.log")}],
               "pid_file": os.path.join(adir, "shim.pid"), "exit_file": os.path.join(adir, "exit.json")}
        with open(os.path.join(adir, "launch.json"), "w") as f:
            json.dump(doc, f)
        if stop_first:
            with open(os.path.join(adir, "stop"), "w") as f:
                f.write("gpuq cancel\n")
        r = subprocess.run([os.path.join(BIN, "gpuq-shim"), os.path.join(adir, "launch.json"), "--slurm-task"],
                           env=dict(os.environ, SLURM_PROCID="0"), capture_output=True, text=True, timeout=60)
        with open(os.path.join(adir, "exit-0.json")) as f:
            return r.returncode, os.path.exists(marker), json.load(f)

    def test_a_stop_sent_before_the_supervisor_caught_signals_is_found_in_the_attempt_directory(self):
        # gpuqd writes `stop` before it sends SIGURG, which a supervisor not yet catching it loses
        # (its default is to be ignored): one that starts then finds the file and runs nothing.
        tmp = tempfile.mkdtemp(prefix="gpuq-task-")
        self.addCleanup(shutil.rmtree, tmp, True)
        for stop_first in (False, True):
            adir = os.path.join(tmp, f"stop-{stop_first}")
            os.mkdir(adir)
            code, ran, record = self.run_task(adir, stop_first)
            self.assertEqual(code, 0)  # a stopped task's supervisor ends 0: srun tears nothing down
            self.assertEqual(ran, not stop_first)
            self.assertEqual(record["cancelled"], stop_first)


@unittest.skipUnless(HAVE_SLURM, NEEDS)
class SlurmExecutor(unittest.TestCase):
    """gpuqd --executor slurm on the 2-GPU node: gpuq's commands, Slurm's placement."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(dir=SLURM_DIR)
        self.d = Daemon(self.tmp, gpus="none", extra=["--executor", "slurm", "--slurm-poll", "0.2"]).start()

    def tearDown(self):
        self.d.stop()
        subprocess.run(["scancel", "-u", str(os.getuid())], timeout=60)  # nothing left for the next test
        wait_until(lambda: not squeue(), timeout=60, interval=0.2, what="Slurm's queue to empty")

    def test_gpuqd_makes_no_cgroup_of_its_own_for_jobs_that_slurm_contains(self):
        # Cgroups::open records the base it made in the state dir; under Slurm nothing would remove
        # it (one left in the hierarchy's root for every state dir gpuqd ever ran on).
        self.assertFalse(os.path.exists(os.path.join(self.d.state, "cgroup-base")))
        self.assertNotIn("each attempt runs in a cgroup of its own", pathlib.Path(self.tmp, "gpuqd.log").read_text())

    def test_one_gpu_jobs_run_under_slurm_four_at_a_time_on_two_nodes_each_with_its_own_gpu(self):
        marks = os.path.join(self.tmp, "marks")
        os.mkdir(marks)
        # Slurm's name for the job: an array task's is ARRAY_TASK (the ten go as one array)
        probe = ('id=$SLURM_JOB_ID; [ -z "$SLURM_ARRAY_JOB_ID" ] || id=${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID; '
                 f'echo "$id $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $(date +%s.%N)" > {marks}/$GPUQ_JOB_ID.start; '
                 f'sleep 0.5; date +%s.%N > {marks}/$GPUQ_JOB_ID.end')
        ids = self.d.submit([{"name": f"one-{i}", "shell": probe, "gpus": 1} for i in range(10)])["ids"]
        # While Slurm holds them, status says where each stands there
        wait_until(lambda: any("Slurm job" in j["reason"] for j in self.d.json("status")["jobs"]), timeout=60,
                   what="a job's Slurm id in status")
        done = self.d.wait(ids, timeout=300)
        self.assertEqual({i: done[i]["state"] for i in ids}, {i: "succeeded" for i in ids})
        spans, slurm_ids, nodes = [], set(), set()
        for i in ids:
            with open(f"{marks}/{i}.start") as f:
                slurm_id, node, devices, start = f.read().split()
            with open(f"{marks}/{i}.end") as f:
                spans.append((float(start), float(f.read())))
            slurm_ids.add(slurm_id)
            nodes.add(node)
            self.assertEqual(done[i]["external_id"], f"slurm:{slurm_id}")  # kept in the job's record
            self.assertIn(devices, ("0", "1"))  # one device each, Slurm's
        self.assertEqual(len(slurm_ids), 10)  # each its own Slurm job
        self.assertEqual(len({i.split("_")[0] for i in slurm_ids}), 1)  # of one array: one sbatch
        self.assertEqual(nodes, {"node1", "node2"})
        at_once = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
        self.assertLessEqual(at_once, 4)  # two nodes of two GPUs, as Slurm counts them
        self.d.stop()  # read back from the store, not from memory
        self.d.start()
        self.assertIn(f"Slurm job: {done[ids[0]]['external_id'][6:]}\n", self.d.ok("show", str(ids[0])))

    def test_slurm_refusing_a_job_fails_it_at_once_with_slurms_words_and_no_retry(self):
        job = self.d.submit({"name": "too-big", "shell": "true", "gpus": 3, "retries": 2})["ids"][0]  # nodes have 2
        done = self.d.wait([job], timeout=60)[job]
        self.assertEqual(done["state"], "failed")
        self.assertIn("Slurm refused the job", done["reason"])
        self.assertIn("Requested node configuration is not available", done["reason"])
        self.assertEqual(self.d.show(job)["job"]["attempt"], 1)  # another attempt would be refused the same way
        self.assertEqual(squeue(), [])

    def test_a_job_submitted_while_slurmctld_is_down_reaches_slurm_once_it_is_back(self):
        conf = os.environ["SLURM_CONF"]
        pid_file = os.path.join(os.path.dirname(conf), "slurmctld.pid")
        with open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGTERM)
        try:
            wait_until(lambda: not os.path.exists(pid_file), timeout=60, interval=0.1, what="slurmctld to stop")
            job = self.d.submit({"name": "patient", "shell": "echo ran under $SLURM_JOB_ID", "retries": 0})["ids"][0]
            def reason():
                return next(j["reason"] for j in self.d.json("status")["jobs"] if j["id"] == job)
            wait_until(lambda: "trying again" in reason(), timeout=60, what="sbatch's first failure")
            self.assertIn("Unable to contact slurm controller", reason())
            self.assertEqual(self.d.show(job)["job"]["state"], "running")  # handed over, not failed
        finally:
            if not os.path.exists(pid_file):
                subprocess.run(["slurmctld", "-f", conf], check=True, timeout=60)
        done = self.d.wait([job], timeout=180)[job]
        self.assertEqual(done["state"], "succeeded", done["reason"])
        self.assertEqual(self.d.show(job)["job"]["attempt"], 1)
        self.assertIn("ran under", self.d.ok("logs", str(job)))

    def test_cancel_ends_running_and_pending_jobs_and_leaves_nothing_in_slurm(self):
        ids = self.d.submit([{"name": f"long-{i}", "shell": "sleep 300", "gpus": 2} for i in range(2)])["ids"]
        wait_until(lambda: len(squeue()) == 2, timeout=60, what="both jobs in Slurm's queue")
        self.d.ok("cancel", *map(str, ids))
        done = self.d.wait(ids, timeout=60)
        self.assertEqual([done[i]["state"] for i in ids], ["cancelled", "cancelled"])
        wait_until(lambda: not squeue(), timeout=10, interval=0.2, what="Slurm's queue to empty after cancel")
        # An administrator's scancel (or a preemption, a node lost) is Slurm's doing, and said so
        job = self.d.submit({"name": "admin", "shell": "echo up; sleep 300"})["ids"][0]
        wait_until(lambda: "up" in self.d.run("logs", str(job)).stdout, timeout=60, what="the job to start")
        subprocess.run(["scancel", self.d.show(job)["job"]["external_id"][6:]], check=True, timeout=60)
        done = self.d.wait([job], timeout=60)[job]
        self.assertEqual(done["state"], "cancelled", done["reason"])
        self.assertRegex(done["reason"], r"^Slurm job \d+ ended CANCELLED.* \(scancel\), not through gpuq$")

    def test_a_job_cancelled_in_slurm_whose_rank_failed_first_is_cancelled_not_failed(self):
        # The rank exits 3 right after its own scancel: its supervisor sees the failure, and likely
        # records it before Slurm's SIGTERM reaches it. Slurm's record says what ended the job.
        job = self.d.submit({"name": "self-cancel", "shell": "scancel $SLURM_JOB_ID; exit 3"})["ids"][0]
        done = self.d.wait([job], timeout=60)[job]
        self.assertEqual(done["state"], "cancelled", done["reason"])
        self.assertRegex(done["reason"], r"^Slurm job \d+ ended CANCELLED.* \(scancel\), not through gpuq$")
        # A rank that fails with no one cancelling it still fails, with its own words.
        job = self.d.submit({"name": "fails", "shell": "exit 3"})["ids"][0]
        done = self.d.wait([job], timeout=60)[job]
        self.assertEqual((done["state"], done["reason"]), ("failed", "rank 0 exited with code 3"))

    def test_a_timeout_ends_the_job_timed_out_after_its_sigterm(self):
        job = self.d.submit({"name": "slow", "shell": 'trap "echo got TERM; exit 3" TERM; sleep 300 & wait',
                             "timeout_s": 1})["ids"][0]
        done = self.d.wait([job], timeout=120)[job]
        self.assertEqual(done["state"], "timed_out")
        self.assertIn("got TERM", self.d.ok("logs", str(job)))

    def test_a_job_that_writes_another_slurm_jobs_id_into_its_attempt_cannot_have_gpuq_cancel_that_job(self):
        victim = subprocess.run(["sbatch", "--parsable", "--wrap", "sleep 300", "--output", "/dev/null"],
                                capture_output=True, text=True, timeout=60, check=True).stdout.strip().split(";")[0]
        forge = (f'd=$(dirname "$GPUQ_EVENTS"); echo up; '
                 f'while :; do echo {victim} > "$d/id.new" && mv "$d/id.new" "$d/slurm.id"; sleep 0.1; done')
        job = self.d.submit({"name": "hijack", "shell": forge})["ids"][0]
        wait_until(lambda: "up" in self.d.run("logs", str(job)).stdout, timeout=60, what="the job to start")
        own = self.d.show(job)["job"]["external_id"][6:]
        slurm_id = os.path.join(self.d.show(job)["job"]["job_dir"], "attempt-1", "slurm.id")
        wait_until(lambda: open(slurm_id).read().strip() == victim, what="the forged id in slurm.id")
        self.d.kill9()
        self.d.start()
        self.d.ok("cancel", str(job))
        self.assertEqual(self.d.wait([job], timeout=60)[job]["state"], "cancelled")
        wait_until(lambda: own not in squeue(), timeout=60, interval=0.2, what="the job's own Slurm job to end")
        self.assertIn(victim, squeue())  # untouched
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            self.assertIn(f"its slurm.id names Slurm job {victim}, which Slurm lists as another user's or another "
                          "attempt's; ignored", f.read())
        subprocess.run(["scancel", victim], timeout=60)

    def test_gpuqd_killed_and_restarted_records_every_job_once(self):
        release = os.path.join(self.tmp, "release")
        jobs = [{"name": f"r{i}", "shell": f"while [ ! -e {release} ]; do sleep 0.1; done; echo done-{i}", "gpus": 1}
                for i in range(3)] + [{"name": "quick", "shell": "echo quick"}]
        ids = self.d.submit(jobs)["ids"]
        wait_until(lambda: len(squeue()) == 4, timeout=60, what="the jobs in Slurm's queue")
        self.d.kill9()
        open(release, "w").close()  # they run on, and some end, while no gpuqd runs
        wait_until(lambda: len(squeue()) < 4, timeout=60, interval=0.2, what="a job to end meanwhile")
        self.d.start()
        done = self.d.wait(ids, timeout=300)
        self.assertEqual([done[i]["state"] for i in ids], ["succeeded"] * 4)
        for i in ids:
            self.assertEqual(len([t for t in self.d.show(i)["history"] if t["state"] == "running"]), 1)
            self.assertRegex(done[i]["external_id"], r"^slurm:\d+(_\d+)?$")  # those that ended meanwhile too
        self.assertIn("done-2", self.d.ok("logs", str(ids[2])))

    def reason(self, job):
        return next(j["reason"] for j in self.d.json("status")["jobs"] if j["id"] == job)

    def sbatch_of(self, job):
        """The batch script of the job's current attempt; its first comment is the sbatch command that submitted it."""
        rec = self.d.show(job)["job"]
        with open(os.path.join(self.tmp, "state", "jobs", str(job), f"attempt-{rec['attempt']}", "slurm.sbatch")) as f:
            return f.read()

    def dependency_in_slurm(self, job):
        """What Slurm holds the job's current attempt for: its Dependency field ("afterok:41(unfulfilled)")."""
        slurm_id = self.d.show(job)["job"]["external_id"][6:]
        r = subprocess.run(["scontrol", "-o", "show", "job", slurm_id], capture_output=True, text=True, timeout=60)
        fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
        return fields.get("Dependency", "")

    def test_after_chains_wait_in_slurm_and_go_on_while_gpuqd_is_down(self):
        release, marks = os.path.join(self.tmp, "release"), os.path.join(self.tmp, "marks")
        os.mkdir(marks)
        ids = self.d.submit([
            {"name": "a", "shell": f"while [ ! -e {release} ]; do sleep 0.1; done; echo $SLURM_JOB_ID > {marks}/a"},
            {"name": "b", "shell": f"test -e {marks}/a && echo $SLURM_JOB_ID > {marks}/b", "after": ["a"]},
            {"name": "c", "shell": f"test -e {marks}/b && echo $SLURM_JOB_ID > {marks}/c", "after": ["b"]},
        ])["ids"]
        # All three are in Slurm while the first runs: the chain is Slurm's to hold
        wait_until(lambda: len(squeue()) == 3, timeout=60, what="the chain in Slurm's queue")
        for dep, job in zip(ids, ids[1:]):
            wait_until(lambda: "pending: Dependency" in self.reason(job), timeout=60, what=f"job {job} held by Slurm")
            self.assertEqual(self.dependency_in_slurm(job),
                             f"afterok:{self.d.show(dep)['job']['external_id'][6:]}(unfulfilled)")
        self.d.kill9()
        open(release, "w").close()
        # Slurm starts each after the one before it succeeded, with no gpuqd running
        wait_until(lambda: os.path.exists(f"{marks}/c") and not squeue(), timeout=120, interval=0.2,
                   what="the whole chain to run in Slurm")
        self.d.start()
        done = self.d.wait(ids, timeout=120)
        self.assertEqual([done[i]["state"] for i in ids], ["succeeded"] * 3)
        # Each ran after the one before it ended, though all were handed over at once: a job's
        # record starts when Slurm started it, not when it was handed over
        self.assertGreater(done[ids[1]]["started_at"], done[ids[0]]["ended_at"])
        self.assertGreater(done[ids[2]]["started_at"], done[ids[1]]["ended_at"])
        for i, name in zip(ids, "abc"):
            with open(f"{marks}/{name}") as f:
                self.assertEqual(done[i]["external_id"], "slurm:" + f.read().strip())
            self.assertEqual(self.d.show(i)["job"]["attempt"], 1)

    def test_a_dependency_that_fails_takes_its_dependents_back_until_it_succeeds_or_fails_for_good(self):
        release, marks = os.path.join(self.tmp, "release"), os.path.join(self.tmp, "marks")
        os.mkdir(marks)
        wait = f"while [ ! -e {release} ]; do sleep 0.1; done"
        ids = self.d.submit([
            # fails its first attempt, once its dependents wait for it in Slurm; its retry succeeds
            {"name": "flaky", "retries": 1, "shell": f'{wait}; [ "$GPUQ_ATTEMPT" = 2 ] || exit 3'},
            {"name": "b", "shell": f"echo $SLURM_JOB_ID > {marks}/b", "after": ["flaky"]},
            {"name": "c", "shell": f"echo $SLURM_JOB_ID > {marks}/c", "after": ["b"]},
            # fails for good: its dependent fails without running, and leaves nothing in Slurm
            {"name": "broken", "shell": f"{wait}; exit 4"},
            {"name": "e", "shell": f"touch {marks}/e", "after": ["broken"]},
        ])["ids"]
        flaky, b, c, broken, e = ids
        wait_until(lambda: len(squeue()) == 5, timeout=60, what="every job in Slurm's queue")
        first_flaky = self.d.show(flaky)["job"]["external_id"]
        open(release, "w").close()
        done = self.d.wait(ids, timeout=180)
        self.assertEqual([done[i]["state"] for i in ids], ["succeeded", "succeeded", "succeeded", "failed", "failed"])
        self.assertEqual(self.d.show(flaky)["job"]["attempt"], 2)
        second_flaky = done[flaky]["external_id"]
        self.assertNotEqual(first_flaky, second_flaky)
        for job, dep in ((b, flaky), (c, b)):
            rec = self.d.show(job)
            self.assertEqual(rec["job"]["attempt"], 1)  # taken back, not failed: the same attempt again
            self.assertIn("back in line", json.dumps(rec["history"]))
            self.assertIn(f" '--dependency=afterok:{done[dep]['external_id'][6:]}' ", self.sbatch_of(job))
        self.assertIn(f"dependency {broken} ended failed", done[e]["reason"])
        self.assertFalse(os.path.exists(f"{marks}/e"))
        wait_until(lambda: not squeue(), timeout=10, interval=0.2, what="nothing left in Slurm")

    def test_a_matrix_with_max_running_is_one_array_whose_limit_slurm_keeps_and_update_changes(self):
        release, marks = os.path.join(self.tmp, "release"), os.path.join(self.tmp, "marks")
        os.mkdir(marks)
        # six jobs, two at once (then one); the last fails its first attempt, and is retried on its own
        run = f"{marks}/{{k}}-$GPUQ_ATTEMPT"
        spec = {"name": "sweep", "matrix": {"k": list(range(6))}, "retries": 1,
                "shell": f"while [ ! -e {release} ]; do sleep 0.1; done; date +%s.%N > {run}.start; sleep 0.3; "
                         f'date +%s.%N > {run}.end; [ {{k}} != 5 ] || [ "$GPUQ_ATTEMPT" = 2 ] || exit 3'}
        ids = self.d.submit(spec, "--max-running", "2")["ids"]
        wait_until(lambda: len(squeue()) == 6, timeout=60, what="the array's six tasks in Slurm's queue")
        array = {self.d.show(i)["job"]["external_id"] for i in ids}
        self.assertEqual(array, {f"slurm:{self.d.show(ids[0])['job']['external_id'][6:].split('_')[0]}_{k}"
                                 for k in range(6)})  # one sbatch: tasks 0-5 of one array
        base = array.pop()[6:].split("_")[0]
        fields = subprocess.run(["scontrol", "-o", "show", "job", base], capture_output=True, text=True,
                                timeout=60, check=True).stdout
        self.assertIn("ArrayTaskThrottle=2", fields)
        # A new limit for the batch reaches the array in Slurm
        batch = self.d.show(ids[0])["job"]["batch"]
        self.d.ok("update", "--batch", str(batch), "--max-running", "1")
        wait_until(lambda: "ArrayTaskThrottle=1 " in subprocess.run(
            ["scontrol", "-o", "show", "job", base], capture_output=True, text=True, timeout=60).stdout,
            timeout=30, what="the array's new limit")
        self.d.kill9()  # Slurm alone keeps the limit from here
        open(release, "w").close()
        wait_until(lambda: not squeue(), timeout=120, interval=0.2, what="the array to run through")
        self.d.start()
        done = self.d.wait(ids, timeout=120)
        self.assertEqual([done[i]["state"] for i in ids], ["succeeded"] * 6)
        self.assertEqual([self.d.show(i)["job"]["attempt"] for i in ids], [1] * 5 + [2])
        self.assertNotIn(f"slurm:{base}_", done[ids[5]]["external_id"])  # the retry: a job of its own
        spans = []
        for name in os.listdir(marks):
            if name.endswith(".start"):
                with open(f"{marks}/{name}") as f, open(f"{marks}/{name[:-6]}.end") as g:
                    spans.append((float(f.read()), float(g.read())))
        self.assertEqual(len(spans), 7)
        # (a lowered limit stops none already running, as in Slurm: two may have started before it)
        self.assertLessEqual(max(sum(s <= t < e for s, e in spans) for t, _ in spans), 2)

    def test_jobs_whose_slurm_ids_were_never_written_are_found_again_by_their_comment(self):
        release, runs = os.path.join(self.tmp, "release"), os.path.join(self.tmp, "runs")
        shell = f"while [ ! -e {release} ]; do sleep 0.1; done; echo $GPUQ_JOB_ID >> {runs}"
        jobs = [{"name": f"t{i}", "shell": shell} for i in range(3)] + [{"name": "wide", "gpus": 2, "shell": shell}]
        ids = self.d.submit(jobs)["ids"]  # three as one array, one alone
        wait_until(lambda: len(squeue()) == 4, timeout=60, what="the jobs in Slurm's queue")
        handed = {i: self.d.show(i)["job"]["external_id"] for i in ids}
        self.assertEqual(len({handed[i].split("_")[0] for i in ids[:3]}), 1)
        # As if gpuqd had died between sbatch's answer and writing each job's slurm.id
        self.d.kill9()
        for i in ids:
            os.remove(os.path.join(self.tmp, "state", "jobs", str(i), "attempt-1", "slurm.id"))
        self.d.start()
        open(release, "w").close()
        done = self.d.wait(ids, timeout=120)
        self.assertEqual([done[i]["state"] for i in ids], ["succeeded"] * 4)
        self.assertEqual({i: done[i]["external_id"] for i in ids}, handed)  # the same Slurm jobs
        with open(runs) as f:
            self.assertEqual(sorted(map(int, f.read().split())), sorted(ids))  # each ran once

    def test_the_configuration_file_names_the_executor_and_its_sbatch_options(self):
        config = os.path.join(self.tmp, "config.json")
        with open(config, "w") as f:
            json.dump({"executor": "slurm", "slurm": {"partition": "nosuch", "extra_args": ["--comment=x"]}}, f)
        tmp = tempfile.mkdtemp(dir=SLURM_DIR)
        d = Daemon(tmp, gpus="none", extra=["--slurm-poll", "0.2"], env=dict(os.environ, GPUQ_CONFIG=config)).start()
        try:
            job = d.submit({"name": "elsewhere", "shell": "true"})["ids"][0]
            done = d.wait([job], timeout=60)[job]
            self.assertEqual(done["state"], "failed")
            self.assertIn("Slurm refused the job", done["reason"])
            self.assertIn("partition", done["reason"].lower())
        finally:
            d.stop()

    @unittest.skipUnless(os.path.isdir("/dev/shm"), "needs a tmpfs at /dev/shm")
    def test_a_state_dir_the_nodes_may_not_see_is_named_at_start_and_when_a_job_could_not_start(self):
        tmp = tempfile.mkdtemp(dir="/dev/shm")  # tmpfs: this machine's alone
        d = Daemon(tmp, gpus="none", extra=["--executor", "slurm", "--slurm-poll", "0.2"]).start()
        try:
            with open(os.path.join(tmp, "gpuqd.log")) as f:
                self.assertIn(f"the state dir {tmp}/state is on a local filesystem (tmpfs)", f.read())
            # A node that does not see the attempt directory, as where the state dir is not shared:
            # the job waits behind two that fill both nodes, and its directory goes before it starts.
            fill = d.submit([{"name": f"fill-{i}", "shell": "sleep 300", "gpus": 2} for i in range(2)])["ids"]
            job = d.submit({"name": "unseen", "shell": "true", "gpus": 2})["ids"][0]
            wait_until(lambda: len(squeue()) == 3, timeout=60, what="all three in Slurm's queue")
            attempt = os.path.join(tmp, "state", "jobs", str(job), "attempt-1")
            shutil.rmtree(attempt)
            d.ok("cancel", *map(str, fill))
            done = d.wait([job], timeout=120)[job]
            self.assertEqual(done["state"], "failed")
            self.assertIn("without an exit record or output", done["reason"])
            self.assertIn("does the node see gpuqd's state dir (on a local tmpfs)?", done["reason"])
        finally:
            d.stop()
            shutil.rmtree(tmp, ignore_errors=True)

    def gang_files(self, spec, name):
        """Runs a ddp `spec` whose ranks each write `$OUT/<name>-$RANK.json`; returns (job, [per rank])."""
        out = tempfile.mkdtemp(dir=self.tmp)
        job = self.d.submit(dict(spec, env={"OUT": out}))["ids"][0]
        done = self.d.wait([job], timeout=300)[job]
        logs = [self.d.run("logs", str(job), "--rank", str(r)).stdout for r in range(spec["ranks"])]
        self.assertEqual(done["state"], "succeeded", logs)
        return done, [load(os.path.join(out, f"{name}-{r}.json")) for r in range(spec["ranks"])]

    @unittest.skipUnless(have_torch(), "needs PyTorch with Gloo for " + TORCH_PYTHON + " (Debian: python3-torch)")
    def test_an_unmodified_torchrun_script_runs_as_a_gang_over_two_nodes(self):
        probe = os.path.join(self.tmp, "probe.py")
        with open(probe, "w") as f:
            f.write("import json, os, torch, torch.distributed as dist\n"
                    "dist.init_process_group('gloo')\n"
                    "t = torch.tensor([float(dist.get_rank() + 1)])\n"
                    "dist.all_reduce(t)\n"
                    "with open(os.path.join(os.environ['OUT'], f\"probe-{os.environ['RANK']}.json\"), 'w') as f:\n"
                    "    json.dump(dict(os.environ, SUM=t.item()), f)\n"
                    "dist.destroy_process_group()\n")
        spec = {"name": "probe", "mode": "ddp", "nodes": 2, "gpus": 2, "ranks": 2, "timeout_s": 300,
                "command": [TORCH_PYTHON, probe]}
        job, ranks = self.gang_files(spec, "probe")
        self.assertEqual(job["exit_code"], 0)
        self.assertEqual({r["SLURMD_NODENAME"] for r in ranks}, {"node1", "node2"})  # one rank a node
        self.assertEqual(len({r["SLURM_JOB_ID"] for r in ranks}), 1)  # one Slurm job, one srun
        for rank, env in enumerate(ranks):
            self.assertEqual(env["SUM"], 3.0)  # Gloo's allreduce over both nodes
            self.assertEqual((env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]), (str(rank), "0", str(rank)))
            self.assertEqual((env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]), ("2", "1", "2"))
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")  # the first node's NodeAddr
            self.assertEqual(env["MASTER_PORT"], str(10000 + int(env["SLURM_JOB_ID"]) % 20000))
            self.assertEqual(env["CUDA_VISIBLE_DEVICES"], "0")  # its node's one GPU, Slurm's
            self.assertTrue(env["GPUQ_EVENTS"].endswith(f"/events-{rank}.jsonl"))
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "False")

    @unittest.skipUnless(HAVE_WORKER, "gpuq-worker not built")
    def test_a_train_job_over_two_nodes_equals_single_process_training(self):
        # Two ranks with batch 16 each see, step by step, the samples one process sees with batch 32.
        train = json.dumps(dict(SYNTHETIC, batch_size=16))
        spec = {"name": "ddp", "mode": "ddp", "nodes": 2, "gpus": 2, "ranks": 2, "timeout_s": 300,
                "shell": f"exec {WORKER} --train '{train}' --dump-params \"$OUT/ddp-$RANK.json\""}
        job, (r0, r1) = self.gang_files(spec, "ddp")
        self.assertEqual((job["result"]["world_size"], job["result"]["backend"]), (2, "gloo"))
        self.assertEqual(max_diff(r0, r1), 0.0, "ranks ended with different parameters")
        single = os.path.join(self.tmp, "single.json")
        subprocess.run([WORKER, "--train", json.dumps(dict(SYNTHETIC, batch_size=32)), "--dump-params", single],
                       check=True, capture_output=True, timeout=300)
        self.assertLess(max_diff(r0, load(single)), 1e-5)

    def test_working_and_state_directories_with_spaces_or_options_in_them_reach_sbatch_whole(self):
        # gpuqd's own state dir (each attempt's --output and --comment) holds a space and a '#'.
        self.d.stop()
        tmp = tempfile.mkdtemp(dir=SLURM_DIR, prefix="state dir #")
        self.d = Daemon(tmp, gpus="none", extra=["--executor", "slurm", "--slurm-poll", "0.2"]).start()
        ids = []
        for name in ("my project", "x --partition=nonesuch"):
            work = os.path.join(tmp, name)
            os.mkdir(work)
            ids += self.d.submit({"name": "where", "shell": "pwd", "cwd": work})["ids"]
        done = self.d.wait(ids, timeout=120)
        for job_id, name in zip(ids, ("my project", "x --partition=nonesuch")):
            self.assertEqual(done[job_id]["state"], "succeeded", done[job_id]["reason"])
            self.assertEqual(self.d.ok("logs", str(job_id)), os.path.join(tmp, name) + "\n")
            # Slurm's output file went where gpuqd asked: into the attempt directory
            self.assertTrue(os.path.exists(os.path.join(done[job_id]["job_dir"], "attempt-1", "slurm.out")))

    def test_a_gang_over_two_nodes_times_out_on_both_and_another_is_cancelled(self):
        # Each rank says who sent its SIGTERM: its supervisor (its parent) must, to each rank's
        # process group at once. Slurm signalling every process of the step one by one (its
        # proctrack/linuxproc) can kill a rank's child first, which then ends the rank before its
        # handler runs (a plain `scancel --signal=TERM`); srun tearing the step down (a supervisor
        # that exited non-zero) signals the same way. Rank 1's handler takes two seconds longer than
        # rank 0's (a checkpoint, say): it must have them, however the ranks' ends line up.
        rank = ("import os, signal, sys, time\n"
                "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
                "print('up', flush=True)\n"
                "info = signal.sigwaitinfo({signal.SIGTERM})\n"
                "if os.environ['RANK'] == '1': time.sleep(2)\n"
                "sender = 'its supervisor' if info.si_pid == os.getppid() else f'pid {info.si_pid}'\n"
                "print('got TERM from', sender, 'on', os.environ['SLURMD_NODENAME'], flush=True)\n"
                "sys.exit(3)\n")
        command = ["python3", "-c", rank]
        self.d.stop()  # a grace period that the handlers fit in with room to spare on a loaded machine
        self.d = Daemon(self.tmp, gpus="none", extra=["--executor", "slurm", "--slurm-poll", "0.2", "--grace", "20"]).start()

        def ended_well(job, state):
            done = self.d.wait([job], timeout=120)[job]
            self.assertEqual(done["state"], state, done["reason"])
            wait_until(lambda: not squeue(), timeout=30, interval=0.2, what="Slurm's queue to empty")
            for r, node in ((0, "node1"), (1, "node2")):
                self.assertIn(f"got TERM from its supervisor on {node}", self.d.ok("logs", str(job), "--rank", str(r)))
            with open(os.path.join(done["job_dir"], "attempt-1", "slurm.out")) as f:
                said = f.read()
            # srun neither forced termination (a plain scancel's SIGTERM to the batch step) nor
            # tore the step down (a supervisor exiting non-zero): no rank failed.
            self.assertNotIn("forcing job termination", said)
            self.assertNotIn("Terminating StepId", said)
            return done

        slow = self.d.submit({"name": "slow", "mode": "ddp", "nodes": 2, "ranks": 2, "timeout_s": 2, "command": command})["ids"][0]
        done = ended_well(slow, "timed_out")
        # The supervisors ended 0 (srun let each rank finish); the job's exit status is still not a
        # success, which is what --dependency=afterok reads.
        fields = dict(f.split("=", 1) for f in subprocess.run(
            ["scontrol", "-o", "show", "job", done["external_id"][6:]], capture_output=True, text=True,
            check=True, timeout=60).stdout.split() if "=" in f)
        self.assertEqual((fields["JobState"], fields["ExitCode"]), ("FAILED", "1:0"))

        gang = self.d.submit({"name": "gang", "mode": "ddp", "nodes": 2, "ranks": 2, "command": command})["ids"][0]
        wait_until(lambda: all("up" in self.d.run("logs", str(gang), "--rank", str(r)).stdout for r in (0, 1)),
                   timeout=60, what="both ranks to start")
        self.d.ok("cancel", str(gang))
        ended_well(gang, "cancelled")

        # A job of one rank: its supervisor is the batch step itself, which gets the SIGTERM.
        shell = 'trap "echo got TERM on $SLURMD_NODENAME; exit 3" TERM; echo up; sleep 300 & wait'
        single = self.d.submit({"name": "single", "shell": shell})["ids"][0]
        wait_until(lambda: "up" in self.d.run("logs", str(single)).stdout, timeout=60, what="the job to start")
        self.d.ok("cancel", str(single))
        self.assertEqual(self.d.wait([single], timeout=60)[single]["state"], "cancelled")
        self.assertIn("got TERM on", self.d.ok("logs", str(single)))

    def test_jobs_get_the_descriptor_limit_gpuqd_started_with_not_the_one_it_raised(self):
        # gpuqd raises its own soft limit to the hard one (for its clients); Slurm hands sbatch's
        # limits on to the job (PropagateResourceLimits=ALL, its default), so sbatch must get the
        # limit gpuqd started with, as local jobs do.
        self.d.stop()
        self.d = Daemon(self.tmp, gpus="none", extra=["--executor", "slurm", "--slurm-poll", "0.2"]).start(nofile=(1024, 4096))
        job = self.d.submit({"name": "limit", "shell": "ulimit -n"})["ids"][0]
        done = self.d.wait([job], timeout=120)[job]
        self.assertEqual(done["state"], "succeeded", done["reason"])
        self.assertEqual(self.d.ok("logs", str(job)), "1024\n")

    def test_a_failing_rank_on_one_node_tears_down_its_gang_on_the_other(self):
        # rank 1 fails once rank 0 has said where it runs (else the teardown may come first)
        said = os.path.join(self.tmp, "rank0-said")
        job = self.d.submit({"name": "half-dead", "mode": "ddp", "nodes": 2, "ranks": 2, "timeout_s": 600,
                             "shell": f'if [ "$RANK" = 1 ]; then while [ ! -e {said} ]; do sleep 0.1; done; exit 7; fi; '
                                      f'echo "$SLURMD_NODENAME"; touch {said}; sleep 7401'})["ids"][0]
        done = self.d.wait([job], timeout=120)[job]
        self.assertEqual(done["state"], "failed")
        self.assertEqual(done["reason"], "rank 1 exited with code 7")
        self.assertEqual(self.d.show(job)["first_failure"]["rank"], 1)
        self.assertIn("node1", self.d.ok("logs", str(job), "--rank", "0"))
        wait_until(lambda: not squeue(), timeout=30, interval=0.2, what="the gang to leave Slurm's queue")


# A Slurm job of the urgent partition over both nodes' GPUs: Slurm preempts what holds them.
URGENT = ["sbatch", "--parsable", "--partition=urgent", "--nodes=2", "--gpus-per-node=2", "--output=/dev/null",
          "--wrap=sleep 1"]


@unittest.skipUnless(HAVE_SLURM, NEEDS)
class SlurmPreemption(unittest.TestCase):
    """Preemption under the Slurm executor: Slurm's own (partition_prio; the job's --signal sent at
    preemption, SlurmctldParameters=preempt_send_user_signal), and gpuq's (`gpuq preempt`)."""
    setUp = SlurmExecutor.setUp
    tearDown = SlurmExecutor.tearDown

    def stepper_job(self, **fields):
        started, log = os.path.join(self.tmp, "started"), os.path.join(self.tmp, "steps")
        job = self.d.submit(dict({"name": "low", "gpus": 2, "preemptible": True, "preempt_signal": "USR1",
                                  "preempt_grace_s": 20, "timeout_s": 300,
                                  "shell": stepper(started, log, steps=6, park=2, signal="USR1")}, **fields))["ids"][0]
        wait_until(lambda: os.path.exists(started + "-1"), timeout=60, what="the job to start")
        wait_until(lambda: os.path.exists(log) and len(open(log).read().split()) == 2, timeout=60, what="two steps")
        return job, log

    def test_a_job_slurm_preempts_gets_its_signal_and_file_and_resumes_as_a_new_attempt(self):
        job, log = self.stepper_job()
        urgent = subprocess.run(URGENT, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        done = self.d.wait([job], timeout=180)[job]
        # Back in line as preempted by Slurm (no retry spent), submitted again once the urgent job
        # had ended: every step once, across both attempts.
        self.assertEqual((done["state"], done["attempt"], done["preemptions"]), ("succeeded", 2, 1), done["reason"])
        self.assertEqual(open(log).read().split(), [str(i) for i in range(1, 7)])
        self.assertIn("preempt file seen at step 2", self.d.ok("logs", str(job), "--attempt", "1"))
        reasons = [r for _, state, r in history(self.d, job) if state == "queued"]
        self.assertIn("preempted by Slurm: attempt 1 was stopped (it had checkpointed)", reasons)
        first = json.load(open(os.path.join(self.d.state, "jobs", str(job), "attempt-1", "exit.json")))
        self.assertTrue(first.get("preempted"), first)
        self.assertTrue(urgent)

    def test_a_gang_slurm_preempts_has_every_rank_take_the_preemption(self):
        started = os.path.join(self.tmp, "started")
        script = (f'[ "$GPUQ_ATTEMPT" = 2 ] && exit 0; '
                  f'trap \'[ -f "$GPUQ_PREEMPT_FILE" ] && echo "rank $RANK: USR1 with the preempt file"; exit 143\' USR1; '
                  f'touch {started}-$RANK; while true; do sleep 0.05; done')
        job = self.d.submit({"name": "gang", "mode": "ddp", "nodes": 2, "gpus": 2, "ranks": 2, "preemptible": True,
                             "preempt_signal": "USR1", "timeout_s": 300, "shell": script})["ids"][0]
        wait_until(lambda: all(os.path.exists(f"{started}-{r}") for r in (0, 1)), timeout=60, what="both ranks")
        subprocess.run(URGENT, capture_output=True, text=True, timeout=60, check=True)
        done = self.d.wait([job], timeout=180)[job]
        self.assertEqual((done["state"], done["attempt"], done["preemptions"], done["preempted_by"]),
                         ("succeeded", 2, 1, ""), done["reason"])
        for rank in (0, 1):
            self.assertIn(f"rank {rank}: USR1 with the preempt file",
                          self.d.ok("logs", str(job), "--attempt", "1", "--rank", str(rank)))
        self.assertIn((1, "queued", "preempted by Slurm: attempt 1 was stopped"), history(self.d, job))

    def test_the_warning_of_a_time_limit_the_spec_did_not_set_ends_the_job_timed_out_not_preempted(self):
        # No timeout in the spec; the cluster's limit (here --time=1 for every job): its SIGUSR1,
        # 30 s before, is not a preemption.
        self.d.stop()
        self.d = Daemon(self.tmp, gpus="none", extra=["--executor", "slurm", "--slurm-poll", "0.2",
                                                      "--slurm-arg=--time=1"]).start()
        job = self.d.submit({"name": "limited", "preemptible": True, "preempt_signal": "USR1",
                             "shell": 'trap "echo got USR1; exit 143" USR1; while true; do sleep 0.05; done'})["ids"][0]
        done = self.d.wait([job], timeout=180)[job]
        self.assertEqual((done["state"], done["preemptions"], done["attempt"]), ("timed_out", 0, 1), done["reason"])
        self.assertIn("reached its time limit", done["reason"])
        self.assertIn("got USR1", self.d.ok("logs", str(job)))

    def test_gpuq_preempt_under_slurm_sends_the_specs_signal_and_the_job_resumes(self):
        job, log = self.stepper_job(preemptible=False)
        self.assertIn(f"job {job}: preempting", self.d.ok("preempt", str(job)))
        done = self.d.wait([job], timeout=180)[job]
        self.assertEqual((done["state"], done["attempt"], done["preemptions"]), ("succeeded", 2, 1), done["reason"])
        self.assertEqual(open(log).read().split(), [str(i) for i in range(1, 7)])
        self.assertIn("preempt file seen at step 2", self.d.ok("logs", str(job), "--attempt", "1"))


if __name__ == "__main__":
    unittest.main()
