#!/usr/bin/env python3
"""Defines a model in Python and saves it as TorchScript for gpuq-worker to train
(`"model": {"kind": "torchscript", "path": "net.pt"}`).

Usage: script_model.py OUT.pt [--features 784] [--classes 10] [--hidden 128]
"""
import argparse

import torch


class Net(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.hidden = torch.nn.Linear(features, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.out = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.hidden(x))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(Net(args.features, args.hidden, args.classes)), args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
