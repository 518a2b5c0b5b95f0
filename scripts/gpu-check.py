#!/usr/bin/env python3
"""The checks that need an NVIDIA GPU, in one command, on a machine with a CUDA build of PyTorch.

Builds gpuq against PyTorch's LibTorch (CUDA, NCCL), then: gpuq-worker on the GPU alone, in bf16
and fp16, with host-held data, with its step replayed from a CUDA graph, and as a 1-rank NCCL DDP
gang; gpuqd on the real GPUs (NVML) with
bundled example jobs; the limits the kernel holds jobs to (cgroups: the integration tests of them,
which must not skip as root on a GPU machine, and a job kept off a real GPU it was not given); training throughput against eager PyTorch (bench/throughput.py); the
Fashion-MNIST accuracy of the CNNs (bench/accuracy.py). Every stage goes on after a failed check
and writes its log to OUT; OUT/summary.json and the last lines printed say what passed.

Build dependencies the machine lacks (SQLite, zlib, nlohmann-json, CLI11, doctest headers, the
Fashion-MNIST files) can come as Debian packages in a folder (scripts/fetch-debs.sh makes one):
they are unpacked into a prefix inside the build folder, never over the system, except that the
dataset is copied to /usr/share/datasets where it is missing, so the example jobs run as written.

Usage: scripts/gpu-check.py [--out DIR] [--build DIR] [--debs DIR] [--device cuda|cpu] [STAGE ...]
       STAGE: build worker daemon limits throughput accuracy (default: all of them, in this order)
       --device cpu runs the same checks without a GPU (two fake ones for gpuqd; no fp16): a dry
       run of this script itself.
"""
import argparse
import contextlib
import errno
import glob
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STAGES = ["build", "worker", "daemon", "limits", "throughput", "accuracy"]
FASHION = "/usr/share/datasets/fashion-mnist"
MLP = {"dataset": {"kind": "fashion-mnist"}, "model": {"kind": "mlp", "hidden": [256, 128]}, "epochs": 2,
       "batch_size": 128, "log_every": 50}


class Check:
    """Records named checks of one stage; a failed check is logged and the stage goes on."""

    def __init__(self, out, stage):
        self.stage, self.results = stage, []
        self.log = open(os.path.join(out, stage + ".log"), "a")

    def say(self, text):
        print(f"[{self.stage}] {text}", flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def that(self, name, ok, detail=""):
        self.results.append({"check": name, "ok": bool(ok), "detail": str(detail)[:2000]})
        self.say(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))
        return ok

    def run(self, cmd, env=None, timeout=600, cwd=REPO):
        """Runs cmd with its output in the stage log; returns (exit status, output)."""
        self.say("$ " + " ".join(cmd))
        t0 = time.time()
        try:
            r = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=timeout)
            status, output = r.returncode, r.stdout
        except subprocess.TimeoutExpired as e:
            status, output = 124, (e.stdout or b"").decode(errors="replace") + f"\n(timed out after {timeout} s)"
        self.log.write(output + f"(exit {status}, {time.time() - t0:.1f} s)\n")
        self.log.flush()
        return status, output


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unpack_debs(c, debs, prefix):
    os.makedirs(prefix, exist_ok=True)
    packages = sorted(glob.glob(os.path.join(debs, "*.deb")))
    failed = [deb for deb in packages if c.run(["dpkg-deb", "-x", deb, prefix])[0] != 0]
    c.that(f"unpack {len(packages)} packages from {debs}", packages and not failed, failed)
    # A -dev package's lib*.so points at the runtime library in /usr/lib, which is not unpacked
    # here: drop those dangling links so the static archives beside them are linked instead.
    for link in glob.glob(os.path.join(prefix, "usr/lib/*/lib*.so")):
        if os.path.islink(link) and not os.path.exists(link):
            os.unlink(link)
    data = os.path.join(prefix, FASHION.lstrip("/"))
    if os.path.isdir(data) and not os.path.isdir(FASHION):
        shutil.copytree(data, FASHION)
        c.say(f"Fashion-MNIST copied to {FASHION}")


