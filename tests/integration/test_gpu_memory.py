"""GPU memory budgets, through the real daemon and CLI on the stand-in NVML (tests/fake_nvml): a
shared job over its budget beside a job owed the room is stopped and requeued with a larger one,
its neighbour untouched; one over its budget with room beside it has its budget raised and runs
on; a job whose CUDA ran out of memory at its budget runs again with a larger one, no retry
spent, until its budget is all its GPU has."""
import os
import re
import tempfile
import unittest
import urllib.request

from harness import FAKE_NVML_DIR, Daemon, wait_until
from test_metrics import samples

GPU = "GPU-22222222-bbbb L4 24576 0 0 1b 0 0 0 -"  # 24 GiB

# Writes its pid, then holds until `gate` exists; on SIGTERM it says so and ends. A later attempt
# ends at once. Each attempt writes the budget gpuq gave it ($GPUQ_GPU_MEMORY_MB).
HOLDER = ('echo "$GPUQ_ATTEMPT $GPUQ_GPU_MEMORY_MB" >> {base}.budgets; [ "$GPUQ_ATTEMPT" = 1 ] || exit 0; '
          "trap 'touch {base}.term; exit 143' TERM; echo $$ > {base}.pid.tmp; mv {base}.pid.tmp {base}.pid; "
          "while [ ! -e {base}.gate ]; do sleep 0.05; done")


