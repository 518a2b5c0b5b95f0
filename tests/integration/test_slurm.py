"""gpuq on a real Slurm (tests/slurm/start-slurm.sh: slurmctld and one slurmd on this machine,
auth/none, two fake GPUs as GRES): what `gpuq export --slurm` writes is submitted with sbatch and
run by Slurm, ranks started by srun with the torchrun environment made from Slurm's."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import BIN, REPO, wait_until

START = os.path.join(REPO, "tests/slurm/start-slurm.sh")


@unittest.skipUnless(shutil.which("slurmctld") and os.geteuid() == 0,
                     "needs Debian's slurm-wlm and root (slurmd); CI installs it")
class SlurmExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gpuq-slurm-")
        r = subprocess.run([START, os.path.join(cls.dir, "slurm")], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"Slurm did not start: {r.stderr}")
        cls.env = dict(os.environ, SLURM_CONF=r.stdout.strip())

    @classmethod
    def tearDownClass(cls):
        subprocess.run([START, "--stop", os.path.join(cls.dir, "slurm")])
        shutil.rmtree(cls.dir, ignore_errors=True)

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
            self.assertEqual(env["MASTER_ADDR"], "localhost")
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


if __name__ == "__main__":
    unittest.main()