def stage_build(c, a):
    prefix = subprocess.check_output([a.python, "-c", "import torch; print(torch.utils.cmake_prefix_path)"],
                                     text=True).strip()
    info = subprocess.check_output([a.python, "-c", "import torch; print(torch.__version__, torch.version.cuda, "
                                    "torch.cuda.is_available(), torch.cuda.get_device_name(0) if "
                                    "torch.cuda.is_available() else '-')"], text=True).strip()
    if a.device == "cuda":
        c.that("PyTorch sees a GPU", "True" in info.split(), info)
    prefixes = [prefix]
    if a.debs:
        deps = os.path.join(a.build, "deps")
        unpack_debs(c, a.debs, deps)
        prefixes.append(os.path.join(deps, "usr"))
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    # GPUQ_PREBUILT_TOOLS as scripts/cuda-build.sh passes it (the dry run in scripts/test.sh: the
    # plain build's gpuqd, gpuq, gpuq-shim); unset, they are compiled here, never a stale copy.
    status, out = c.run(["cmake", "-S", REPO, "-B", a.build, *generator, "-DCMAKE_BUILD_TYPE=Release",
                         "-DCMAKE_PREFIX_PATH=" + ";".join(prefixes),
                         "-DGPUQ_PREBUILT_TOOLS=" + os.environ.get("GPUQ_PREBUILT_TOOLS", "")])
    if not c.that("configure", status == 0, out.strip().splitlines()[-1] if out.strip() else ""):
        return False
    backends = next((l for l in out.splitlines() if "gpuq-worker:" in l), "no gpuq-worker line")
    nvml = next((l for l in out.splitlines() if "NVML ABI check" in l), "")
    if a.device == "cuda":
        c.that("configure finds CUDA and NCCL", "GPUQ_HAVE_NCCL" in out and "GPUQ_HAVE_CUDA" in out, backends)
        c.say(nvml or "no nvml.h here: the NVML ABI check (daemon/nvml_abi_check.cpp) is not compiled")
    elif "GPUQ_HAVE_CUDA" in out:  # the dry run against a CUDA build of PyTorch (scripts/cuda-build.sh)
        c.that("the NVML ABI check is compiled against nvml.h", nvml, nvml)
    t0 = time.time()
    # The dry run (CI, after scripts/cuda-build.sh) builds what the GPU stages run; the unit tests
    # are the plain build's there, and a GPU machine's own compiler builds and runs them here.
    targets = ["gpuq-worker", "gpuqd", "gpuq", "gpuq-shim"]
    a.png = "cairo not found" not in out
    if a.png:
        targets.append("gpuq-plot-png")  # `gpuq plot -o curves.png` in the daemon stage
    prebuilt = [l.strip("- ") for l in out.splitlines() if "GPUQ_PREBUILT_TOOLS)" in l]
    if prebuilt:
        c.say("; ".join(prebuilt))
    if nvml:
        targets.append("gpuq_nvml_abi_check")
    if a.device == "cuda":
        targets.append("gpuq_unit_tests")
    status, out = c.run(["cmake", "--build", a.build, "--parallel", str(os.cpu_count() or 4), "--target", *targets],
                        timeout=1200)
    if not c.that("build", status == 0, f"{time.time() - t0:.0f} s" if status == 0 else out[-3000:]):
        return False
    status, out = c.run([os.path.join(a.build, "bin/gpuq-worker"), "--version"])
    c.that("gpuq-worker runs", status == 0 and ("nccl" in out or a.device == "cpu"), out.strip())
    if a.device == "cuda":
        status, out = c.run([os.path.join(a.build, "bin/gpuq_unit_tests")])
        c.that("unit tests", status == 0, out.strip().splitlines()[-2:] if out.strip() else "")
    return True


