#!/usr/bin/env python3
"""Cleaning a long history: does `gpuq clean` stall gpuqd while it deletes?

Runs N × a job that writes a log and a small checkpoint (a gpuqd on fake:8), then times
`gpuq clean --older-than 0` while another client asks `gpuq status` over and over, and reports
the clean's time and the slowest status answer during it. gpuqd deletes on a thread of its own,
so the slowest answer should stay near an idle one, not grow with N. With --forget it times
`gpuq clean --forget --older-than 0`, which also deletes the jobs' rows (one transaction on
gpuqd's thread) and checks that the store file's pages are reused by the next N jobs.

Usage: bench/clean.py [--bin build/bin] [--jobs 1000,5000] [--forget]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", default="1000,5000")
ap.add_argument("--forget", action="store_true")
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)

from harness import Daemon  # noqa: E402

JOB = 'echo trained; head -c 4096 /dev/zero > "$GPUQ_CHECKPOINT_DIR/model.pt"'

print("| jobs | clean | freed | status, idle | status, slowest during the clean |" +
      (" store after N jobs → forget → N more (file + WAL) |" if args.forget else ""))
print("|---|---|---|---|---|" + ("---|" if args.forget else ""))
for n in map(int, args.jobs.split(",")):
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(tmp, gpus="fake:8").start()
        db = os.path.join(d.state, "gpuq.db")

        def run_all():
            batch = d.submit([{"shell": JOB, "gpus": 1} for _ in range(n)])["batch"]
            d.ok("wait", "--batch", str(batch), "--json", timeout=7200)
            return sum(os.path.getsize(db + suffix) for suffix in ("", "-wal") if os.path.exists(db + suffix))

        try:
            size_before = run_all()

            def status_time():
                t = time.monotonic()
                d.ok("status", "--json", "-n", "1")
                return time.monotonic() - t

            idle = min(status_time() for _ in range(5))
            slowest, stop = [0.0], threading.Event()

            def poll():
                while not stop.is_set():
                    slowest[0] = max(slowest[0], status_time())

            poller = threading.Thread(target=poll)
            t0 = time.monotonic()
            poller.start()
            forget = ["--forget"] if args.forget else []
            out = json.loads(d.ok("clean", "--older-than", "0", "--json", *forget, timeout=3600))
            took = time.monotonic() - t0
            stop.set()
            poller.join()
            assert len(out["cleaned"]) == n, out
            row = (f"| {n} | {took:.2f} s | {out['bytes_freed'] / 2**20:.1f} MiB | {idle * 1000:.0f} ms | "
                   f"{slowest[0] * 1000:.0f} ms |")
            if args.forget:
                assert len(out["forgotten"]) == n and d.json("status", "--all")["jobs"] == [], out
                size_after = run_all()
                row += f" {size_before / 2**20:.1f} → {size_after / 2**20:.1f} MiB |"
            print(row, flush=True)
        finally:
            d.stop()
            subprocess.run(["pkill", "-f", f"gpuq-shim {tmp}/"])
