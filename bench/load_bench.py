#!/usr/bin/env python3
"""gpuqd under load, and with a large history.

1. 50 concurrent clients x 200 mixed requests (submit into a held queue, status, show, cancel),
   each on its own connection (tests/integration/loadgen.py): latency p50/p99/max, errors,
   daemon memory.
2. 100,000 finished jobs in the history (one real finished job cloned in the store while the
   daemon is stopped): `gpuq status` latency, and `gpuq status --all --json` time and peak memory
   of the daemon and of the CLI.

Usage: bench/load_bench.py [--bin build/bin] [--clients 50] [--requests 200] [--history 100000]
"""
import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--clients", type=int, default=50)
ap.add_argument("--requests", type=int, default=200)
ap.add_argument("--history", type=int, default=100000)
ap.add_argument("--samples", type=int, default=50)
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)

from harness import Daemon  # noqa: E402
from loadgen import rss_kib, run_load  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


tmp = tempfile.mkdtemp(prefix="gpuq-bench-")
d = Daemon(tmp, "fake:8").start()
try:
    blocker = d.submit({"name": "blocker", "shell": "sleep 3600"})["ids"][0]
    rss0 = rss_kib(d.proc.pid)
    load = run_load(d.socket, args.clients, args.requests, blocker)
    lat = load["latencies_ms"]
    print(f"machine: {os.cpu_count()} cores")
    print(f"\n{args.clients} clients x {args.requests} mixed requests: {len(lat)} answered, "
          f"{len(load['errors'])} errors, {len(lat) / load['seconds']:.0f} requests/s")
    print(f"  latency ms: p50 {statistics.median(lat):.2f}, p99 {pct(lat, 99):.2f}, max {max(lat):.2f}")
    print(f"  gpuqd RSS: {rss0 / 1024:.1f} MiB before, {rss_kib(d.proc.pid) / 1024:.1f} MiB after, "
          f"peak {rss_kib(d.proc.pid, 'VmHWM') / 1024:.1f} MiB")
    d.ok("cancel", str(blocker))
    done = d.submit({"name": "finished", "command": ["true"]})["ids"][0]
    d.wait([done])
    d.stop()

    # Clone the finished job until the history holds args.history jobs.
    db = sqlite3.connect(os.path.join(d.state, "gpuq.db"))
    have = db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    cols = [r[1] for r in db.execute("PRAGMA table_info(jobs)") if r[1] != "id"]
    db.execute(f"""WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < ?)
                   INSERT INTO jobs({','.join(cols)}) SELECT {','.join(cols)} FROM jobs, n WHERE jobs.id = ?""",
               (args.history - have, done))
    db.commit()
    db.close()

    d.start()
    times = []
    for _ in range(args.samples):
        t0 = time.perf_counter()
        r = d.run("status")
        times.append((time.perf_counter() - t0) * 1000)
        assert r.returncode == 0, r.stderr
    total = d.json("status", "-n", "0")["total"]
    print(f"\n{total} jobs in history:")
    print(f"  gpuq status: median {statistics.median(times):.1f} ms, p99 {pct(times, 99):.1f} ms")
    hwm0 = rss_kib(d.proc.pid, "VmHWM")
    # The CLI runs under a fresh interpreter that reports its only child's peak memory.
    measure = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
               "out = subprocess.run(sys.argv[1:], capture_output=True, check=True).stdout; "
               "sys.stderr.write(f'{time.perf_counter() - t} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}'); "
               "sys.stdout.buffer.write(out)")
    r = subprocess.run([sys.executable, "-c", measure, os.path.join(args.bin, "gpuq"), "--socket", d.socket,
                        "status", "--all", "--json"], capture_output=True, text=True, check=True)
    out = r.stdout
    seconds, cli_peak = float(r.stderr.split()[0]), int(r.stderr.split()[1])
    doc = json.loads(out)
    assert len(doc["jobs"]) == total == doc["total"], (len(doc["jobs"]), total)
    print(f"  gpuq status --all --json: {seconds:.2f} s, {len(out) / 2**20:.1f} MiB of JSON, "
          f"gpuq peak RSS {cli_peak / 1024:.1f} MiB, "
          f"gpuqd peak RSS {hwm0 / 1024:.1f} -> {rss_kib(d.proc.pid, 'VmHWM') / 1024:.1f} MiB")
finally:
    d.stop()