def run_worker(c, a, name, train, env=None, args=()):
    """Runs gpuq-worker by hand; returns (exit status, result event or {}, progress events)."""
    events = os.path.join(a.out, name + ".events.jsonl")
    if os.path.exists(events):
        os.unlink(events)
    status, out = c.run([os.path.join(a.build, "bin/gpuq-worker"), "--train", json.dumps(train), *args],
                        env=dict(env or {}, GPUQ_EVENTS=events))
    lines = [json.loads(l) for l in open(events)] if os.path.exists(events) else []
    result = next((l for l in reversed(lines) if l.get("type") == "result"), {})
    if status != 0:
        c.say(out[-2000:])
    return status, result, [l for l in lines if l.get("type") == "progress"]


def brief(result):
    keys = ("device", "backend", "precision", "data_on", "cuda_graph", "test_accuracy", "samples_per_s",
            "train_seconds", "skipped_steps", "device_memory_peak_mib")
    return {k: result[k] for k in keys if k in result}


def stage_worker(c, a):
    cuda = a.device == "cuda"
    status, result, progress = run_worker(c, a, "mlp", MLP)
    c.that(f"MLP trains on {a.where}", status == 0 and result.get("device") == a.where, brief(result))
    c.that(f"MLP reaches {a.accuracy}", result.get("test_accuracy", 0) >= a.accuracy, result.get("test_accuracy"))
    memory = "device_memory_mib" if cuda else "host_memory_mib"
    c.that(f"progress events carry {memory}", progress and all(memory in p for p in progress),
           progress[-1] if progress else "no progress events")
    for precision in ("bf16", "fp16") if cuda else ("bf16",):
        status, result, _ = run_worker(c, a, "mlp-" + precision, dict(MLP, precision=precision))
        c.that(f"{precision} autocast trains", status == 0 and result.get("test_accuracy", 0) >= a.accuracy, brief(result))
    status, result, _ = run_worker(c, a, "mlp-host", dict(MLP, data_on="host"))
    c.that("host-held data with prefetch trains", status == 0 and result.get("data_on") == "host"
           and result.get("test_accuracy", 0) >= a.accuracy, brief(result))
    status, result, _ = run_worker(c, a, "mlp-per-param", dict(MLP, optimizer={"kind": "adam", "foreach": False}))
    c.that("LibTorch's per-parameter Adam trains", status == 0 and result.get("test_accuracy", 0) >= a.accuracy,
           brief(result))
    clip = dict(MLP, clip_grad_norm=0.5, accumulate=2, precision="fp16" if cuda else "fp32")
    runs = {foreach: run_worker(c, a, f"mlp-clip-{foreach}", dict(clip, optimizer={"kind": "adam", "foreach": foreach}))[1]
            for foreach in (True, False)}
    c.that("multi-tensor gradient clipping trains like LibTorch's",
           runs[True].get("test_accuracy", 0) >= a.accuracy
           and abs(runs[True].get("test_loss", 1) - runs[False].get("test_loss", 0)) < 0.02,
           f"multi-tensor: {brief(runs[True])}; LibTorch's: {brief(runs[False])}")
    check_cuda_graph(c, a)
    cnn = dict(MLP, model={"kind": "cnn", "channels": [32, 64], "batch_norm": True, "hidden": [128]}, epochs=1)
    status, result, _ = run_worker(c, a, "cnn", cnn)
    c.that(f"batch-norm CNN trains on {a.where}", status == 0 and result.get("test_accuracy", 0) >= a.accuracy, brief(result))
    ddp = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    status, result, _ = run_worker(c, a, "mlp-ddp1", MLP, env=ddp)
    backend = "nccl" if cuda else "gloo"
    c.that(f"1-rank DDP on {backend}", status == 0 and result.get("backend") == backend
           and result.get("test_accuracy", 0) >= a.accuracy, brief(result))


