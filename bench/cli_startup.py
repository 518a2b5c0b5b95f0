#!/usr/bin/env python3
"""The CLI's own cost, against task-spooler's (`tsp`, Debian's task-spooler), the lightest queue a
user would compare gpuq with:

  start-up   wall time of `gpuq --version` against `tsp -h`, 300 runs each, alternated, started
             with posix_spawn (goal: <= 1.3x); `/bin/true` shows the floor. subprocess.run adds
             ~3 ms of Python to every run, which hid a 3x difference as 1.0x
  sweep      a script that calls the CLI once per job: N trivial jobs submitted one call each and
             drained, on `fake:8` against `tsp -S 8` (goal: <= 1.3x `tsp -n`), as `gpuq submit -` fed a
             spec and as `gpuq run true` (called as tsp is): `tsp -n` keeps nothing of a
             job, plain `tsp` its output in a file, as gpuq keeps a job's logs and records. Drained:
             for tsp, when a `tsp` listing (asked every 10 ms) shows none queued or running; for
             gpuq, when the last job ended by gpuqd's clock (`gpuq wait` asks every 500 ms)
  gpuqd cpu  the daemon's CPU time over the sweep, per job
  libraries  what `ldd gpuq` lists (goal: no graphics library; cairo is loaded by gpuq-plot-png alone)

The sweep is sensitive to the filesystem: on an ext4 without a journal (as on the CI machines), each
new inode is checked against those deleted in the last seconds, so a run straight after another
(or after a build) is slower; let the machine idle for a minute, or pass --tmp /dev/shm.

Usage: bench/cli_startup.py [--bin build/bin] [--jobs 500] [--rounds 3] [--tmp DIR] [--baseline-bin DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", type=int, default=500)
ap.add_argument("--rounds", type=int, default=3, help="sweeps of each queue, alternated")
ap.add_argument("--baseline-bin", default=None, help="an older gpuq's bin/, whose `logs -f` runs beside")
ap.add_argument("--tmp", default=None, help="where both queues keep their state and logs (default: $TMPDIR); "
                "/dev/shm takes the filesystem out of the comparison")
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)
GPUQ = os.path.join(os.path.abspath(args.bin), "gpuq")

from harness import Daemon  # noqa: E402

if not shutil.which("tsp"):
    sys.exit("cli_startup: needs task-spooler's tsp (apt-get install task-spooler)")


def spawn_times(argvs, runs=300):
    """Wall times (ms) of each argv, run `runs` times, the argvs alternated."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    quiet = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
    times = [[] for _ in argvs]
    for _ in range(runs):
        for argv, out in zip(argvs, times):
            t = time.perf_counter()
            pid = os.posix_spawn(shutil.which(argv[0]), argv, os.environ, file_actions=quiet)
            os.waitpid(pid, 0)
            out.append((time.perf_counter() - t) * 1000)
    os.close(devnull)
    return times


def spread(xs, unit="ms", digits=2):
    """median (p25-p75)"""
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{statistics.median(xs):.{digits}f} {unit} ({q[0]:.{digits}f}-{q[2]:.{digits}f})"


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def tsp_sweep(n, tmp, keep_output):
    env = dict(os.environ, TS_SOCKET=os.path.join(tmp, "tsp.sock"), TMPDIR=tmp)
    subprocess.run(["tsp", "-S", "8"], env=env, check=True)
    t = time.perf_counter()
    for _ in range(n):
        subprocess.run(["tsp", *([] if keep_output else ["-n"]), "true"], env=env, capture_output=True, check=True)
    while True:  # drained: no job queued or running
        out = subprocess.run(["tsp"], env=env, capture_output=True, text=True).stdout
        if not any(w in out for w in (" queued ", " running ")):
            break
        time.sleep(0.01)
    took = time.perf_counter() - t
    subprocess.run(["tsp", "-K"], env=env)
    return took


def gpuq_sweep(n, tmp, form):
    """form "submit": `gpuq submit - --json` fed the spec, as a script would; "run": `gpuq run true`,
    called as tsp is above (the same argv length, output read)."""
    d = Daemon(tmp, gpus="fake:8", extra=["--cpu-slots", "8"]).start()  # 8 at once, as tsp -S 8
    try:
        env = dict(os.environ, GPUQ_SOCKET=d.socket)
        spec = json.dumps({"command": ["true"]})
        t, t_wall = time.perf_counter(), time.time()
        ids = []
        for _ in range(n):
            if form == "run":
                r = subprocess.run([GPUQ, "run", "true"], env=env, capture_output=True, check=True)
                ids.append(int(r.stdout.rsplit(b" ", 1)[1]))  # "submitted batch B: job N"
            else:
                r = subprocess.run([GPUQ, "submit", "-", "--json"], input=spec, env=env, capture_output=True,
                                   text=True, check=True)
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


print(f"| {load()} at the start | | | |")
gpuq_t, tsp_t, floor_t = spawn_times([[GPUQ, "--version"], ["tsp", "-h"], ["true"]])
print(f"| start-up: `gpuq --version` against `tsp -h` (300 each, alternated; `/bin/true`: {spread(floor_t)}) | "
      f"{spread(gpuq_t)} | {spread(tsp_t)} | {statistics.median(gpuq_t) / statistics.median(tsp_t):.2f}x |")
