#!/usr/bin/env python3
"""Heavy requests against one client's latency: while one client sends a request that makes gpuqd
work hard, another times `hello` on its own connection over and over. gpuqd serves everyone on one
thread, so the slowest hello is how long the heavy request held everyone else up. Each request
here once froze gpuqd for seconds to minutes (docs/reliability.md, "Untrusted input"); replies
are now bounded and the store's lookups indexed.

  status-queued   `status --json` with N queued jobs (the reply's queued list is capped)
  results-repeat  `results` naming one job with a 900 KB result 1,000 times (ids deduplicated)
  results-batch   one page of `results` for a batch of N jobs
  restart-chain   `restart` of the head of a failed chain of N jobs (each `after` the previous),
                  N jobs more in the store; also times the chain's failing (the submit, then
                  the head's failure failing the rest)
  submit-matrix   `submit` of one spec with a matrix of --submit-jobs jobs (100,000: the most a
                  batch may hold), held
  clean-forget    `clean --forget` of the N jobs of a cancelled batch

Usage: bench/heavy_requests.py [--bin build/bin] [--jobs 20000]
"""
import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", type=int, default=20000)
ap.add_argument("--submit-jobs", type=int, default=100000)
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)

from harness import Daemon, wait_until  # noqa: E402


def line_client(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rwb")
    return s, f


def ask(f, req):
    f.write((json.dumps(req) + "\n").encode())
    f.flush()
    return f.readline()


class HelloPoller:
    """Times `hello` on a connection of its own, over and over, while the block runs: `slowest`."""

    def __init__(self, d):
        self.d, self.slowest, self.stop = d, 0.0, threading.Event()

    def __enter__(self):
        self.sock, f = line_client(self.d.socket)

        def poll():
            while not self.stop.is_set():
                t = time.monotonic()
                ask(f, {"cmd": "hello", "protocol_version": 1})
                self.slowest = max(self.slowest, time.monotonic() - t)

        self.thread = threading.Thread(target=poll)
        self.thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def timed(d, req):
    """(seconds the request took, reply bytes, slowest hello meanwhile)"""
    s, f = line_client(d.socket)
    with HelloPoller(d) as hello:
        t = time.monotonic()
        reply = ask(f, req)
        took = time.monotonic() - t
    s.close()
    return took, len(reply), hello.slowest


def report(name, took, size, slowest):
    print(f"| {name} | {took * 1000:.0f} ms | {size / 1e6:.2f} MB | {slowest * 1000:.0f} ms |", flush=True)


n = args.jobs
print(f"N = {n}\n\n| request | took | reply | slowest hello meanwhile |\n|---|---|---|---|")
with tempfile.TemporaryDirectory() as tmp:
    d = Daemon(tmp, gpus="fake:1").start()
    try:
        big = d.submit({"command": ["python3", "-c", "import json,os; open(os.environ['GPUQ_EVENTS'],'a')"
                                    ".write(json.dumps({'type':'result','blob':'x'*900000})+'\\n')"]})["ids"][0]
        d.wait([big])
        report("results-repeat (1 job × 1,000)", *timed(d, {"cmd": "results", "ids": [big] * 1000}))
        batch = d.submit([{"shell": "true", "name": f"q{i}"} for i in range(n)], "--hold")["batch"]
        report(f"status-queued ({n} queued)", *timed(d, {"cmd": "status", "queued": -1}))
        report(f"results-batch ({n} jobs, one page)", *timed(d, {"cmd": "results", "batch": batch}))
        d.ok("cancel", "--batch", str(batch))
        # A chain whose head fails: every job after it fails in turn, waiting for the one before.
        chain = [{"name": "c0", "shell": "exit 1"}] + \
                [{"name": f"c{i}", "shell": "true", "after": [f"c{i - 1}"]} for i in range(1, n)]
        with HelloPoller(d) as hello:
            t = time.monotonic()
            ids = d.submit(chain)["ids"]
            wait_until(lambda: d.show(ids[-1])["job"]["state"] == "failed", timeout=3600, interval=0.5,
                       what="the chain to fail")
            took = time.monotonic() - t
        print(f"| (the chain of {n} failing, submit to last failure) | {took:.1f} s | | {hello.slowest * 1000:.0f} ms |")
        report(f"restart-chain ({n} jobs, {2 * n + 1} in the store)", *timed(d, {"cmd": "restart", "ids": [ids[0]]}))
        d.ok("cancel", *map(str, ids))
        m = args.submit_jobs
        matrix = {"name": "m{i}-{j}", "command": ["true"], "matrix": {"i": list(range(m // 100)), "j": list(range(100))}}
        took, size, slowest = timed(d, {"cmd": "submit", "jobs": matrix, "cwd": tmp, "env": {"PATH": os.environ["PATH"]},
                                        "hold": True})
        assert size > 1000, "the submit was refused"
        report(f"submit-matrix ({m} jobs)", took, size, slowest)
        report(f"clean-forget ({n} jobs of a batch)", *timed(d, {"cmd": "clean", "batch": batch, "forget": True}))
    finally:
        d.stop()