def check_cuda_graph(c, a):
    """The step replayed from a CUDA graph computes what eager steps do, and trains (the dry run
    on the CPU emulates the graph)."""
    emulate = () if a.device == "cuda" else ("--emulate-cuda-graph",)
    # `device: cpu` rules a graph out; the dry run's emulated graph runs on the CPU as device `auto`.
    mlp = MLP if a.device == "cuda" else {k: v for k, v in MLP.items() if k != "device"}

    def params(name, train):
        dump = os.path.join(a.out, name + ".params.json")
        status, result, _ = run_worker(c, a, name, train, args=("--dump-params", dump, *emulate))
        return status, result, (json.load(open(dump)) if status == 0 else [])
    # Two micro-batches a step from host-held (pinned, prefetched) data: static buffers refilled
    # from both paths, gradients rewritten in place by every replay.
    short = dict(mlp, epochs=1, accumulate=2, data_on="host", dataset=dict(mlp["dataset"], limit=6400))
    _, eager, eager_params = params("graph-eager", short)
    status, graphed, graph_params = params("graph-replayed", dict(short, cuda_graph="on"))
    diff = max((abs(x - y) for x, y in zip(eager_params, graph_params)), default=None)
    c.that("a step replayed from a CUDA graph computes what an eager step does",
           status == 0 and graphed.get("cuda_graph") is True and diff is not None and diff <= 1e-4,
           f"max parameter difference {diff}; {brief(graphed)}")
    for precision in ("fp32", "bf16"):
        status, result, _ = run_worker(c, a, "mlp-graph-" + precision, dict(mlp, precision=precision, cuda_graph="on"),
                                       args=emulate)
        c.that(f"{precision} training replayed from a CUDA graph reaches {a.accuracy}",
               status == 0 and result.get("cuda_graph") is True and result.get("test_accuracy", 0) >= a.accuracy,
               brief(result))
    dropout = dict(mlp, model=dict(mlp["model"], dropout=0.2), cuda_graph="on")
    status, result, _ = run_worker(c, a, "mlp-graph-dropout", dropout, args=emulate)
    c.that("dropout (random masks) in a CUDA graph trains", status == 0 and result.get("test_accuracy", 0) >= a.accuracy,
           brief(result))
    # The CNN with batch norm (cuDNN convolutions, running statistics updated inside the graph):
    # the graph against eager steps, with eager against eager as the noise floor (cuDNN's
    # backward convolutions may add in any order).
    cnn = dict(short, model={"kind": "cnn", "channels": [32, 64], "batch_norm": True, "hidden": [128]})
    _, _, cnn_eager = params("cnn-graph-eager", cnn)
    _, _, cnn_eager2 = params("cnn-graph-eager2", cnn)
    status, graphed, cnn_graph = params("cnn-graph-replayed", dict(cnn, cuda_graph="on"))
    noise = max((abs(x - y) for x, y in zip(cnn_eager, cnn_eager2)), default=None)
    diff = max((abs(x - y) for x, y in zip(cnn_eager, cnn_graph)), default=None)
    c.that("a batch-norm CNN's step replayed from a CUDA graph computes what eager steps do",
           status == 0 and graphed.get("cuda_graph") is True and diff is not None and noise is not None
           and diff <= max(1e-4, 10 * noise), f"max parameter difference {diff} (eager against eager: {noise}); "
           f"{brief(graphed)}")
    status, result, _ = run_worker(c, a, "cnn-graph", dict(mlp, epochs=1, cuda_graph="on", model=dict(
        cnn["model"], dropout=0.25)), args=emulate)
    c.that(f"the batch-norm CNN with dropout replayed from a CUDA graph reaches {a.accuracy}",
           status == 0 and result.get("cuda_graph") is True and result.get("test_accuracy", 0) >= a.accuracy,
           brief(result))
    # A capture that fails for real leaves the CUDA generator in capture mode; the eager steps that
    # `auto` falls back to must still draw dropout masks.
    status, result, _ = run_worker(c, a, "mlp-graph-failed", dict(dropout, cuda_graph="auto"),
                                   args=("--fail-capture", *emulate))
    c.that("after a failed capture, `auto` trains on with eager steps, dropout included",
           status == 0 and result.get("cuda_graph") is False and result.get("test_accuracy", 0) >= a.accuracy,
           brief(result))


