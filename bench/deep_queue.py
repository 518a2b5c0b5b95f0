#!/usr/bin/env python3
"""Deep queues: does draining N jobs cost gpuqd N times one job, or more?

Submits N × `true` (one GPU each, exclusive) in one batch to a gpuqd on fake:8, waits for the
whole batch (`gpuq wait --batch`), and reports the drain rate and gpuqd's own CPU time per job
(user + system, from /proc). A scheduling pass or a wait that walks the whole queue shows up as
CPU per job growing with N.

With --max-running M the batch is submitted with that limit (a throttled sweep): every pass then
passes over the jobs beyond the limit, which must stay cheap.

Usage: bench/deep_queue.py [--bin build/bin] [--jobs 1000,4000,16000] [--max-running M]
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", default="1000,4000,16000")
ap.add_argument("--max-running", type=int, default=0)
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)

from harness import Daemon  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


print("| jobs | submit | drain | jobs/s | gpuqd CPU | CPU per job |")
print("|---|---|---|---|---|---|")
for n in map(int, args.jobs.split(",")):
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(tmp, gpus="fake:8").start()
        try:
            path = os.path.join(tmp, "batch.json")
            with open(path, "w") as f:
                json.dump([{"command": ["true"], "gpus": 1} for _ in range(n)], f)
            cpu0 = cpu_seconds(d.proc.pid)
            t0 = time.monotonic()
            limit = ["--max-running", str(args.max_running)] if args.max_running else []
            batch = json.loads(d.ok("submit", path, "--json", *limit))["batch"]
            t1 = time.monotonic()
            done = json.loads(d.ok("wait", "--batch", str(batch), "--json", timeout=7200))
            t2 = time.monotonic()
            cpu = cpu_seconds(d.proc.pid) - cpu0
            states = {j["state"] for j in done["jobs"]}
            assert len(done["jobs"]) == n and states == {"succeeded"}, (len(done["jobs"]), states)
            print(f"| {n} | {t1 - t0:.2f} s | {t2 - t0:.1f} s | {n / (t2 - t0):.0f} | {cpu:.1f} s | "
                  f"{cpu / n * 1000:.2f} ms |", flush=True)
        finally:
            d.stop()
