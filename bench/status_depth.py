#!/usr/bin/env python3
"""`status` with a deep queue, against task-spooler's `tsp -l` with as many jobs queued (goals,
issue 39: `gpuq status` within 3x `tsp -l`; `gpuq status --json`, its first page, <= 50 ms).

gpuqd gets N held jobs (one matrix submit; held, so none runs and the queue stays N deep);
task-spooler gets one job that blocks on a file (`tsp -S 1`) and --tsp-jobs `true` jobs queued
behind it (default 900: each job queued in task-spooler is a process of its own waiting to be
told to run, and it serves at most 1,000 at once: a 1,000th waits for ever).
Then each listing runs --runs times, alternated, started with posix_spawn, its output to
/dev/null; each figure is a median with the middle half (p25-p75). The load average is printed
before and after.

Usage: bench/status_depth.py [--bin build/bin] [--jobs 99856] [--tsp-jobs 900] [--runs 30] [--tmp /dev/shm]
       (--jobs: a square)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", type=int, default=316 * 316)
ap.add_argument("--tsp-jobs", type=int, default=900)
ap.add_argument("--runs", type=int, default=30)
ap.add_argument("--tmp", default=None)
args = ap.parse_args()
if not shutil.which("tsp"):
    raise SystemExit("status_depth: needs task-spooler's tsp (apt-get install task-spooler)")
bindir = os.path.abspath(args.bin)
GPUQ = os.path.join(bindir, "gpuq")
tmp = tempfile.mkdtemp(prefix="gpuq-status-", dir=args.tmp)
sock = os.path.join(tmp, "gpuqd.sock")
tenv = dict(os.environ, TS_SOCKET=os.path.join(tmp, "tsp.sock"), TMPDIR=tmp)
daemon = subprocess.Popen([os.path.join(bindir, "gpuqd"), "--foreground", "--socket", sock, "--state-dir",
                           os.path.join(tmp, "state"), "--gpus", "fake:8"], stderr=subprocess.DEVNULL)


def gpuq(*a, **kw):
    return subprocess.run([GPUQ, "--socket", sock, *a], capture_output=True, text=True, **kw)


def times_ms(argvs, env):
    devnull = os.open(os.devnull, os.O_WRONLY)
    quiet = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
    out = [[] for _ in argvs]
    for _ in range(args.runs):
        for argv, t in zip(argvs, out):
            start = time.perf_counter()
            pid = os.posix_spawn(shutil.which(argv[0]), argv, env, file_actions=quiet)
            os.waitpid(pid, 0)
            t.append((time.perf_counter() - start) * 1000)
    os.close(devnull)
    return out


def spread(xs):
    q = statistics.quantiles(xs, n=4)
    return f"{statistics.median(xs):.1f} ms ({q[0]:.1f}-{q[2]:.1f})"


try:
    print("| load average %.2f %.2f %.2f at the start | | |" % os.getloadavg())
    while gpuq("daemon", "status").returncode != 0:
        time.sleep(0.02)
    side = int(args.jobs ** 0.5)
    assert side * side == args.jobs, "--jobs must be a square"
    spec = {"name": "m-{a}-{b}", "command": ["true"], "matrix": {"a": list(range(side)), "b": list(range(side))}}
    r = gpuq("submit", "-", "--json", "--hold", input=json.dumps(spec))
    assert r.returncode == 0, r.stderr
    while json.loads(gpuq("status", "--json", "-q", "0").stdout)["queued_total"] < args.jobs:
        time.sleep(0.2)
    gate = os.path.join(tmp, "gate")
    subprocess.run(["tsp", "-S", "1"], env=tenv, check=True)
    subprocess.run(["tsp", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done"], env=tenv, check=True,
                   capture_output=True)
    for _ in range(args.tsp_jobs):
        subprocess.run(["tsp", "-n", "true"], env=tenv, check=True, capture_output=True)
    env = dict(os.environ, GPUQ_SOCKET=sock, **{k: tenv[k] for k in ("TS_SOCKET", "TMPDIR")})
    status, status_json, tsp_l = times_ms([[GPUQ, "status"], [GPUQ, "status", "--json"], ["tsp", "-l"]], env)
    first = json.loads(gpuq("status", "--json").stdout)
    print(f"| `gpuq status` with {args.jobs} queued, against `tsp -l` with {args.tsp_jobs} ({args.runs} each, alternated) | "
          f"{spread(status)} | {spread(tsp_l)} | {statistics.median(status) / statistics.median(tsp_l):.2f}x |")
    print(f"| `gpuq status --json` ({len(first['jobs'])} jobs, `more`: {first['more']}) | {spread(status_json)} | | |")
    print("| load average %.2f %.2f %.2f at the end | | |" % os.getloadavg())
finally:
    open(os.path.join(tmp, "gate"), "w").close()
    subprocess.run(["tsp", "-K"], env=tenv, capture_output=True)
    daemon.terminate()
    daemon.wait()
    shutil.rmtree(tmp, ignore_errors=True)