def sysfs_gpu_nodes(c):
    """Each GPU's NUMA node as the kernel reports it for its PCI address (None where -1)."""
    status, out = c.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"])
    nodes = []
    for bus_id in out.split() if status == 0 else []:
        domain, bus, rest = bus_id.strip().split(":")
        path = f"/sys/bus/pci/devices/{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}/numa_node"
        node = int(pathlib.Path(path).read_text()) if os.path.exists(path) else -1
        nodes.append(node if node >= 0 else None)
    c.say(f"sysfs NUMA nodes of the GPUs: {nodes}")
    return nodes


@contextlib.contextmanager
def gpuqd(c, a, log_name, options, timeout=600):
    """gpuqd in the foreground on a socket and state dir of its own (its log in OUT/log_name), once
    it answers: yields (gpuq, tmp), gpuq(*args, timeout=...) running the CLI against it; stopped
    at the end."""
    tmp = tempfile.mkdtemp(prefix="gpuq-check-")
    sock, state = os.path.join(tmp, "gpuqd.sock"), os.path.join(tmp, "state")
    env = {"GPUQ_CONFIG": "", "GPUQ_SOCKET": sock, "GPUQ_STATE_DIR": state}
    bin_dir = os.path.join(a.build, "bin")
    with open(os.path.join(a.out, log_name), "w") as log:
        daemon = subprocess.Popen([os.path.join(bin_dir, "gpuqd"), "--foreground", "--socket", sock, "--state-dir",
                                   state, *options],
                                  stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **env))
    gpuq = lambda *args, timeout=timeout: c.run([os.path.join(bin_dir, "gpuq"), *args], env=env, timeout=timeout)
    try:
        for _ in range(100):
            if gpuq("status")[0] == 0:
                break
            time.sleep(0.1)
        yield gpuq, tmp
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def stage_daemon(c, a):
    gpus = "nvml" if a.device == "cuda" else "fake:2"
    with gpuqd(c, a, "gpuqd.log", ["--gpus", gpus]) as (gpuq, tmp):
        status, out = gpuq("gpus", "--json")
        doc = json.loads(out) if status == 0 else {}
        c.that(f"gpuqd finds the GPUs ({gpus})", doc.get("source", "").startswith(gpus) and doc.get("gpus"),
               out.strip()[:800])
        if a.device == "cuda":
            with open(os.path.join(a.out, "gpuqd.log")) as f:
                said = [line.strip() for line in f if "Xid events" in line]
            n = len(doc.get("gpus", []))
            c.that("NVML reports each GPU's critical Xid events to the health checks",
                   said == [f"gpuqd: {n} of {n} GPU(s) report critical Xid events to the health checks"], said)
            c.that("each GPU's NUMA node is its PCI device's in sysfs", [g.get("numa_node") for g in doc.get("gpus", [])]
                   == sysfs_gpu_nodes(c), f"gpuqd {[g.get('numa_node') for g in doc.get('gpus', [])]}")
        jobs = [os.path.join(REPO, "jobs", f) for f in ("fashion-mnist-mlp.json", "fashion-mnist-cnn.json")]
        if a.device == "cpu":  # the dry run: the same jobs, shortened
            for i, path in enumerate(jobs):
                with open(path) as f:
                    job = json.load(f)
                job["train"]["epochs"], job["train"]["dataset"]["limit"] = 1, MLP["dataset"]["limit"]
                jobs[i] = os.path.join(tmp, os.path.basename(path))
                with open(jobs[i], "w") as f:
                    json.dump(job, f)
        status, out = gpuq("submit", "--json", *jobs)
        ids = [str(i) for i in json.loads(out)["ids"]] if status == 0 else []
        c.that("submit the example jobs", status == 0, out.strip())
        spec = os.path.join(tmp, "script.json")
        with open(spec, "w") as f:
            json.dump({"name": "torchrun-script", "gpus": 1, "cwd": REPO, "command": [
                a.python, "jobs/examples/train.py", "--dataset", "synthetic", "--epochs", "3"]}, f)
        status, out = gpuq("submit", "--json", spec)
        ids += [str(i) for i in json.loads(out)["ids"]] if status == 0 else []
        c.that("submit a torchrun-style script", status == 0, out.strip())
        status, out = gpuq("top", "--once")
        c.that("gpuq top shows the GPU", status == 0 and "GPU" in out, "\n" + out)
        status, out = gpuq("wait", "--json", *ids, timeout=1500)
        states = {j["name"]: j["state"] for j in json.loads(out)["jobs"]} if out.strip().startswith("{") else {}
        c.that("the jobs succeed", status == 0 and set(states.values()) == {"succeeded"}, states or out[-1500:])
        status, out = gpuq("results", "--json", *ids)
        devices = {j["name"]: (j.get("result") or {}).get("device") for j in json.loads(out)["jobs"]} if status == 0 else {}
        c.that(f"train jobs ran on {a.where}", devices.get("fashion-mnist-mlp") == a.where
               and devices.get("fashion-mnist-cnn") == a.where, out.strip()[:3000])
        status, out = gpuq("results", *ids)
        c.say(out)
        # A PNG where this build has the painter (cairo); SVG only where it has none, or where the
        # build stage did not run to say.
        names = {True: ("curves.png",), False: ("curves.svg",)}.get(getattr(a, "png", None),
                                                                    ("curves.png", "curves.svg"))
        for name in names:
            status, out = gpuq("plot", *ids, "-o", os.path.join(a.out, name))
            if status == 0:
                break
        c.that(f"plot the curves ({name})", status == 0, out.strip())
        if len(doc.get("gpus", [])) < 2:
            status, out = gpuq("submit", os.path.join(REPO, "jobs", "fashion-mnist-ddp.json"))
            c.that("a gang larger than the machine is refused with a reason", status != 0, out.strip())


