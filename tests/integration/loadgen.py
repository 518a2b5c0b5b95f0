"""Concurrent clients speaking gpuq's protocol directly: each keeps one connection and sends a
mix of submit (into a held queue), status, show and cancel, checking every reply against what
it asked. Used by test_load.py (correctness) and bench/load_bench.py (latency)."""
import json
import os
import socket
import threading
import time


class Client:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""

    def call(self, obj):
        self.sock.sendall((json.dumps(obj) + "\n").encode())
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("gpuqd closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        self.sock.close()


def run_load(path, clients=50, requests=200, blocker=None):
    """Returns {"latencies_ms": [...], "errors": [...], "submitted": n, "seconds": s}. Jobs are
    submitted behind `blocker` (a job id that never ends) so none starts: the load is the daemon's."""
    latencies, errors, submitted = [], [], [0]
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(k):
        c = Client(path)
        mine, lat, errs = [], [], []
        c.call({"cmd": "hello", "protocol_version": 1})
        start.wait()
        for i in range(requests):
            kind = ("submit", "status", "show", "cancel")[i % 4]
            if kind == "submit":
                req = {"cmd": "submit", "cwd": "/", "env": {},
                       "jobs": {"name": f"c{k}-{i}", "command": ["true"], "after": [blocker]}}
            elif kind == "status":
                req = {"cmd": "status", "limit": 5}
            elif kind == "show":
                req = {"cmd": "show", "id": mine[-1]}
            else:
                req = {"cmd": "cancel", "ids": [mine.pop()]}
            t0 = time.perf_counter()
            try:
                reply = c.call(req)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                errs.append(f"client {k} request {i} ({kind}): {e}")
                break
            lat.append((time.perf_counter() - t0) * 1000)
            if not reply.get("ok"):
                errs.append(f"client {k} request {i} ({kind}): {reply.get('error')}")
                continue
            if kind == "submit":
                ids = reply.get("ids", [])
                if len(ids) != 1:
                    errs.append(f"client {k} request {i}: submit answered {reply}")
                else:
                    mine.append(ids[0])
            elif kind == "show" and (reply["job"]["id"] != req["id"] or reply["job"]["name"] != f"c{k}-{i - 2}"):
                errs.append(f"client {k} request {i}: show {req['id']} answered job {reply['job']['id']}")
            elif kind == "cancel" and [j["id"] for j in reply["jobs"]] != req["ids"]:
                errs.append(f"client {k} request {i}: cancel {req['ids']} answered {reply['jobs']}")
            elif kind == "cancel" and reply["jobs"][0]["state"] != "cancelled":
                errs.append(f"client {k} request {i}: cancelled job is {reply['jobs'][0]['state']}")
            elif kind == "status" and not isinstance(reply.get("jobs"), list):
                errs.append(f"client {k} request {i}: status answered {reply}")
        c.close()
        with lock:
            latencies.extend(lat)
            errors.extend(errs)
            submitted[0] += requests // 4

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latencies_ms": latencies, "errors": errors, "submitted": submitted[0],
            "seconds": time.perf_counter() - t0}


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise ValueError(f"no {field} for {pid}")


def assert_rss_grew_less(test, pid, before_kib, limit_kib, msg=None):
    """That process `pid` grew by less than `limit_kib` since `before_kib`; not checked under ASan
    (GPUQ_SANITIZED), where freed memory waits in a quarantine of 256 MiB, so the resident set
    measures the sanitizer: leaks are LeakSanitizer's to find, at exit, in the logs the harness
    scans. What gpuqd counts itself (its bounds) is checked by the caller either way."""
    if os.environ.get("GPUQ_SANITIZED"):
        return
    test.assertLess(rss_kib(pid) - before_kib, limit_kib, msg)
