#!/usr/bin/env python3
"""Memory given back: gpuqd's resident set fresh, with N held jobs, and after they were cancelled
(goal, issue 39: within 2x a fresh gpuqd's once nothing is queued or running). gpuqd looks at its
heap every 10 s (daemon/heap_trim.hpp), so the last figure is read up to 25 s after the cancel.

With --run the jobs (`true`, on 8 fake GPUs) run to their end instead of being cancelled.

Usage: bench/memory_return.py [--bin build/bin] [--jobs 99856] [--tmp /dev/shm] [--run]   (a square: a matrix)
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", type=int, default=316 * 316)
ap.add_argument("--tmp", default=None)
ap.add_argument("--run", action="store_true", help="run the jobs to their end instead of cancelling them")
args = ap.parse_args()
bindir = os.path.abspath(args.bin)
tmp = tempfile.mkdtemp(prefix="gpuq-memory-", dir=args.tmp)
sock = os.path.join(tmp, "gpuqd.sock")
daemon = subprocess.Popen([os.path.join(bindir, "gpuqd"), "--foreground", "--socket", sock, "--state-dir",
                           os.path.join(tmp, "state"), "--gpus", "fake:8"], stderr=subprocess.DEVNULL)


def gpuq(*a, **kw):
    return subprocess.run([os.path.join(bindir, "gpuq"), "--socket", sock, *a], capture_output=True, text=True, **kw)


def rss_mib():
    with open(f"/proc/{daemon.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def status():
    return json.loads(gpuq("status", "--json", "-q", "0", "-n", "0").stdout)


def queued():
    return status()["queued_total"]


def active():  # queued or running
    s = status()
    return s["queued_total"] + sum(1 for j in s["jobs"] if j["state"] == "running")


try:
    while gpuq("daemon", "status").returncode != 0:
        time.sleep(0.02)
    fresh = rss_mib()
    # One spec with a matrix: N jobs in one request of a few KiB (a list of N would pass a request's 1 MiB).
    side = int(args.jobs ** 0.5)
    assert side * side == args.jobs, "--jobs must be a square"
    spec = {"name": "m-{a}-{b}", "command": ["true"], "gpus": 1, "matrix": {"a": list(range(side)), "b": list(range(side))}}
    r = gpuq("submit", "-", "--json", "--hold", input=json.dumps(spec))
    assert r.returncode == 0, r.stderr
    batch = json.loads(r.stdout)["batch"]
    while queued() < args.jobs:
        time.sleep(0.2)
    held = rss_mib()
    gpuq("release" if args.run else "cancel", "--batch", str(batch))
    while active() > 0:
        time.sleep(0.2)
    cancelled = rss_mib()
    t0 = time.time()
    while rss_mib() > 2 * fresh and time.time() - t0 < 25:
        time.sleep(0.5)
    after = rss_mib()
    print(f"| gpuqd's resident set, {args.jobs} jobs | fresh {fresh:.0f} MiB | held {held:.0f} MiB | "
          f"just {'ended' if args.run else 'cancelled'} {cancelled:.0f} MiB | {time.time() - t0:.1f} s later {after:.0f} MiB ({after / fresh:.1f}x fresh) |")
finally:
    daemon.terminate()
    daemon.wait()
    shutil.rmtree(tmp, ignore_errors=True)
