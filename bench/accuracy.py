#!/usr/bin/env python3
"""Fashion-MNIST test accuracy of gpuq-worker's built-in models against the dataset's published
benchmark table (MLP 256-128-100 about 0.883; 2 conv + pooling 0.876-0.916; 2 conv + pooling +
batch norm about 0.934). Runs gpuq-worker directly, one configuration after another.

Usage: bench/accuracy.py [--bin build/bin] [--only mlp,cnn,cnn-bn] [--epochs N] [--limit N]
                         [--device auto|cpu|cuda] [--seeds 0,1,2]
--epochs and --limit (training images) shorten it for a dry run; the targets then do not apply.
--seeds trains each configuration once per seed (the train section's seed: initial weights and
the order of batches) and adds each configuration's mean, minimum and how many seeds met it.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

CONFIGS = {
    # name: (model, optimizer, epochs, target)
    "mlp": ({"kind": "mlp", "hidden": [256, 128, 100]}, {"kind": "adam", "lr": 1e-3}, 15, 0.88),
    "cnn": ({"kind": "cnn", "channels": [32, 64], "hidden": [128], "dropout": 0.25},
            {"kind": "adam", "lr": 1e-3}, 15, 0.91),
    "cnn-bn": ({"kind": "cnn", "channels": [32, 64], "hidden": [128], "batch_norm": True, "dropout": 0.25},
               {"kind": "adamw", "lr": 1e-3, "weight_decay": 0.05}, 20, 0.93),
}

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "../build/bin"))
ap.add_argument("--only", default="mlp,cnn,cnn-bn")
ap.add_argument("--epochs", type=int, default=0, help="override every configuration's epochs")
ap.add_argument("--limit", type=int, default=0, help="train on the first N images only (0: all 60,000)")
ap.add_argument("--device", default="auto")
ap.add_argument("--seeds", default="0", help="comma-separated train seeds, one run each")
args = ap.parse_args()
seeds = [int(x) for x in args.seeds.split(",")]

rows = []
for name, seed in [(n, s) for n in args.only.split(",") for s in seeds]:
    model, optimizer, epochs, target = CONFIGS[name]
    epochs = args.epochs or epochs
    dataset = {"kind": "fashion-mnist", **({"limit": args.limit} if args.limit else {})}
    train = {"dataset": dataset, "model": model, "optimizer": optimizer, "epochs": epochs,
             "batch_size": 128, "schedule": {"kind": "cosine"}, "checkpoint_every": 0, "device": args.device,
             "seed": seed}
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as events:
        t0 = time.time()
        subprocess.run([os.path.join(args.bin, "gpuq-worker"), "--train", json.dumps(train)], check=True,
                       env=dict(os.environ, GPUQ_EVENTS=events.name), stdout=subprocess.DEVNULL)
        wall = time.time() - t0
        lines = [json.loads(l) for l in open(events.name)]
    result = [l for l in lines if l["type"] == "result"][-1]
    per_epoch = [l["test_accuracy"] for l in lines if l["type"] == "progress" and "test_accuracy" in l]
    rows.append((name, seed, epochs, result["test_accuracy"], max(per_epoch), target, result["device"], wall))
    print(f"{name} seed {seed}: {result['test_accuracy']:.4f} after {epochs} epochs ({wall:.0f} s on {result['device']})",
          flush=True)

print(f"\n{'model':<8}{'seed':>5}{'epochs':>7}{'final':>8}{'best':>8}{'target':>8}  {'met':<4}{'device':<8}{'seconds':>8}")
for name, seed, epochs, acc, best, target, device, wall in rows:
    print(f"{name:<8}{seed:>5}{epochs:>7}{acc:>8.4f}{best:>8.4f}{target:>8.2f}  {'yes' if acc >= target else 'no':<4}"
          f"{device:<8}{wall:>8.0f}")
if len(seeds) > 1:
    print()
    for name in args.only.split(","):
        accs = [r[3] for r in rows if r[0] == name]
        target = CONFIGS[name][3]
        print(f"{name}: mean {sum(accs) / len(accs):.4f}, min {min(accs):.4f}, max {max(accs):.4f}; "
              f"{sum(a >= target for a in accs)} of {len(accs)} seeds met {target}")
