#!/usr/bin/env python3
"""What a Prometheus scrape costs gpuqd with a deep queue: N jobs in line (behind a job holding
every GPU), then the time of GET /metrics, median and worst of 15, each over half a second apart
(gpuqd renders at most twice a second, and a scrape within that is answered from the last one).

Usage: bench/metrics_scrape.py [--bin build/bin] [--jobs 1000,10000,100000]
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", default="1000,10000,100000")
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)

from harness import Daemon  # noqa: E402

for n in map(int, args.jobs.split(",")):
    tmp = tempfile.mkdtemp(prefix="gpuq-bench-metrics-")
    d = Daemon(tmp, "fake:2", extra=["--metrics-listen", "127.0.0.1:0"]).start()
    try:
        port = int(re.findall(r"metrics at http://127\.0\.0\.1:(\d+)/", open(os.path.join(tmp, "gpuqd.log")).read())[-1])
        d.submit({"name": "holder", "gpus": 2, "command": ["sleep", "3600"]})
        for part in range(0, n, 5000):  # a request line is at most 1 MiB
            batch = [{"name": f"q{i}", "gpus": 1, "command": ["true"]} for i in range(part, min(n, part + 5000))]
            r = d.run("submit", "-", input=json.dumps(batch), timeout=600)
            assert r.returncode == 0, r.stderr
        times, size = [], 0
        for _ in range(15):
            time.sleep(0.6)
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
                text = r.read().decode()
            times.append(time.perf_counter() - t0)
        queued = sum(float(v) for v in re.findall(r'^gpuq_jobs\{state="queued",[^}]*\} (\S+)$', text, re.M))
        assert queued == n, (queued, n)
        size = len(text)
        print(f"{n:>7} queued: scrape median {statistics.median(times) * 1e3:.1f} ms, worst {max(times) * 1e3:.1f} ms, "
              f"{size} bytes")
    finally:
        d.stop()