g_runs, cpus, r_runs, r_cpus, s_runs, s_out_runs = [], [], [], [], [], []
for _ in range(args.rounds):  # alternated, so that a burst of other work hits each queue alike
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        g, cpu = gpuq_sweep(args.jobs, tmp, "submit")
        g_runs.append(g), cpus.append(cpu)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        g, cpu = gpuq_sweep(args.jobs, tmp, "run")
        r_runs.append(g), r_cpus.append(cpu)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        s_runs.append(tsp_sweep(args.jobs, tmp, keep_output=False))
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        s_out_runs.append(tsp_sweep(args.jobs, tmp, keep_output=True))


def span(xs, unit="s"):
    return f"{statistics.median(xs):.2f} {unit} ({min(xs):.2f}-{max(xs):.2f})"


g, r, s, s_out, cpu = map(statistics.median, (g_runs, r_runs, s_runs, s_out_runs, cpus))
print(f"| sweep: {args.jobs} trivial jobs, one CLI call each, drained (8 slots), against `tsp -n` "
      f"(median of {args.rounds}, range) | {span(g_runs)} | {span(s_runs)} | {g / s:.2f}x |")
print(f"| the same, `gpuq run true` against `tsp -n true` (both called alike) | {span(r_runs)} | {span(s_runs)} | "
      f"{r / s:.2f}x |")
print(f"| the same against plain `tsp` (each job's output kept in a file) | {span(g_runs)} | {span(s_out_runs)} | {g / s_out:.2f}x |")
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
        return [x * 1000 for x in g], [x * 1000 for x in t]


sw_g, sw_t = submit_and_wait()
print(f"| one job submitted and waited for: `gpuq submit --wait` against `tsp -n` + `tsp -w` (50, "
      f"alternated) | {spread(sw_g, digits=1)} | {spread(sw_t, digits=1)} | "
      f"{statistics.median(sw_g) / statistics.median(sw_t):.2f}x |")


def logs_follow(lines=30):
    """A job prints line i once the benchmark creates gate i; the delay (ms) until each follower
    prints it: gpuq's `logs -f`, `tail -F` on the log itself, an older gpuq's `logs -f`."""
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        d = Daemon(tmp, gpus="fake:2").start()
        env = dict(os.environ, GPUQ_SOCKET=d.socket)
        gate = os.path.join(tmp, "gate")
        shell = (f"for i in $(seq {lines}); do while [ ! -e {gate}$i ]; do sleep 0.001; done; echo line-$i; done")
        job = json.loads(subprocess.run([GPUQ, "submit", "-", "--json"], input=json.dumps({"shell": shell}), env=env,
                                        capture_output=True, text=True, check=True).stdout)["ids"][0]
        while True:
            show = json.loads(subprocess.run([GPUQ, "show", str(job), "--json"], env=env, capture_output=True,
                                             text=True, check=True).stdout)
            if show["logs"]:
                break
            time.sleep(0.01)
        followers = {"gpuq logs -f": [GPUQ, "logs", "-f", str(job)],
                     "tail -F": ["tail", "-n", "+1", "-F", show["logs"][0]["path"]]}
        if args.baseline_bin:
            followers["older gpuq logs -f"] = [os.path.join(args.baseline_bin, "gpuq"), "logs", "-f", str(job)]
        procs = {k: subprocess.Popen(v, env=env, stdout=subprocess.PIPE, text=True) for k, v in followers.items()}
        seen = {k: {} for k in followers}  # line -> when its follower printed it
        done = threading.Condition()

        def read(k):
            for line in procs[k].stdout:
                with done:
                    seen[k][line.strip()] = time.perf_counter()
                    done.notify_all()

        readers = [threading.Thread(target=read, args=(k,), daemon=True) for k in followers]
        for r in readers:
            r.start()
        delays = {k: [] for k in followers}
        try:
            for i in range(1, lines + 1):
                time.sleep(0.05)  # the followers idle, as they would between a job's lines
                t = time.perf_counter()
                open(f"{gate}{i}", "w").close()
                with done:
                    done.wait_for(lambda: all(f"line-{i}" in seen[k] for k in followers), timeout=30)
                for k in followers:
                    delays[k].append((seen[k].get(f"line-{i}", float("nan")) - t) * 1000)
        finally:
            for p in procs.values():
                p.kill()
            d.stop()
        return delays


for who, ms in logs_follow().items():
    print(f"| a line a job prints, until `{who}` shows it (30 lines) | {spread(ms, digits=1)} | | |")
print(f"| {load()} at the end | | | |")
libs = subprocess.run(["ldd", GPUQ], capture_output=True, text=True).stdout.split("\n")
graphics = [l.split()[0] for l in libs if any(k in l for k in ("cairo", "X11", "xcb", "fontconfig", "freetype", "png"))]
linked = "statically linked" if any("statically linked" in l for l in libs) else f"{len([l for l in libs if l.strip()])} libraries"
print(f"| `ldd gpuq`: {linked} | graphics: {', '.join(graphics) or 'none'} | | |")
