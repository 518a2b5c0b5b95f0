#!/usr/bin/env python3
"""What a GPU machine does with per-job memory budgets: the facts gpuq's budgets are built on.

Measures, on the first GPU, with PyTorch:
  1. NVML's per-process list without MPS: is a job's process listed under its own pid, with its
     memory, and what does one reading cost (the watchdog's interval rests on it)?
  2. CUDA MPS: does a control daemon start here; does CUDA_MPS_PINNED_DEVICE_MEM_LIMIT make a
     client's allocation past its budget fail inside CUDA (PyTorch's OutOfMemoryError), how
     long after the first allocation over it, and does the neighbour finish; what NVML lists
     under MPS (the clients' pids, or the server's).
  3. MPS and a second Linux user: does a client of another user start while the first user's
     clients run, and once they are gone?
Every step has a deadline; a step that fails is recorded and the next goes on. The answers go
to OUT/mps.json and the steps to OUT/mps.log.

Usage: scripts/mps-probe.py [--out DIR] [--python PYTHON]
"""
import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time

CLIENT = r"""
import json, os, sys, time
import torch
out, go, grow_mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
def say(**kv):
    with open(out, "a") as f:
        f.write(json.dumps(dict(kv, t=time.time())) + "\n")
held = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda")]  # 1 GiB
torch.cuda.synchronize()
say(event="ready", pid=os.getpid(), allocated_mib=torch.cuda.memory_allocated() >> 20)
deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.02)
t0 = time.time()
try:
    for i in range(grow_mib // 256):
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
    say(event="grew", mib=1024 + grow_mib, seconds=time.time() - t0)
except torch.OutOfMemoryError as e:
    say(event="oom", seconds=time.time() - t0, held_mib=1024 + 256 * (len(held) - 1), error=str(e)[:300])
    sys.exit(3)
time.sleep(float(os.environ.get("PROBE_HOLD_S", "0")))
say(event="done")
"""