LIMIT_TESTS = ["test_supervision.AttemptCgroups", "test_supervision.KernelLimits", "test_supervision.CgroupParent",
               "test_reliability.OutOfMemory"]


def cgroup_parent(c):
    """A cgroup of the check's own directly below the v2 root, for --cgroup-parent: a container's
    cgroup holds other processes and so hands no controller down, where a cgroup with none in it
    does (the root hands its children what its subtree_control has: memory, pids and cpuset are
    enabled there first). None where there is no v2 root to write to (then the tests say what is
    not in force, and skip)."""
    with open("/proc/self/mountinfo") as f:
        mounts = [l.split() for l in f]
    root = next((f[4] for f in mounts if "-" in f and f[f.index("-") + 1] == "cgroup2" and f[3] == "/"), None)
    if not root:
        c.say("no --cgroup-parent: no cgroup v2 hierarchy mounted at its root here")
        return None
    for controller in ("memory", "pids", "cpuset"):
        try:
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+" + controller)
        except OSError as e:
            c.say(f"cannot enable {controller} in {root}/cgroup.subtree_control: {e}")
    parent = os.path.join(root, f"gpuq-check-{os.getpid()}")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        c.say(f"no --cgroup-parent: cannot make {parent}: {e}")
        return None
    with open(os.path.join(parent, "cgroup.controllers")) as f:
        c.say(f"--cgroup-parent {parent}, given: {f.read().strip()}")
    return parent


