#!/usr/bin/env python3
"""Time from an urgent submit to its start, with preemption against without (docs/preemption.md).

On `fake:2`, a low-priority 2-GPU job trains for --train-s seconds (a loop that saves its step to
$GPUQ_CHECKPOINT_DIR on SIGTERM and resumes from it); once it runs, a 1-GPU job of priority 10 is
submitted. Measured by gpuqd's own clock: the urgent job's start minus the moment `gpuq submit`
was called, and the low job's whole wall time (submit to end), in two setups:

  preempt   the low job is `preemptible`: it is stopped, checkpoints, and resumes after the urgent
            job (goal: the urgent job starts within the victim's save time plus ~0.5 s)
  wait      it is not: the urgent job waits for its end (as with every single-box queue without
            preemption: pueue, task-spooler)
  suspend   the same on CPU slots (gpuqd --cpu-slots 1): a low job without GPUs, `preemptible`, and an
            urgent one without GPUs, which freezes it in place (its cgroup's freezer) and runs on
            its slot; the low job is thawed after, nothing redone (needs a cgroup freezer)

Also the work the victim redoes: steps done twice (0 with a checkpoint on the signal).

Usage: bench/preemption.py [--bin build/bin] [--rounds 5] [--train-s 10]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--train-s", type=float, default=10.0, help="the low job's training time, uninterrupted")
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)

from harness import Daemon, wait_until  # noqa: E402

# 100 steps of train_s/100 each; the step count saved on SIGTERM, each step logged once.
TRAINER = r'''
ck="$GPUQ_CHECKPOINT_DIR/step"; s=0; [ -f "$ck" ] && s=$(cat "$ck")
trap 'echo "$s" > "$ck"; echo "{{\"type\": \"checkpoint\", \"step\": $s}}" >> "$GPUQ_EVENTS"; exit 143' TERM
touch {started}-$GPUQ_ATTEMPT
while [ "$s" -lt 100 ]; do sleep {step_s}; s=$((s + 1)); echo "$s" >> {log}; done
'''


def one(d, tmp, setup, n):
    started, log = os.path.join(tmp, f"started{n}"), os.path.join(tmp, f"steps{n}")
    shell = TRAINER.format(started=started, log=log, step_s=args.train_s / 100)
    gpus = 0 if setup == "suspend" else 2
    t_low = time.time()
    low = d.submit({"name": f"low{n}", "gpus": gpus, "preemptible": setup != "wait", "shell": shell})["ids"][0]
    wait_until(lambda: os.path.exists(started + "-1"), timeout=60, what="the low job to start")
    time.sleep(args.train_s * 0.2)  # a fifth of its training done
    t_submit = time.time()
    urgent = d.submit({"name": f"urgent{n}", "gpus": min(gpus, 1), "priority": 10, "command": ["true"]})["ids"][0]
    done = d.wait([low, urgent], timeout=args.train_s * 10 + 60)
    assert all(j["state"] == "succeeded" for j in done.values()), done
    with open(log) as f:
        steps = f.read().split()
    return {"urgent_wait_s": done[urgent]["started_at"] - t_submit, "low_total_s": done[low]["ended_at"] - t_low,
            "redone_steps": len(steps) - len(set(steps)), "preemptions": done[low]["preemptions"],
            "suspensions": done[low]["suspensions"]}


def main():
    results = {"preempt": [], "wait": [], "suspend": []}
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-preempt-") as tmp:
        d = Daemon(tmp, "fake:2", extra=["--cpu-slots", "1"]).start()
        try:
            for n in range(args.rounds):
                for setup in results:
                    results[setup].append(one(d, tmp, setup, f"{setup}{n}"))
        finally:
            d.stop()
    print(f"preemption bench: fake:2, a 2-GPU job of {args.train_s:g} s, an urgent 1-GPU job after a fifth of it "
          f"(suspend: both without GPUs, one CPU slot); {args.rounds} rounds, medians")
    for setup in results:
        rows = results[setup]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"  {setup:8} urgent job waited {med['urgent_wait_s']:.3f} s (max {max(r['urgent_wait_s'] for r in rows):.3f}), "
              f"low job took {med['low_total_s']:.2f} s in all, steps redone {med['redone_steps']:g}, "
              f"preemptions {med['preemptions']:g}, suspensions {med['suspensions']:g}")
    ratio = statistics.median(r["urgent_wait_s"] for r in results["wait"]) / max(
        1e-9, statistics.median(r["urgent_wait_s"] for r in results["preempt"]))
    print(f"  the urgent job starts {ratio:.0f}x sooner with preemption")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