class Probe:
    def __init__(self, out, python):
        self.out, self.python, self.facts = out, python, {}
        self.log = open(os.path.join(out, "mps.log"), "a")
        self.tmp = tempfile.mkdtemp(prefix="mps-probe-")
        os.chmod(self.tmp, 0o777)

    def say(self, text):
        print("[mps] " + text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def fact(self, key, value):
        self.facts[key] = value
        self.say(f"{key}: {json.dumps(value)[:1500]}")
        json.dump(self.facts, open(os.path.join(self.out, "mps.json"), "w"), indent=1)

    def sh(self, cmd, env=None, timeout=30, stdin=None):
        try:
            p = subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
            return p.returncode, (p.stdout + p.stderr).strip()
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout} s"
        except OSError as e:
            return None, repr(e)

    def client(self, name, grow_mib, env, user=None, hold_s=0):
        path = os.path.join(self.tmp, name + ".jsonl")
        go = os.path.join(self.tmp, name + ".go")
        env = dict(env, PROBE_HOLD_S=str(hold_s))
        pre = None
        if user is not None:
            pw = pwd.getpwnam(user)
            env["HOME"] = self.tmp

            def pre():
                os.setgid(pw.pw_gid)
                os.setgroups([])
                os.setuid(pw.pw_uid)
        proc = subprocess.Popen([self.python, "-c", CLIENT, path, go, str(grow_mib)], env=env, preexec_fn=pre,
                                stdout=open(path + ".out", "w"), stderr=subprocess.STDOUT)
        return {"name": name, "proc": proc, "path": path, "go": go}

    def events(self, c):
        try:
            return [json.loads(line) for line in open(c["path"])]
        except OSError:
            return []

    def wait_for(self, c, event, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in self.events(c):
                if e["event"] == event:
                    return e
            if c["proc"].poll() is not None:
                break
            time.sleep(0.05)
        for e in self.events(c):
            if e["event"] == event:
                return e
        return None

    def output(self, c):
        try:
            return open(c["path"] + ".out").read()[-1500:]
        except OSError:
            return ""

    def finish(self, c, timeout):
        try:
            return c["proc"].wait(timeout)
        except subprocess.TimeoutExpired:
            c["proc"].kill()
            c["proc"].wait()
            return "killed after %d s" % timeout

    def nvml(self):
        """NVML's compute processes on GPU 0 through nvidia-ml-py, and one reading's cost."""
        try:
            import pynvml
        except ImportError as e:
            return {"error": repr(e)}
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        t0 = time.perf_counter()
        n = 50
        for _ in range(n):
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        per_call_ms = (time.perf_counter() - t0) / n * 1000
        t0 = time.perf_counter()
        for _ in range(n):
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        mem_ms = (time.perf_counter() - t0) / n * 1000
        return {"processes": [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) >> 20} for p in procs],
                "process_list_ms": round(per_call_ms, 3), "memory_info_ms": round(mem_ms, 3),
                "device_used_mib": mem.used >> 20}

    def run(self):
        env = dict(os.environ)
        self.fact("nvidia-smi", self.sh(["nvidia-smi", "--query-gpu=name,driver_version,compute_mode,memory.total",
                                         "--format=csv,noheader"])[1])
        # 1. Without MPS.
        a = self.client("plain", 1024, env, hold_s=3)
        ready = self.wait_for(a, "ready", 60)
        if ready:
            open(a["go"], "w").close()
            self.wait_for(a, "grew", 30)
            reading = self.nvml()
            reading["client_pid"] = ready["pid"]
            reading["client_listed"] = any(p["pid"] == ready["pid"] for p in reading.get("processes", []))
            self.fact("no_mps.nvml_with_a_2_gib_client", reading)
            self.fact("no_mps.nvidia_smi_apps", self.sh(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                                         "--format=csv,noheader"])[1])
        else:
            self.fact("no_mps.client", {"ready": False, "output": self.output(a)})
        self.fact("no_mps.client_exit", self.finish(a, 30))

        # 2. MPS.
        control = shutil.which("nvidia-cuda-mps-control")
        self.fact("mps.control_binary", control)
        if not control:
            return
        pipe, logd = os.path.join(self.tmp, "pipe"), os.path.join(self.tmp, "log")
        os.makedirs(pipe, mode=0o777)
        os.makedirs(logd, mode=0o777)
        os.chmod(pipe, 0o777)
        os.chmod(logd, 0o777)
        menv = dict(env, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logd)
        self.fact("mps.start", self.sh([control, "-d"], env=menv, timeout=20))
        try:
            self.mps(menv, control, logd)
        finally:
            self.fact("mps.quit", self.sh([control], env=menv, stdin="quit\n", timeout=20))
            for f in ("control.log", "server.log"):
                try:
                    self.fact("mps." + f, open(os.path.join(logd, f)).read()[-3000:])
                except OSError as e:
                    self.fact("mps." + f, repr(e))

    def mps(self, menv, control, logd):
        budget = dict(menv, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2G")
        over = self.client("over", 4096, budget)      # 1 GiB held, then 4 GiB more: past 2 GiB
        neighbour = self.client("neighbour", 256, budget, hold_s=4)  # under MPS a context costs ~0.5 GiB of the budget
        r_over, r_nb = self.wait_for(over, "ready", 90), self.wait_for(neighbour, "ready", 90)
        self.fact("mps.clients_ready", {"over": r_over, "neighbour": r_nb,
                                        "over_output": "" if r_over else self.output(over),
                                        "neighbour_output": "" if r_nb else self.output(neighbour)})
        if r_over and r_nb:
            reading = self.nvml()
            reading["client_pids"] = [r_over["pid"], r_nb["pid"]]
            rc, server = self.sh(["pgrep", "-f", "nvidia-cuda-mps-server"])
            reading["server_pids"] = server
            self.fact("mps.nvml_with_two_1_gib_clients", reading)
            self.fact("mps.nvidia_smi_apps", self.sh(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                                      "--format=csv,noheader"])[1])
            open(over["go"], "w").close()
            open(neighbour["go"], "w").close()
            self.fact("mps.over_budget", self.wait_for(over, "oom", 30) or self.wait_for(over, "grew", 1)
                      or self.output(over))
            self.wait_for(neighbour, "grew", 30)
            # 3. Another user while this user's neighbour still runs (it holds its memory 4 s), then after.
            other = self.client("other", 0, menv, user="nobody")
            t0 = time.time()
            early = self.wait_for(other, "ready", 2.5)
            self.fact("mps.other_user_while_first_user_runs", {"ready": bool(early), "after_s": early and
                                                               round(early["t"] - t0, 2),
                                                               "neighbour_alive": neighbour["proc"].poll() is None})
            self.wait_for(neighbour, "done", 60)
            self.fact("mps.neighbour", self.events(neighbour) + [self.output(neighbour)])
        self.fact("mps.over_exit", self.finish(over, 30))
        self.fact("mps.neighbour_exit", self.finish(neighbour, 30))
        if r_over and r_nb:
            late = self.wait_for(other, "ready", 30)
            self.fact("mps.other_user_after", {"ready": bool(late), "after_s": late and round(late["t"] - t0, 2),
                                               "output": "" if late else self.output(other)})
            open(other["go"], "w").close()
            self.fact("mps.other_exit", self.finish(other, 30))
        self.fact("mps.control_status", self.sh([control], env=menv, stdin="get_server_list\n", timeout=10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="mps-probe")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    p = Probe(a.out, a.python)
    try:
        p.run()
    except Exception as e:  # the facts so far are the result
        p.fact("probe_error", repr(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
