#!/usr/bin/env python3
"""Queue benchmarks: gpuq against Debian's task-spooler (tsp) on the same machine, same run.

1. Drain 1,000 trivial jobs (`true`) with 8 slots: gpuqd on fake:8 (each job exclusively on one
   GPU) against `tsp -S 8`. gpuq is timed twice: one batch submit, and 1,000 separate submits
   (tsp has no batch submit). Time runs from the first submit to the last job's end.
2. Round-trip latency of `gpuq status` and `gpuq submit` (the real CLI process, median and p99)
   with 10,000 finished jobs in the history; submit both into a held queue (the submit path
   alone) and with the job starting at once (competing with its own launch).

Usage: bench/queue_bench.py [--bin build/bin] [--jobs 1000] [--history 10000]
Prints a table of results and ratios (gpuq time / tsp time: < 1 means gpuq is faster).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "../build/bin"))
ap.add_argument("--jobs", type=int, default=1000)
ap.add_argument("--history", type=int, default=10000)
ap.add_argument("--samples", type=int, default=200)
args = ap.parse_args()
BIN = os.path.abspath(args.bin)


class Gpuqd:
    def __init__(self, gpus):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-bench-", dir="/tmp")
        self.env = dict(os.environ, GPUQ_SOCKET=os.path.join(self.tmp, "s"))
        self.proc = subprocess.Popen([os.path.join(BIN, "gpuqd"), "--foreground", "--socket", self.env["GPUQ_SOCKET"],
                                      "--state-dir", os.path.join(self.tmp, "state"), "--gpus", gpus],
                                     stderr=subprocess.DEVNULL)
        while self.gpuq("daemon", "status").returncode != 0:
            time.sleep(0.02)

    def gpuq(self, *a, input=None):
        return subprocess.run([os.path.join(BIN, "gpuq"), *a], env=self.env, input=input, capture_output=True,
                              text=True, cwd="/tmp")

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def gpuq_drain(n, batch):
    d = Gpuqd("fake:8")
    try:
        job = {"command": ["true"], "gpus": 1}
        t0 = time.perf_counter()
        if batch:
            ids = json.loads(d.gpuq("submit", "-", "--json", input=json.dumps([job] * n)).stdout)["ids"]
        else:
            ids = [json.loads(d.gpuq("submit", "-", "--json", input=json.dumps(job)).stdout)["ids"][0]
                   for _ in range(n)]
        r = d.gpuq("wait", *map(str, ids), "--json")
        elapsed = time.perf_counter() - t0
        states = {j["state"] for j in json.loads(r.stdout)["jobs"]}
        assert states == {"succeeded"}, states
        return elapsed
    finally:
        d.close()


def tsp_drain(n):
    tmp = tempfile.mkdtemp(prefix="tsp-bench-", dir="/tmp")
    env = dict(os.environ, TS_SOCKET=os.path.join(tmp, "ts"), TMPDIR=tmp, TS_SAVELIST=os.path.join(tmp, "save"))
    tsp = shutil.which("tsp") or shutil.which("ts")
    try:
        subprocess.run([tsp, "-S", "8"], env=env, check=True, capture_output=True)
        t0 = time.perf_counter()
        for _ in range(n):
            subprocess.run([tsp, "-n", "true"], env=env, check=True, capture_output=True)
        while True:
            out = subprocess.run([tsp, "-l"], env=env, capture_output=True, text=True).stdout
            if " running " not in out and " queued " not in out:
                break
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        finished = sum(1 for line in out.splitlines() if " finished " in line)
        assert finished == n, f"tsp finished {finished} of {n}"
        return elapsed
    finally:
        subprocess.run([tsp, "-K"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def latency(history, samples):
    d = Gpuqd("fake:8")
    try:
        for start in range(0, history, 5000):
            chunk = min(5000, history - start)
            ids = json.loads(d.gpuq("submit", "-", "--json", input=json.dumps([{"command": ["true"]}] * chunk)).stdout)["ids"]
            d.gpuq("wait", str(ids[-1]))
        while json.loads(d.gpuq("status", "--json", "-n", "0").stdout)["jobs"]:
            time.sleep(0.1)
        # A blocker holds the queue so that "submit (held)" measures the submit path alone; plain
        # "submit" jobs start at once and compete with their own launch for the cores.
        blocker = json.loads(d.gpuq("submit", "-", "--json", input=json.dumps({"shell": "sleep 600"})).stdout)["ids"][0]
        held = json.dumps({"command": ["true"], "after": [blocker]})
        out = {}
        for name, argv, inp in (("status", ["status"], None), ("status --json", ["status", "--json"], None),
                                ("submit (held)", ["submit", "-"], held),
                                ("submit", ["submit", "-"], json.dumps({"command": ["true"]}))):
            times = []
            for _ in range(samples):
                t0 = time.perf_counter()
                r = d.gpuq(*argv, input=inp)
                times.append((time.perf_counter() - t0) * 1000)
                assert r.returncode == 0, r.stderr
            out[name] = (statistics.median(times), percentile(times, 99))
        total = json.loads(d.gpuq("status", "--json").stdout)["total"]
        d.gpuq("cancel", str(blocker))
        return out, total
    finally:
        d.close()


print(f"machine: {os.cpu_count()} cores; gpuq from {BIN}")
t_tsp = tsp_drain(args.jobs)
t_batch = gpuq_drain(args.jobs, batch=True)
t_single = gpuq_drain(args.jobs, batch=False)
lat, total = latency(args.history, args.samples)

print(f"\ndrain {args.jobs} x `true`, 8 slots")
print(f"  {'runner':<32}{'seconds':>9}{'jobs/s':>9}{'vs tsp':>8}")
for name, t in (("tsp -S 8 (1 submit per job)", t_tsp), ("gpuq fake:8, one batch submit", t_batch),
                ("gpuq fake:8, 1 submit per job", t_single)):
    print(f"  {name:<32}{t:>9.2f}{args.jobs / t:>9.0f}{t / t_tsp:>8.2f}")
print(f"\nCLI round trip with {total} jobs in history ({args.samples} samples, ms)")
print(f"  {'command':<16}{'median':>8}{'p99':>8}")
for name, (med, p99) in lat.items():
    print(f"  {name:<16}{med:>8.1f}{p99:>8.1f}")
t0 = time.perf_counter()
for _ in range(args.samples):
    subprocess.run([os.path.join(BIN, "gpuq"), "--version"], capture_output=True)
print(f"  {'gpuq --version':<16}{(time.perf_counter() - t0) * 1000 / args.samples:>8.1f}   (process start-up alone, mean)")
