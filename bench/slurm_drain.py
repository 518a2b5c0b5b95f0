#!/usr/bin/env python3
"""gpuq on Slurm against Slurm alone: N one-GPU jobs submitted through `gpuqd --executor slurm`
(one `gpuq submit` of the whole batch) and with a plain shell-style loop of `sbatch`, each drained
on the same emulated cluster (tests/slurm/start-slurm.sh: two nodes of 4 GPUs and 4 cores, so 8 jobs
at once). Each job is `true`, so the time is Slurm's and its clients', not the jobs'.

  drain          from the first submission until no job is left in Slurm's queue (and, for gpuq,
                 until `gpuq wait` says every job ended)
  slurmctld cpu  the controller's CPU time over the drain: what each way of submitting costs Slurm
                 (gpuq adds one `squeue` every --slurm-poll seconds, never one per job)
  gpuqd cpu      gpuqd's own CPU time over the drain (sbatch, squeue and scontrol run as children
                 of a thread of its own and are counted in the next column)
  clients cpu    CPU time of the Slurm client commands gpuqd ran (children of gpuqd) or the loop ran

gpuq's jobs are sbatch'ed with --export=NONE (a job's environment is its spec's over the user's login
environment on the node, never gpuqd's), under which Slurm runs the user's login profile on the node
for every job; the loop is measured both without and with it.

Needs root (slurmd) and Debian's slurm-wlm. Usage: bench/slurm_drain.py [--jobs 1000] [--bin build/bin]
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--jobs", type=int, default=1000)
ap.add_argument("--poll", type=float, default=2.0, help="gpuqd --slurm-poll (its default: 2 s)")
ap.add_argument("--gpuq-only", action="store_true", help="leave out the sbatch loops")
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)

from harness import Daemon  # noqa: E402

if not shutil.which("slurmctld") or os.geteuid() != 0:
    sys.exit("slurm_drain: needs Debian's slurm-wlm and root (slurmd)")
START = os.path.join(HERE, "../tests/slurm/start-slurm.sh")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """utime + stime of a process, and of its waited-for children, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / TICK, (int(stat[13]) + int(stat[14])) / TICK


def queue_empty():
    return not subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=120).stdout.strip()


def run_on_fresh_slurm(tmp, measure):
    """Starts a two-node Slurm in `tmp`, runs `measure(ctld_pid)`, stops it; returns what it returned."""
    conf = subprocess.run([START, os.path.join(tmp, "slurm")], capture_output=True, text=True, check=True,
                          env=dict(os.environ, NODES="2", GPUS="4", CPUS="4")).stdout.strip()
    os.environ["SLURM_CONF"] = conf
    try:
        with open(os.path.join(tmp, "slurm", "slurmctld.pid")) as f:
            return measure(int(f.read()))
    finally:
        subprocess.run([START, "--stop", os.path.join(tmp, "slurm")])
        time.sleep(1)


def sbatch_loop(ctld, export_none=False):
    out = tempfile.mkdtemp()
    script = os.path.join(out, "job.sbatch")
    with open(script, "w") as f:
        f.write(f"#!/bin/bash\n#SBATCH --gpus-per-node=1 --ntasks-per-node=1 --nodes=1 --output={out}/%j.out\n"
                + ("#SBATCH --export=NONE\n" if export_none else "") + "true\n")
    ctld0 = sum(cpu_s(ctld))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    for _ in range(args.jobs):
        subprocess.run(["sbatch", "--parsable", script], check=True, capture_output=True, timeout=120)
    submitted = time.perf_counter() - t
    while not queue_empty():
        time.sleep(0.5)
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    clients = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, submitted, sum(cpu_s(ctld)) - ctld0, None, clients


def gpuq_batch(ctld):
    tmp = tempfile.mkdtemp()
    d = Daemon(tmp, gpus="none", extra=["--executor", "slurm", "--slurm-poll", str(args.poll)]).start()
    try:
        ctld0 = sum(cpu_s(ctld))
        t = time.perf_counter()
        ids = d.submit([{"name": f"j{i}", "command": ["true"], "gpus": 1} for i in range(args.jobs)])["ids"]
        submitted = time.perf_counter() - t
        done = d.wait(ids, timeout=3600)
        took = time.perf_counter() - t
        failed = [i for i in ids if done[i]["state"] != "succeeded"]
        if failed:
            sys.exit(f"slurm_drain: {len(failed)} jobs did not succeed, e.g. {done[failed[0]]}")
        own, children = cpu_s(d.proc.pid)
        return took, submitted, sum(cpu_s(ctld)) - ctld0, own, children
    finally:
        d.stop()


rows = []
ways = [("a loop of `sbatch`", sbatch_loop),
        ("a loop of `sbatch --export=NONE` (the user's login environment loaded on the node, as gpuq's jobs)",
         lambda ctld: sbatch_loop(ctld, export_none=True)),
        ("gpuq: one `gpuq submit`, gpuqd --executor slurm", gpuq_batch)]
for name, measure in ways[2:] if args.gpuq_only else ways:
    with tempfile.TemporaryDirectory() as tmp:
        rows.append((name, run_on_fresh_slurm(tmp, measure)))
print(f"| {args.jobs} one-GPU `true` jobs, 2 nodes x 4 GPUs | drain | submitted after | slurmctld CPU | gpuqd CPU | "
      "Slurm clients' CPU |")
print("|---|---|---|---|---|---|")
for name, (took, submitted, ctld, own, clients) in rows:
    own_s = "" if own is None else f"{own:.2f} s"
    print(f"| {name} | {took:.1f} s | {submitted:.1f} s | {ctld:.2f} s | {own_s} | {clients:.2f} s |")
