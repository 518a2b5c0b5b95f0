#!/usr/bin/env python3
"""Another user's latency while one uid does its worst (docs/reliability.md, "Limits"). Lab mode,
run as root: gpuqd --multi-user on fake GPUs; Bob (the attacker) owns 12 jobs whose progress and
result are ~0.9 MB each, so his `status` of all of them is an 8 MiB reply (the bound); Alice
connects, says hello and asks `status` (50 jobs), as `gpuq status` does, over and over, and the
bench reports how long each took: median, 90th percentile and the slowest.

  idle         nothing beside her
  flood        Bob's 64 connections each asking for his 8 MiB status in a loop, reading every reply
  unread       Bob's 200 connections each asking for it once and never reading (gpuqd holds at
               most 32 MiB of a user's unread replies: the rest are dropped)
  connections  Bob holds as many idle connections as gpuqd lets him (connections_per_user)

Usage: bench/user_attack.py [--bin build/bin] [--samples 200] [--attacks idle,flood,unread,connections]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/integration"))

ROLE = r'''
import json, socket, sys, threading, time
path, role, arg = sys.argv[1], sys.argv[2], int(sys.argv[3])
def connect():
    s = socket.socket(socket.AF_UNIX); s.connect(path); return s
def readline(f):
    line = f.readline()
    if not line: raise ConnectionError("closed by gpuqd")
    return json.loads(line)
HELLO = b'{"cmd": "hello", "protocol_version": 1, "protocol_minor": 1}\n'
BIG = b'{"cmd": "status", "limit": 2000}\n'
if role == "victim":  # arg: samples
    took = []
    for _ in range(arg):
        t = time.monotonic()
        with connect() as s:
            s.sendall(HELLO + b'{"cmd": "status", "limit": 50}\n')
            f = s.makefile("rb")
            assert readline(f)["ok"] and readline(f)["ok"]
        took.append(time.monotonic() - t)
    print(json.dumps(took), flush=True)
    sys.exit(0)
served = [0]
stop = threading.Event()
held = []
dropped = [0]
if role == "flood":  # arg: connections
    def loop():
        while not stop.is_set():
            try:
                with connect() as s:
                    f = s.makefile("rb")
                    while not stop.is_set():
                        s.sendall(BIG); readline(f); served[0] += 1
            except (ConnectionError, ValueError, OSError):
                dropped[0] += 1  # over the user's bound on unread replies: connect again
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(arg)]
    for t in threads: t.start()
elif role == "unread":
    for _ in range(arg):
        s = connect(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.sendall(BIG); held.append(s)
elif role == "connections":
    while len(held) < arg:
        s = connect(); s.sendall(HELLO)
        if not readline(s.makefile("rb"))["ok"]: break
        held.append(s)
print("ready", len(held), flush=True)
sys.stdin.read()
stop.set()
print(served[0], dropped[0], flush=True)
'''

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(HERE, "../build/bin"))
ap.add_argument("--samples", type=int, default=200)
ap.add_argument("--attacks", default="idle,flood,unread,connections")
args = ap.parse_args()
os.environ["GPUQ_BIN_DIR"] = os.path.abspath(args.bin)
if os.geteuid() != 0:
    sys.exit("bench/user_attack.py runs gpuqd in lab mode: run it as root")

from harness import Daemon, ensure_account, gid_of, uid_of, wait_until  # noqa: E402

ALICE, BOB = "gpuq-alice", "gpuq-bob"
ensure_account(ALICE)
ensure_account(BOB)


def as_user(user, *argv, **kw):
    return subprocess.Popen(["/usr/bin/python3", "-c", ROLE, *argv], user=uid_of(user), group=gid_of(user),
                            extra_groups=[], cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


with tempfile.TemporaryDirectory(prefix="gpuq-attack-", dir="/tmp") as tmp:
    os.chmod(tmp, 0o755)
    d = Daemon(tmp, "fake:2", extra=["--multi-user"])
    d.socket = os.path.join(tmp, "run", "gpuqd.sock")
    d.start(umask=0o027)
    try:
        fill = ("import json, os; f = open(os.environ['GPUQ_EVENTS'], 'a'); "
                "f.write(json.dumps({'type': 'progress', 'epoch': 1, 'note': 'p' * 450000}) + '\\n'); "
                "f.write(json.dumps({'type': 'result', 'note': 'r' * 450000}) + '\\n')")
        spec = json.dumps([{"name": f"big{i}", "command": ["python3", "-c", fill]} for i in range(12)])
        home = os.path.expanduser("~" + BOB)
        r = subprocess.run(["runuser", "-u", BOB, "--", "env", "GPUQ_CONFIG=", os.path.join(args.bin, "gpuq"),
                            "--socket", d.socket, "submit", "-", "--wait", "--json"],
                           input=spec, capture_output=True, text=True, cwd=home, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        print(f"load average at start: {os.getloadavg()[0]:.2f}\n")
        print("| Bob does | Alice's hello + status: median | p90 | slowest | Bob's 8 MiB replies served meanwhile |")
        print("|---|---|---|---|---|", flush=True)
        for attack in args.attacks.split(","):
            attacker = None
            if attack != "idle":
                n = {"flood": 64, "unread": 200, "connections": 100000}[attack]
                attacker = as_user(BOB, d.socket, attack, str(n))
                ready = attacker.stdout.readline()
                assert ready.startswith("ready"), ready
            victim = as_user(ALICE, d.socket, "victim", str(args.samples))
            out, _ = victim.communicate(timeout=3600)
            took = json.loads(out)
            served = ""
            if attacker:
                attacker.stdin.close()
                served = " (dropped, connected again: ".join(attacker.stdout.readline().split()) + ")" if attack == "flood" else ""
                attacker.wait(timeout=120)
            print(f"| {attack} | {statistics.median(took) * 1000:.1f} ms | {pct(took, 0.9) * 1000:.1f} ms | "
                  f"{max(took) * 1000:.1f} ms | {served} |", flush=True)
            wait_until(lambda: d.json("gpus").get("connections_open", 0) <= 1, timeout=120,
                       what="Bob's connections to close")
    finally:
        d.stop()