def stage_limits(c, a):
    """The cgroup tests on this host (a GPU machine's kernel and cgroup layout, often v2 alone),
    every gpuqd with --cgroup-parent (a cgroup of the check's own below the v2 root): as root on a
    GPU machine none may skip, since each limit must be in force there. Then, on the real GPUs, a
    job given none cannot open /dev/nvidia0 where the device limit is in force."""
    parent = cgroup_parent(c)
    try:
        return limits_under(c, a, parent)
    finally:
        if parent:
            try:
                os.rmdir(parent)
            except OSError as e:
                c.say(f"{parent} left behind: {e}")


def limits_under(c, a, parent):
    env = {"GPUQ_BIN_DIR": os.path.join(a.build, "bin"), "PYTHONUNBUFFERED": "1",
           "GPUQ_TEST_CGROUP_PARENT": parent or ""}
    # From the tests' folder, whose harness they import (--python and --build are absolute: main).
    status, out = c.run([a.python, "-m", "unittest", "-v", *LIMIT_TESTS], env=env, cwd=os.path.join(REPO, "tests/integration"),
                        timeout=900)
    skipped = [l.strip() for l in out.splitlines() if " skipped " in l]
    c.that("the cgroup integration tests pass", status == 0, out.strip().splitlines()[-1] if out.strip() else "")
    if a.device == "cuda" and os.geteuid() == 0:
        c.that("none of them skips as root", not skipped, skipped)
    else:
        c.say(f"skipped (not checked off a GPU machine or not as root): {skipped}")
    if a.device != "cuda":
        return
    options = ["--gpus", "nvml", *(["--cgroup-parent", parent] if parent else [])]
    with gpuqd(c, a, "gpuqd-limits.log", options, timeout=300) as (gpuq, tmp):
        status, out = gpuq("gpus", "--json")
        containment = json.loads(out).get("containment", "") if status == 0 else out
        c.say(f"containment: {containment}")
        if "the GPUs given (" not in containment:
            c.that("the device limit is in force on the GPU machine", False, containment)
            return
        # Every GPU node there is (a container may hold /dev/nvidia3 alone): errno of opening each.
        probe = ("import glob, json, os, re, torch\n"
                 "seen = {}\n"
                 "for node in sorted(n for n in glob.glob('/dev/nvidia*') if re.fullmatch(r'/dev/nvidia[0-9]+', n)):\n"
                 "    try:\n"
                 "        os.close(os.open(node, os.O_RDWR)); seen[node] = 0\n"
                 "    except OSError as e:\n"
                 "        seen[node] = e.errno\n"
                 "print(json.dumps([os.environ.get('CUDA_VISIBLE_DEVICES'), seen, torch.cuda.device_count()]))\n")
        ids = []
        for gpus in (0, 1):
            spec = os.path.join(tmp, f"probe{gpus}.json")
            with open(spec, "w") as f:
                json.dump({"name": f"probe{gpus}", "gpus": gpus, "retries": 0, "command": [a.python, "-c", probe]}, f)
            status, out = gpuq("submit", "--json", spec)
            ids += [str(i) for i in json.loads(out)["ids"]] if status == 0 else []
        status, out = gpuq("wait", "--json", *ids)
        said = []
        for i in ids:
            lines = gpuq("logs", i)[1].strip().splitlines()
            try:
                said.append(json.loads(lines[-1]))
            except (IndexError, ValueError):
                said.append(lines[-5:])
        c.say(f"probes (CUDA_VISIBLE_DEVICES, errno of opening each GPU node, CUDA devices seen): {said}")
        ok = len(said) == 2 and all(isinstance(s, list) and len(s) == 3 and s[1] for s in said)
        c.that("a job given no GPU can open no GPU node (EPERM) and sees no CUDA device",
               ok and set(said[0][1].values()) == {errno.EPERM} and said[0][2] == 0, said[:1])
        c.that("a job given one GPU opens its node alone and sees one CUDA device",
               ok and sorted(said[1][1].values()).count(0) == 1
               and set(said[1][1].values()) <= {0, errno.EPERM} and said[1][2] == 1, said[1:])