class Budgets(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.devices = os.path.join(self.tmp, "nvml-devices")
        self.procs = {}
        self.show_procs()
        env = dict(os.environ, LD_LIBRARY_PATH=FAKE_NVML_DIR, GPUQ_FAKE_NVML=self.devices)
        self.d = Daemon(self.tmp, "nvml", extra=["--gpu-process-interval", "0.1", "--metrics-listen", "127.0.0.1:0"],
                        env=env).start()
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            port = int(re.findall(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", f.read())[-1])
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"

    def tearDown(self):
        self.d.stop()

    def show_procs(self):
        """NVML lists what self.procs says: pid -> MiB."""
        listed = ",".join(f"{pid}:{mb}" for pid, mb in self.procs.items()) or "-"
        with open(self.devices + ".new", "w") as f:
            f.write(f"{GPU} {listed}\n")
        os.replace(self.devices + ".new", self.devices)

    def holder(self, name, budget, **spec):
        """A shared job of `budget` MiB holding its GPU until released; (id, base of its files)."""
        base = os.path.join(self.tmp, name)
        job = self.d.submit({"name": name, "gpus": 1, "shared": True, "gpu_memory_mb": budget,
                             "shell": HOLDER.format(base=base), **spec})["ids"][0]
        wait_until(lambda: os.path.exists(base + ".pid"), what=f"{name} to start")
        return job, base

    def holds(self, base, mb, job):
        """NVML shows `base`'s process holding `mb` MiB, and gpuqd has seen it."""
        with open(base + ".pid") as f:
            self.procs[int(f.read())] = mb
        self.show_procs()
        wait_until(lambda: self.d.show(job)["job"]["gpu_memory_peak_mb"] == mb, what="gpuqd to see its memory")

    def overruns(self, action):
        """gpuq_gpu_budget_overruns_total{action=...}, as Prometheus would scrape it."""
        with urllib.request.urlopen(self.metrics_url, timeout=30) as r:
            return samples(r.read().decode()).get(("gpuq_gpu_budget_overruns_total", frozenset({("action", action)})))

    def budgets(self, base):
        with open(base + ".budgets") as f:
            return [line.split() for line in f.read().splitlines()]

    def test_a_job_over_its_budget_beside_one_owed_the_room_is_requeued_with_more_and_its_neighbour_runs_on(self):
        neighbour, nbase = self.holder("neighbour", 10000)
        self.holds(nbase, 6000, neighbour)
        grower, gbase = self.holder("grower", 8000)
        self.holds(gbase, 7000, grower)
        # 6000 + 15000 of 24576 MiB leave 3576 free, and the neighbour is owed 4000 (its 10000 less
        # its 6000): the grower is stopped, and requeued with 15000 * 1.25 in 256 MiB.
        with open(gbase + ".pid") as f:
            self.procs[int(f.read())] = 15000
        self.show_procs()
        wait_until(lambda: os.path.exists(gbase + ".term"), what="the grower to be stopped")
        wait_until(lambda: self.d.show(grower)["job"]["state"] == "queued", what="the grower to be back in line")
        self.procs = {pid: mb for pid, mb in self.procs.items() if mb != 15000}  # its process is gone
        self.show_procs()
        job = self.d.show(grower)["job"]
        self.assertEqual(job["gpu_budget_mb"], 18944)
        self.assertEqual(job["reason"],
                         f"requeued: over its GPU memory budget (it held 15000 MiB of its 8000 MiB budget on GPU 0, "
                         f"while job {neighbour} beside it was owed 424 MiB more than the GPU had free); its budget "
                         f"is now 18944 MiB: attempt 1 was stopped")
        # 10000 + 18944 do not fit in 24576: it waits for the neighbour, which runs on untouched.
        self.assertIn(f"GPUs held by:\n    job {neighbour} ", self.d.ok("why", str(grower)))
        self.assertFalse(os.path.exists(nbase + ".term"))
        # Its process ends and the driver lists it no more: a PID still listed once its job has
        # ended is memory held outside gpuq, which would keep the grower from fitting for good.
        self.procs = {}
        self.show_procs()
        open(nbase + ".gate", "w").close()
        done = self.d.wait([neighbour, grower])
        self.assertEqual((done[neighbour]["state"], done[neighbour]["attempt"]), ("succeeded", 1))
        self.assertEqual((done[grower]["state"], done[grower]["attempt"], done[grower]["attempt_base"]),
                         ("succeeded", 2, 1))  # no retry spent
        self.assertEqual(self.budgets(gbase), [["1", "8000"], ["2", "18944"]])
        self.assertIn("budget:    18944 MiB of GPU memory a GPU, over its GPU memory budget", self.d.ok("show", str(grower)))
        self.assertEqual((self.overruns("requeued"), self.overruns("raised"), self.overruns("cuda_oom")), (1, 0, 0))

    def test_a_job_over_its_budget_with_room_beside_it_has_it_raised_and_runs_on(self):
        job, base = self.holder("grower", 8000)
        self.holds(base, 7000, job)
        self.holds(base, 12000, job)  # 12576 MiB free, nobody owed any: raised, not stopped
        wait_until(lambda: self.d.show(job)["job"]["gpu_budget_mb"] == 15104, what="its budget to be raised")
        info = self.d.show(job)["job"]
        self.assertEqual(info["state"], "running")
        self.assertEqual(info["gpu_budget_why"],
                         "raised from 8000 MiB: it held 12000 MiB of its 8000 MiB budget on GPU 0, with room beside it")
        row = [line for line in self.d.ok("status").splitlines() if line.split()[:1] == [str(job)]]
        self.assertIn("running (over budget)", row[0])
        # What a pass packs beside it counts the raised budget: 24576 - 15104 leaves 9472.
        other = self.d.submit({"name": "other", "gpus": 1, "shared": True, "gpu_memory_mb": 10000,
                               "command": ["true"]})["ids"][0]
        wait_until(lambda: "waiting for 1 GPU" in self.d.show(other)["job"]["reason"], what="the other job to wait")
        self.procs = {}  # its process ends, and the driver lists it no more
        self.show_procs()
        open(base + ".gate", "w").close()
        done = self.d.wait([job, other])
        self.assertEqual((done[job]["state"], done[job]["attempt"]), ("succeeded", 1))
        self.assertEqual(done[job]["gpu_memory_peak_mb"], 12000)  # kept once it has ended
        self.assertFalse(os.path.exists(base + ".term"))
        self.assertEqual(done[other]["state"], "succeeded")
        self.assertEqual((self.overruns("requeued"), self.overruns("raised")), (0, 1))

    def test_policy_warn_raises_the_budget_of_a_job_beside_one_owed_the_room_and_stops_nothing(self):
        neighbour, nbase = self.holder("neighbour", 10000)
        self.holds(nbase, 6000, neighbour)
        grower, gbase = self.holder("grower", 8000, gpu_memory_policy="warn")
        self.holds(gbase, 15000, grower)
        # Raised to what it holds: the rest of the GPU is the neighbour's budget.
        wait_until(lambda: self.d.show(grower)["job"]["gpu_budget_mb"] == 15000, what="its budget to be raised")
        self.assertEqual(self.d.show(grower)["job"]["state"], "running")
        for base in (nbase, gbase):
            open(base + ".gate", "w").close()
        done = self.d.wait([neighbour, grower])
        self.assertEqual([(done[j]["state"], done[j]["attempt"]) for j in (neighbour, grower)],
                         [("succeeded", 1), ("succeeded", 1)])
        self.assertFalse(os.path.exists(gbase + ".term"))

    def test_cuda_out_of_memory_at_its_budget_runs_it_again_with_more_no_retry_spent_up_to_the_whole_gpu(self):
        log = os.path.join(self.tmp, "budgets")
        oom = (f'echo "$GPUQ_GPU_MEMORY_MB" >> {log}; [ "$GPUQ_GPU_MEMORY_MB" -ge 15000 ] && exit 0; '
               'echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" >&2; exit 1')
        job = self.d.submit({"name": "oom", "gpus": 1, "shared": True, "gpu_memory_mb": 8000, "retries": 0,
                             "shell": oom})["ids"][0]
        done = self.d.wait([job])[job]
        self.assertEqual((done["state"], done["attempt"], done["attempt_base"]), ("succeeded", 3, 2))
        with open(log) as f:
            self.assertEqual(f.read().split(), ["8000", "12032", "18176"])  # 1.5 times, in 256 MiB
        reasons = [h["reason"] for h in self.d.show(job)["history"] if h["state"] == "queued"]
        self.assertIn("requeued: CUDA ran out of memory at its GPU memory budget of 8000 MiB; its budget is now "
                      "12032 MiB", reasons[1])
        self.assertEqual(self.overruns("cuda_oom"), 2)
        # At the whole GPU there is no more to give: it fails as any job does, saying so.
        capped = self.d.submit({"name": "capped", "gpus": 1, "shared": True, "gpu_memory_mb": 24576,
                                "shell": 'echo "CUDA out of memory" >&2; exit 1'})["ids"][0]
        done = self.d.wait([capped])[capped]
        self.assertEqual((done["state"], done["attempt"]), ("failed", 1))
        self.assertIn("at its GPU memory budget's cap (24576 MiB, all its GPU has)", done["reason"])


if __name__ == "__main__":
    unittest.main()
