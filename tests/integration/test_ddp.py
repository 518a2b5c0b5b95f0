"""DDP jobs: one gang, the torchrun environment, and an unmodified torchrun-style PyTorch script
(Debian's python3-torch, Gloo on CPU) training to identical parameters on every rank."""
import json
import os
import re
import shutil
import subprocess
import unittest

from harness import REPO, DaemonTest, pids_matching, wait_until

TORCH_PYTHON = os.environ.get("GPUQ_TEST_PYTHON", "/usr/bin/python3")


def have_torch():
    r = subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                       capture_output=True)
    return r.returncode == 0


ENV_VARS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
            "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
            "GPUQ_EVENTS", "OMP_NUM_THREADS"]


def rank_env(log):
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


class Gang(DaemonTest):
    def test_a_two_rank_ddp_job_gets_a_consistent_torchrun_environment(self):
        printenv = " ".join(f'{v}="${v}"' for v in ENV_VARS)
        sub = self.d.submit({"name": "gang", "mode": "ddp", "gpus": 2,
                             "shell": f"for kv in {printenv}; do echo \"$kv\"; done"})
        job_id = sub["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        envs = [rank_env(self.d.ok("logs", str(job_id), "--rank", str(r))) for r in (0, 1)]
        for r, env in enumerate(envs):
            self.assertEqual(env["RANK"], str(r))
            self.assertEqual(env["LOCAL_RANK"], str(r))
            self.assertEqual(env["WORLD_SIZE"], "2")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(env["GROUP_RANK"], "0")
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], f"gpuq-{job_id}")
            self.assertTrue(env["GPUQ_EVENTS"].endswith(f"/attempt-1/events-{r}.jsonl"))
        self.assertEqual(envs[0]["MASTER_PORT"], envs[1]["MASTER_PORT"])
        self.assertTrue(1024 < int(envs[0]["MASTER_PORT"]) < 65536)
        # Both ranks see the gang's two GPUs, in the same order, as under torchrun.
        self.assertEqual(envs[0]["CUDA_VISIBLE_DEVICES"], envs[1]["CUDA_VISIBLE_DEVICES"])
        self.assertEqual(sorted(envs[0]["CUDA_VISIBLE_DEVICES"].split(",")), [str(g) for g in job["gpus"]])
        self.assertEqual(len(set(job["gpus"])), 2)

    def test_concurrent_ddp_jobs_get_different_master_ports(self):
        ids = self.d.submit([{"name": f"g{i}", "mode": "ddp", "gpus": 2, "shell": 'echo "port=$MASTER_PORT"; sleep 1'}
                             for i in range(2)])["ids"]
        self.d.wait(ids)
        ports = {rank_env(self.d.ok("logs", str(i), "--rank", "0"))["port"] for i in ids}
        self.assertEqual(len(ports), 2)

    def test_one_failing_rank_tears_down_the_gang_and_is_named(self):
        sub = self.d.submit({"name": "half-dead", "mode": "ddp", "ranks": 3,
                             "shell": 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 7; fi; sleep 7401'})
        job_id = sub["ids"][0]
        job = self.d.wait([job_id], timeout=30)[job_id]
        self.assertEqual(job["state"], "failed")
        self.assertEqual(job["reason"], "rank 1 exited with code 7")
        self.assertEqual(self.d.show(job_id)["first_failure"]["rank"], 1)
        self.assertLess(job["ended_at"] - job["started_at"], 10)
        self.assertEqual(pids_matching("^sleep 7401$"), [])


@unittest.skipUnless(have_torch(), "needs PyTorch with Gloo for " + TORCH_PYTHON + " (Debian: python3-torch)")
class TorchrunScript(DaemonTest):
    def test_an_unmodified_torchrun_script_trains_with_identical_parameters_on_every_rank(self):
        script = os.path.join(REPO, "jobs/examples/train.py")
        for gpus, extra in ((0, {"ranks": 2}), (2, {})):
            with self.subTest(gpus=gpus):
                spec = {"name": f"ddp-{gpus}", "mode": "ddp", "gpus": gpus, **extra,
                        "command": [TORCH_PYTHON, script, "--dataset", "synthetic", "--epochs", "2", "--limit",
                                    "2048", "--hidden", "32"]}
                job_id = self.d.submit(spec)["ids"][0]
                job = self.d.wait([job_id], timeout=300)[job_id]
                logs = [self.d.ok("logs", str(job_id), "--rank", str(r)) for r in (0, 1)]
                self.assertEqual(job["state"], "succeeded", logs)
                sums = [re.search(r"param_checksum=(\w+)", log).group(1) for log in logs]
                self.assertEqual(sums[0], sums[1], "ranks ended with different parameters")
                self.assertEqual(job["result"]["world_size"], 2)
                self.assertGreater(job["result"]["test_accuracy"], 0.5)

    def test_each_rank_sees_every_variable_torchrun_sets_with_torchrun_s_values(self):
        # Each rank writes its environment to a file of its own (the ranks' output, teed by
        # torchrun onto one stream, interleaves mid-line).
        probe = self.tmp_path("probe.py")
        with open(probe, "w") as f:
            f.write("import json, os, sys\n"
                    "with open(os.path.join(sys.argv[1], 'env-' + os.environ['RANK'] + '.json'), 'w') as f:\n"
                    "    json.dump(dict(os.environ), f)\n")

        def added(out, base):  # per rank: the variables the launcher added to `base`
            envs = []
            for rank in (0, 1):
                with open(os.path.join(out, f"env-{rank}.json")) as f:
                    envs.append({k: v for k, v in json.load(f).items() if k not in base})
            return envs

        # torchrun itself (torch 1.13 on Python 3.11 needs --redirects/--tee other than 0 to start).
        out = self.tmp_path("torchrun")
        os.mkdir(out)
        r = subprocess.run([TORCH_PYTHON, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "2",
                            "--nproc_per_node", "2", probe, out], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ), cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        torchrun = added(out, set(os.environ))
        out = self.tmp_path("gpuq")
        os.mkdir(out)
        job_id = self.d.submit({"name": "probe", "mode": "ddp", "ranks": 2, "command": [TORCH_PYTHON, probe, out]})["ids"][0]
        self.assertEqual(self.d.wait([job_id])[job_id]["state"], "succeeded")
        gpuq = added(out, set(os.environ) | {"GPUQ_SOCKET"})
        # Values that differ by design: where the files go, the run's id, the port; and the store:
        # torchrun's agent hosts one, and "True" makes rank 0 a client of it; under gpuq rank 0
        # hosts it, as plain env:// does.
        own = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}
        for rank in (0, 1):
            missing = sorted(set(torchrun[rank]) - set(gpuq[rank]))
            self.assertEqual(missing, [], f"rank {rank} lacks what torchrun sets")
            self.assertEqual({k: v for k, v in gpuq[rank].items() if k in torchrun[rank] and k not in own},
                             {k: v for k, v in torchrun[rank].items() if k not in own})
            self.assertEqual(gpuq[rank]["TORCHELASTIC_USE_AGENT_STORE"], "False")


if __name__ == "__main__":
    unittest.main()