def stage_throughput(c, a):
    status, out = c.run([a.python, os.path.join(REPO, "bench/throughput.py"), "--bin", os.path.join(a.build, "bin"),
                         "--device", a.device, "--out", os.path.join(a.out, "throughput.json"),
                         # the dry run: one batch size, one epoch on a fifth of the data (not judged)
                         *(["--batches", "64", "--epochs", "1", "--samples", "12000"] if a.device == "cpu" else [])],
                        timeout=1200)
    c.that("throughput benchmark", status == 0, "\n" + "\n".join(out.strip().splitlines()[-8:]))
    if status == 0:
        rows = json.load(open(os.path.join(a.out, "throughput.json")))
        at64 = [r for r in rows if r["batch"] == 64 and r["mode"] in ("alone", "graph")]
        if a.device == "cuda":
            c.that("at least 1.5x eager PyTorch at batch 64", at64 and max(r["speedup"] for r in at64) >= 1.5, at64)
        else:  # the dry run, on a shared CPU: a speed goal is the GPU's, and a loaded CI box is no measure
            c.say(f"(not checked on the CPU) against eager PyTorch at batch 64: {at64}")


def stage_accuracy(c, a):
    short = ["--epochs", "1", "--limit", str(MLP["dataset"]["limit"])] if a.device == "cpu" else []  # the dry run
    status, out = c.run([a.python, os.path.join(REPO, "bench/accuracy.py"), "--bin", os.path.join(a.build, "bin"),
                         "--only", "cnn,cnn-bn", "--device", a.device, *short], timeout=1800)
    c.that("Fashion-MNIST CNN accuracy benchmark", status == 0, "\n" + "\n".join(out.strip().splitlines()[-4:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "gpu-check"))
    ap.add_argument("--build", default=os.path.join(REPO, "build-gpu"))
    ap.add_argument("--debs", help="a folder of Debian packages to unpack for the build (scripts/fetch-debs.sh)")
    ap.add_argument("--python", default=sys.executable, help="the Python that has PyTorch")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("stages", nargs="*", metavar="STAGE", help=" ".join(STAGES))
    a = ap.parse_args()
    # One meaning for a relative path, whichever folder a stage or a job runs in: the caller's.
    a.build, a.out = os.path.abspath(a.build), os.path.abspath(a.out)
    if os.sep in a.python:
        a.python = os.path.abspath(a.python)
    unknown = [s for s in a.stages if s not in STAGES]
    if unknown:
        ap.error(f"unknown stage {unknown[0]!r} (stages: {' '.join(STAGES)})")
    os.makedirs(a.out, exist_ok=True)
    a.where = "cuda:0" if a.device == "cuda" else "cpu"
    MLP["device"] = a.device
    a.accuracy = 0.85
    if a.device == "cpu":  # a dry run: a tenth of the data, so it takes minutes
        MLP["dataset"]["limit"], a.accuracy = 6000, 0.75
    summary = []
    for stage in a.stages or STAGES:
        c = Check(a.out, stage)
        t0 = time.time()
        try:
            ok = globals()["stage_" + stage](c, a)
        except Exception as e:  # a broken stage must not hide the others' results
            ok = c.that("stage ran to its end", False, repr(e))
        summary.append({"stage": stage, "seconds": round(time.time() - t0), "checks": c.results})
        json.dump(summary, open(os.path.join(a.out, "summary.json"), "w"), indent=1)
        if stage == "build" and ok is False:
            break
    failed = [f"{s['stage']}: {r['check']}" for s in summary for r in s["checks"] if not r["ok"]]
    total = sum(len(s["checks"]) for s in summary)
    print(f"\n{total - len(failed)}/{total} checks passed" + "".join("\n  FAIL " + f for f in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
