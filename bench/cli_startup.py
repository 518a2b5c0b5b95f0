#!/usr/bin/env python3
"""The CLI's own cost, against task-spooler's (`tsp`, Debian's task-spooler), the lightest queue a
user would compare gpuq with:

  start-up   median wall time of `gpuq --version` against `tsp -h`, 300 runs each, started with
             posix_spawn (goal: <= 1.3x); `/bin/true` shows the floor. subprocess.run adds ~3 ms
             of Python to every run, which hid a 3x difference as 1.0x
  sweep      a script that calls the CLI once per job: N trivial jobs submitted one call each and
             drained, on `fake:8` against `tsp -S 8` (goal: <= 1.0x): `tsp -n` keeps nothing of a
             job, plain `tsp` its output in a file, as gpuq keeps a job's logs and records. Drained:
             for tsp, when a `tsp` listing (asked every 10 ms) shows none queued or running; for
             gpuq, when the last job ended by gpuqd's clock (`gpuq wait` asks every 500 ms)
  gpuqd cpu  the daemon's CPU time over the sweep, per job
  libraries  what `ldd gpuq` lists (goal: no graphics library; cairo is loaded by gpuq-plot-png alone)

The sweep is sensitive to the filesystem: on an ext4 without a journal (as on the CI machines), each
new inode is checked against those deleted in the last seconds, so a run straight after another
(or after a build) is slower; let the machine idle for a minute, or pass --tmp /dev/shm.

Usage: bench/cli_startup.py [--bin build/bin] [--jobs 500] [--tmp DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", type=int, default=500)
ap.add_argument("--tmp", default=None, help="where both queues keep their state and logs (default: $TMPDIR); "
                "/dev/shm takes the filesystem out of the comparison")
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)
GPUQ = os.path.join(os.path.abspath(args.bin), "gpuq")

from harness import Daemon  # noqa: E402

if not shutil.which("tsp"):
    sys.exit("cli_startup: needs task-spooler's tsp (apt-get install task-spooler)")


def median_ms(argv, runs=300):
    devnull = os.open(os.devnull, os.O_WRONLY)
    quiet = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
    path = shutil.which(argv[0])
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        pid = os.posix_spawn(path, argv, os.environ, file_actions=quiet)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - t)
    os.close(devnull)
    return statistics.median(times) * 1000


def tsp_sweep(n, tmp, keep_output):
    env = dict(os.environ, TS_SOCKET=os.path.join(tmp, "tsp.sock"), TMPDIR=tmp)
    subprocess.run(["tsp", "-S", "8"], env=env, check=True)
    t = time.perf_counter()
    for _ in range(n):
        subprocess.run(["tsp", *([] if keep_output else ["-n"]), "true"], env=env, stdout=subprocess.DEVNULL, check=True)
    while True:  # drained: no job queued or running
        out = subprocess.run(["tsp"], env=env, capture_output=True, text=True).stdout
        if not any(w in out for w in (" queued ", " running ")):
            break
        time.sleep(0.01)
    took = time.perf_counter() - t
    subprocess.run(["tsp", "-K"], env=env)
    return took


def gpuq_sweep(n, tmp):
    d = Daemon(tmp, gpus="fake:8", extra=["--cpu-slots", "8"]).start()  # 8 at once, as tsp -S 8
    try:
        env = dict(os.environ, GPUQ_SOCKET=d.socket)
        spec = json.dumps({"command": ["true"]})
        t, t_wall = time.perf_counter(), time.time()
        ids = []
        for _ in range(n):
            r = subprocess.run([GPUQ, "submit", "-", "--json"], input=spec, env=env, capture_output=True, text=True,
                               check=True)
            ids += json.loads(r.stdout)["ids"]
        # Drained when the last job ended, by gpuqd's clock: `gpuq wait` asks every 500 ms, which
        # would add up to half a second (tsp's loop below asks every 10 ms).
        r = subprocess.run([GPUQ, "wait", "--json", *map(str, ids)], env=env, capture_output=True, text=True, check=True)
        ended = max(j["ended_at"] for j in json.loads(r.stdout)["jobs"])
        waited = time.perf_counter() - t
        took = min(waited, ended - t_wall)
        stat = open(f"/proc/{d.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        return took, cpu
    finally:
        d.stop()


gpuq_ms, tsp_ms, floor_ms = median_ms([GPUQ, "--version"]), median_ms(["tsp", "-h"]), median_ms(["true"])
print(f"| start-up: `gpuq --version` against `tsp -h` (median of 300; `/bin/true`: {floor_ms:.2f} ms) | "
      f"{gpuq_ms:.2f} ms | {tsp_ms:.2f} ms | {gpuq_ms / tsp_ms:.2f}x |")
with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
    g, cpu = gpuq_sweep(args.jobs, tmp)
with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
    s = tsp_sweep(args.jobs, tmp, keep_output=False)
with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
    s_out = tsp_sweep(args.jobs, tmp, keep_output=True)
print(f"| sweep: {args.jobs} trivial jobs, one CLI call each, drained (8 slots), against `tsp -n` | {g:.2f} s | {s:.2f} s | {g / s:.2f}x |")
print(f"| the same against plain `tsp` (each job's output kept in a file) | {g:.2f} s | {s_out:.2f} s | {g / s_out:.2f}x |")
print(f"| gpuqd's CPU time over the sweep | {cpu:.2f} s ({cpu / args.jobs * 1000:.2f} ms a job) | | |")


def submit_and_wait(n=50):
    """One trivial job submitted and waited for, n times alternated: `gpuq submit --wait` (a table
    when it ends) against `tsp -n true` then `tsp -w` on it; medians in ms."""
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        d = Daemon(tmp, gpus="fake:8", extra=["--cpu-slots", "8"]).start()
        tenv = dict(os.environ, TS_SOCKET=os.path.join(tmp, "tsp.sock"), TMPDIR=tmp)
        subprocess.run(["tsp", "-S", "8"], env=tenv, check=True)
        spec = os.path.join(tmp, "true.json")
        with open(spec, "w") as f:
            json.dump({"command": ["true"]}, f)
        genv = dict(os.environ, GPUQ_SOCKET=d.socket)
        g, t = [], []
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                subprocess.run([GPUQ, "submit", "--wait", spec], env=genv, capture_output=True, check=True)
                g.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                job = subprocess.run(["tsp", "-n", "true"], env=tenv, capture_output=True, text=True, check=True).stdout.strip()
                subprocess.run(["tsp", "-w", job], env=tenv, capture_output=True)
                t.append(time.perf_counter() - t0)
        finally:
            subprocess.run(["tsp", "-K"], env=tenv)
            d.stop()
        return statistics.median(g) * 1000, statistics.median(t) * 1000


sw_g, sw_t = submit_and_wait()
print(f"| one job submitted and waited for: `gpuq submit --wait` against `tsp -n` + `tsp -w` (median of 50, "
      f"alternated) | {sw_g:.1f} ms | {sw_t:.1f} ms | {sw_g / sw_t:.2f}x |")
libs = subprocess.run(["ldd", GPUQ], capture_output=True, text=True).stdout.split("\n")
graphics = [l.split()[0] for l in libs if any(k in l for k in ("cairo", "X11", "xcb", "fontconfig", "freetype", "png"))]
linked = "statically linked" if any("statically linked" in l for l in libs) else f"{len([l for l in libs if l.strip()])} libraries"
print(f"| `ldd gpuq`: {linked} | graphics: {', '.join(graphics) or 'none'} | | |")
