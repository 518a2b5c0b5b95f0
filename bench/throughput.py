#!/usr/bin/env python3
"""Training throughput of gpuq-worker (C++/LibTorch) against the same training written as an
eager PyTorch loop in Python, on the same device: same model (MLP 784-256-128-10), optimiser
(Adam), batch sizes, data held on the device, one process. Each side runs alone and as a 1-rank
DDP gang (NCCL on CUDA, Gloo on the CPU). Samples/s count the training steps of every epoch
(evaluation excluded) on both sides; neither side reads the loss back every step. A third row
per batch size runs gpuq-worker with LibTorch's one-parameter-at-a-time Adam (`foreach: false`);
on CUDA a fourth replays each step's forward and backward passes from a CUDA graph
(`cuda_graph: on`), against the same eager Python loop.

One command does it all on a CUDA machine with PyTorch installed:

    bench/throughput.py --build            # builds gpuq-worker against PyTorch's LibTorch first

Usage: bench/throughput.py [--build] [--bin DIR] [--device cuda|cpu] [--batches 64,256]
                           [--epochs N] [--samples N] [--python PY] [--out FILE.json]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FEATURES, CLASSES, HIDDEN = 784, 10, [256, 128]

# The Python side: run in a child process so each measurement starts clean.
EAGER = r"""
import json, os, sys, time
import torch
cfg = json.loads(sys.argv[1])
device = torch.device(cfg["device"])
ddp = cfg["ddp"]
if ddp:
    import torch.distributed as dist
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
torch.manual_seed(0)
n = cfg["samples"]
x = torch.randn(n, cfg["features"], device=device)
y = torch.randint(0, cfg["classes"], (n,), device=device)
layers, width = [], cfg["features"]
for h in cfg["hidden"]:
    layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
    width = h
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, cfg["classes"])).to(device)
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
b = cfg["batch"]
steps = n // b
train_seconds = 0.0
for epoch in range(cfg["epochs"]):
    order = torch.randperm(n, device=device)
    if device.type == "cuda": torch.cuda.synchronize()
    t0 = time.perf_counter()
    total = torch.zeros((), device=device)
    for s in range(steps):
        rows = order[s * b:(s + 1) * b]
        loss = torch.nn.functional.cross_entropy(model(x.index_select(0, rows)), y.index_select(0, rows))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += loss.detach()
    total.item()  # waits for the device
    train_seconds += time.perf_counter() - t0
print(json.dumps({"samples_per_s": steps * b * cfg["epochs"] / train_seconds, "torch": torch.__version__}))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(python):
    prefix = subprocess.check_output([python, "-c", "import torch; print(torch.utils.cmake_prefix_path)"], text=True).strip()
    build_dir = os.path.join(REPO, "build-torch")
    subprocess.run(["cmake", "-S", REPO, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DGPUQ_BUILD_TESTS=OFF",
                    f"-DCMAKE_PREFIX_PATH={prefix}"], check=True)
    subprocess.run(["cmake", "--build", build_dir, "--parallel", str(os.cpu_count() or 2), "--target", "gpuq-worker"],
                   check=True)
    return os.path.join(build_dir, "bin")


def run_worker(bin_dir, device, batch, epochs, samples, ddp, foreach=True, graph=False):
    train = {"dataset": {"kind": "synthetic", "samples": samples, "features": FEATURES, "classes": CLASSES,
                         "test_fraction": 0.05},
             "model": {"kind": "mlp", "hidden": HIDDEN}, "optimizer": {"kind": "adam", "lr": 1e-3, "foreach": foreach},
             "epochs": epochs, "batch_size": batch, "checkpoint_every": 0, "log_every": 1 << 30, "device": device,
             "cuda_graph": "on" if graph else "off"}
    env = dict(os.environ)
    if ddp:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as events:
        env["GPUQ_EVENTS"] = events.name
        subprocess.run([os.path.join(bin_dir, "gpuq-worker"), "--train", json.dumps(train)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        result = [json.loads(line) for line in open(events.name) if '"result"' in line][-1]
    return result


def run_eager(python, device, batch, epochs, samples, ddp):
    # The worker trains on its training split: 95% of the samples.
    cfg = {"device": device, "batch": batch, "epochs": epochs, "samples": int(samples * 0.95), "features": FEATURES,
           "classes": CLASSES, "hidden": HIDDEN, "ddp": ddp}
    env = dict(os.environ)
    if ddp:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    out = subprocess.check_output([python, "-c", EAGER, json.dumps(cfg)], text=True, env=env)
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="store_true", help="build gpuq-worker against PyTorch's LibTorch first")
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", help="also write the rows here as JSON")
    args = ap.parse_args()
    bin_dir = build(args.python) if args.build else args.bin

    rows = []
    # "alone" and "ddp-1" use the multi-tensor optimiser (gpuq-worker's default); "per-param" is
    # LibTorch's one-tensor-at-a-time Adam, to show what that choice is worth; "graph" (CUDA only)
    # replays the forward and backward passes from a CUDA graph.
    modes = [("alone", False, True, False), ("per-param", False, False, False), ("ddp-1", True, True, False)]
    if args.device == "cuda":
        modes.append(("graph", False, True, True))
    for batch in [int(b) for b in args.batches.split(",")]:
        python = {}  # the eager Python loop, alone and as a 1-rank DDP gang: run once, shared by the rows
        for mode, ddp, foreach, graph in modes:
            t0 = time.time()
            cpp = run_worker(bin_dir, args.device, batch, args.epochs, args.samples, ddp, foreach, graph)
            if ddp not in python:
                python[ddp] = run_eager(args.python, args.device, batch, args.epochs, args.samples, ddp)
            py = python[ddp]
            row = {"batch": batch, "mode": mode, "device": cpp["device"],
                   "backend": cpp["backend"], "worker_samples_per_s": round(cpp["samples_per_s"]),
                   "python_samples_per_s": round(py["samples_per_s"]),
                   "speedup": round(cpp["samples_per_s"] / py["samples_per_s"], 2), "torch": py["torch"]}
            rows.append(row)
            print(f"batch {batch} {row['mode']}: gpuq-worker {row['worker_samples_per_s']}/s, "
                  f"python {row['python_samples_per_s']}/s ({row['speedup']}x, {time.time() - t0:.0f} s)", flush=True)

    print(f"\n{'batch':>6} {'mode':<10}{'device':<8}{'backend':<8}{'worker/s':>10}{'python/s':>10}{'speedup':>9}")
    for r in rows:
        print(f"{r['batch']:>6} {r['mode']:<10}{r['device']:<8}{r['backend']:<8}{r['worker_samples_per_s']:>10}"
              f"{r['python_samples_per_s']:>10}{r['speedup']:>8}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
