#!/usr/bin/env python3
"""A torchrun-style PyTorch training script that knows nothing about gpuq.

It reads the standard torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and trains alone or as one rank of a DistributedDataParallel group: NCCL on GPUs,
Gloo on CPU. Run it by hand, under torchrun, or as a gpuq job; under gpuq it also reports
progress and its final result by appending JSON lines to $GPUQ_EVENTS (no client library).

Datasets: Fashion-MNIST in IDX format (gzipped or not; Debian's dataset-fashion-mnist installs it
to /usr/share/datasets/fashion-mnist) or a seeded synthetic classification problem.
"""
import argparse
import gzip
import hashlib
import json
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def report(**fields):
    """Appends one event line for gpuq; a no-op outside gpuq."""
    path = os.environ.get("GPUQ_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(data_dir, stem):
    for name in (stem + ".gz", stem):
        if os.path.exists(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    raise SystemExit(f"{data_dir}: no {stem}[.gz]; install dataset-fashion-mnist or pass --data-dir")


def load(args):
    if args.dataset == "synthetic":
        g = torch.Generator().manual_seed(args.seed)
        centers = torch.randn(10, 64, generator=g) * 2
        def split(n):
            y = torch.randint(0, 10, (n,), generator=g)
            return centers[y] + torch.randn(n, 64, generator=g), y
        return split(args.limit or 8000), split(2000), 64
    parts = []
    for prefix in ("train", "t10k"):
        x = read_idx(find(args.data_dir, f"{prefix}-images-idx3-ubyte"))
        y = read_idx(find(args.data_dir, f"{prefix}-labels-idx1-ubyte"))
        x = torch.from_numpy(x.reshape(len(x), -1).astype(np.float32) / 255.0)
        x = (x - 0.2860) / 0.3530  # Fashion-MNIST mean and std
        parts.append((x, torch.from_numpy(y.astype(np.int64))))
    (xtr, ytr), test = parts
    if args.limit:
        xtr, ytr = xtr[: args.limit], ytr[: args.limit]
    return (xtr, ytr), test, 784


def param_checksum(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", choices=["fashion-mnist", "synthetic"], default="fashion-mnist")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--hidden", default="256,128", help="MLP hidden layer sizes")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128, help="per rank")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--limit", type=int, default=0, help="use only this many training samples")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")  # env:// from the torchrun variables
    torch.manual_seed(args.seed)

    (xtr, ytr), (xte, yte), features = load(args)
    sizes = [features] + [int(h) for h in args.hidden.split(",") if h] + [10]
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).to(device)
    if world > 1:
        model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    train = TensorDataset(xtr, ytr)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    print(f"rank {rank}/{world} on {device}: {len(train)} samples, {len(loader)} batches per epoch", flush=True)

    t0, seen, step = time.time(), 0, 0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += len(x)
            step += 1
            if step % 50 == 0 and rank == 0:
                report(type="progress", epoch=epoch, step=step, loss=round(loss.item(), 5),
                       samples_per_s=round(seen * world / (time.time() - t0), 1))
        model.eval()
        with torch.no_grad():
            logits = model(xte.to(device))
            test_loss = F.cross_entropy(logits, yte.to(device)).item()
            acc = (logits.argmax(1).cpu() == yte).float().mean().item()
        print(f"rank {rank} epoch {epoch}: test_loss={test_loss:.4f} test_accuracy={acc:.4f}", flush=True)
        if rank == 0:
            report(type="progress", epoch=epoch, step=step, test_loss=round(test_loss, 5), test_accuracy=round(acc, 4))

    elapsed = time.time() - t0
    print(f"rank {rank} param_checksum={param_checksum(model)}", flush=True)
    if rank == 0:
        report(type="result", test_accuracy=round(acc, 4), test_loss=round(test_loss, 5), epochs=args.epochs,
               world_size=world, train_seconds=round(elapsed, 2), samples_per_s=round(seen * world / elapsed, 1))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
