"""Integration-test harness: a real gpuqd on a temporary socket and state dir, driven by the
real gpuq. Binary paths come from CMake through $GPUQ_BIN_DIR. A failing test keeps its
temporary directory and prints where it is."""
import atexit
import contextlib
import json
import itertools
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("GPUQ_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
# libnvidia-ml.so.1 stand-in (tests/fake_nvml), for gpuqd --gpus nvml without NVIDIA GPUs.
FAKE_NVML_DIR = os.path.abspath(os.path.join(BIN, "..", "tests", "fake-nvml"))
# The tests' gpuqd and gpuq read no configuration file and no defaults from the environment
# (a developer's ~/.config/gpuq/config.json must not change what they test).
os.environ["GPUQ_CONFIG"] = ""
for _variable in ("GPUQ_SOCKET", "GPUQ_STATE_DIR", "GPUQ_GPUS", "GPUQ_LOG_LIMIT_MB", "GPUQ_RETRIES", "GPUQ_RECONNECT_S"):
    os.environ.pop(_variable, None)


def ensure_account(name, groups=()):
    """An ordinary user `name` (made if missing), in `groups` too."""
    if subprocess.run(["id", name], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    for group in groups:
        subprocess.run(["usermod", "--append", "--groups", group, name], check=True, capture_output=True)


def proc_state(pid):
    """A process's state letter (R, S, T, ...) from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def uid_of(name):
    return int(subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout)


def gid_of(name):
    return int(subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True).stdout)


def wait_until(pred, timeout=20.0, interval=0.05, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# A cgroup v2 directory every gpuqd of the tests makes its attempts' cgroups under (--cgroup-parent),
# where gpuqd's own cgroup cannot hand controllers down (a container's, with other processes in it).
CGROUP_PARENT = os.environ.get("GPUQ_TEST_CGROUP_PARENT", "")


class Daemon:
    """One gpuqd in the foreground, as a child of the test."""

    def __init__(self, tmp, gpus="fake:4", extra=(), env=None):
        self.tmp = tmp
        self.env = env  # gpuqd's environment (None: the test's), at every start
        self.socket = os.path.join(tmp, "gpuqd.sock")
        self.state = os.path.join(tmp, "state")
        self.gpus = gpus
        self.extra = list(extra)
        self.proc = None
        self.log = None
        self.cgroups = None  # where its attempts' cgroups are, once it said so
        self.limit_cgroups = set()  # and those of the v1 hierarchies that give it limits

    def start(self, env=None, cpus=None, stack_kb=None, nofile=None, umask=None, user=None):
        """Starts gpuqd; `cpus` (a set of cores) is its affinity mask, as under taskset -c;
        `stack_kb` its stack limit, as under ulimit -s (exec's ARG_MAX is a quarter of it);
        `nofile` its limit on open files, as under ulimit -n (a pair: soft and hard); `umask` its
        umask, as a unit's UMask= sets it; `user` (a name) the account it runs as, from root (its
        temp dir must be theirs)."""
        def setup():
            if cpus:
                os.sched_setaffinity(0, cpus)
            if stack_kb:
                resource.setrlimit(resource.RLIMIT_STACK, (stack_kb << 10, stack_kb << 10))
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile if isinstance(nofile, tuple) else (nofile, nofile))
            if umask is not None:
                os.umask(umask)

        if self.log:
            self.log.close()
        self.log = open(os.path.join(self.tmp, "gpuqd.log"), "ab")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "gpuqd"), "--foreground", "--socket", self.socket, "--state-dir", self.state,
             "--gpus", self.gpus, *self.defaults(), *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env if env is not None else self.env,
            preexec_fn=setup if cpus or stack_kb or nofile or umask is not None else None,
            user=user, group=gid_of(user) if user else None, extra_groups=[] if user else None)
        wait_until(lambda: self.proc.poll() is not None or self.run("daemon", "status").returncode == 0,
                   what="gpuqd to answer")
        if self.proc.poll() is not None:
            raise AssertionError(f"gpuqd exited at start with {self.proc.returncode}; see {self.tmp}/gpuqd.log")
        self.cgroups = attempt_cgroups_of(os.path.join(self.tmp, "gpuqd.log"))
        self.limit_cgroups = limit_cgroups_of(os.path.join(self.tmp, "gpuqd.log"))
        if self.cgroups:
            _cgroup_bases.add(self.cgroups)
        _cgroup_bases.update(self.limit_cgroups)
        return self

    def defaults(self):
        """Test-friendly settings, unless the test gives its own."""
        out = []
        for option, value in (("--grace", "2"), ("--retry-backoff", "0.2"), ("--cgroup-parent", CGROUP_PARENT)):
            if value and option not in self.extra:
                out += [option, value]
        return out

    @contextlib.contextmanager
    def paused(self):
        """gpuqd stopped (SIGSTOP, waited for) while the block runs, so that what clients send
        meanwhile is all there when it goes on; continued after."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proc_state(self.proc.pid) == "T", what="gpuqd to stop")
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log:
            self.log.close()

    def run(self, *args, input=None, cwd=None, timeout=120):
        env = dict(os.environ, GPUQ_SOCKET=self.socket)
        return subprocess.run([os.path.join(BIN, "gpuq"), *args], input=input, capture_output=True, text=True,
                              env=env, cwd=cwd or self.tmp, timeout=timeout)

    def ok(self, *args, **kw):
        r = self.run(*args, **kw)
        if r.returncode != 0:
            raise AssertionError(f"gpuq {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def json(self, *args, **kw):
        return json.loads(self.ok(*args, "--json", **kw))

    def submit(self, jobs, *extra):
        return self.json("submit", "-", *extra, input=json.dumps(jobs))

    def wait(self, ids, timeout=120):
        r = self.run("wait", *map(str, ids), "--json", timeout=timeout)
        return {j["id"]: j for j in json.loads(r.stdout)["jobs"]}

    def wait_for_counter(self, name, more=0, at_least=0, timeout=60):
        """Waits until gpuqd's `name` (gpus --json: scheduling_passes, health_checks, counted since
        it started) has moved on by `more` from now and reached `at_least`: what must not have
        happened is then checked after it had the chance, however loaded the machine, instead of
        after a sleep. Passes run on events: wait for `more` of them only where one is due."""
        target = max(self.json("gpus")[name] + more, at_least)
        wait_until(lambda: self.json("gpus")[name] >= target, timeout=timeout, what=f"{name} to reach {target}")

    def show(self, job_id):
        return self.json("show", str(job_id))

    def requests(self, requests):
        """Raw protocol: several requests on one connection (a hello first, say); their replies."""
        lines = [json.dumps(r) for r in requests]
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(self.socket)
            s.sendall(("\n".join(lines) + "\n").encode())
            buf = b""
            while buf.count(b"\n") < len(lines):
                chunk = s.recv(65536)
                if not chunk:
                    raise AssertionError("gpuqd closed the connection")
                buf += chunk
        return [json.loads(line) for line in buf.splitlines()]

    def request(self, obj_or_bytes):
        """Raw protocol: send one line, read one reply line."""
        data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else (json.dumps(obj_or_bytes) + "\n").encode()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(self.socket)
            s.sendall(data)
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        return json.loads(buf) if buf else None


class DaemonTest(unittest.TestCase):
    """Each test gets a fresh daemon (self.d); override GPUS for another machine."""
    GPUS = "fake:4"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.d = Daemon(self.tmp, self.GPUS).start()

    def tearDown(self):
        self.d.stop()
        # Jobs outlive the daemon by design: stop this test's job supervisors (each tears down its
        # job's process tree on SIGTERM) so nothing leaks into the next test.
        shims = pids_matching(f"gpuq-shim {self.tmp}/")
        for pid in shims:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if shims:
            try:
                wait_until(lambda: not pids_matching(f"gpuq-shim {self.tmp}/"), timeout=10, what="job supervisors to exit")
            except AssertionError:
                # One stopped (a job or hook may SIGSTOP it, and a guard under test may have let
                # it) holds its ranks: killed, so that nothing of this test outlives it.
                for pid in pids_matching(f"gpuq-shim {self.tmp}/"):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                raise
        if self.d.cgroups:
            remove_attempt_cgroups(self.d.cgroups)
        for base in self.d.limit_cgroups:
            remove_attempt_cgroups(base)
        if os.environ.get("GPUQ_SANITIZED"):
            self.check_sanitizer_reports()
        # unittest's result says whether this test failed (pytest's, running these tests, does not).
        result = getattr(getattr(self, "_outcome", None), "result", None)
        failed = any(e for t, e in (list(getattr(result, "errors", [])) + list(getattr(result, "failures", [])))
                     if t is self)
        if failed:
            print(f"\nkept {self.tmp} for inspection")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def check_sanitizer_reports(self):
        """Fails the test when any process it started (gpuqd, gpuq-shim, gpuq) printed a sanitizer
        report into the daemon's log or a job's log."""
        markers = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
        for root, _, files in os.walk(self.tmp):
            for name in files:
                if not name.endswith(".log"):
                    continue
                with open(os.path.join(root, name), errors="replace") as f:
                    text = f.read()
                hit = next((m for m in markers if m in text), None)
                if hit:
                    self.fail(f"sanitizer report in {os.path.join(root, name)}:\n{text[text.index(hit) - 200:][:4000]}")

    def tmp_path(self, name):
        return os.path.join(self.tmp, name)


def attempt_cgroups_of(log_path):
    """The cgroup a gpuqd made its attempts' cgroups under, as its log says; None without one."""
    try:
        with open(log_path, errors="replace") as f:
            said = re.search(r"each attempt runs in a cgroup of its own, under cgroup v[12] at (\S+)", f.read())
    except FileNotFoundError:
        return None
    return said.group(1) if said else None


def limit_cgroups_of(log_path):
    """The v1 hierarchies' cgroups a gpuqd made its attempts' cgroups under for limits (memory, pids,
    cpuset, devices where v2 does not give them), as its log says."""
    try:
        with open(log_path, errors="replace") as f:
            return set(re.findall(r"\(v1 at (/[^)\s]+)\)", f.read()))
    except FileNotFoundError:
        return set()


# Every gpuqd's attempts' cgroup this process saw: what is left in them goes when it exits.
_cgroup_bases = set()
atexit.register(lambda: [remove_attempt_cgroups(base) for base in sorted(_cgroup_bases)])


def remove_attempt_cgroups(base):
    """After a test: whatever its jobs left running (a job outlives gpuqd by design; a test may
    stop gpuqd with jobs running) is killed through its gpuqd's cgroup, which is then removed."""
    if not os.path.isdir(base):
        return
    if os.path.exists(os.path.join(base, "cgroup.kill")):
        with open(os.path.join(base, "cgroup.kill"), "w") as f:
            f.write("1")

        def populated():
            with open(os.path.join(base, "cgroup.events")) as f:
                return "populated 1" in f.read()
        wait_until(lambda: not populated(), timeout=10, what="the test's jobs' processes to die")
    # Each attempt's cgroup and its ranks' below it, the deepest first.
    for root, dirs, _ in os.walk(base, topdown=False):
        for d in dirs:
            try:
                os.rmdir(os.path.join(root, d))
            except OSError:
                pass
    try:
        os.rmdir(base)
    except OSError:
        pass


def pids_matching(pattern):
    r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def alive(pid):
    """Whether `pid` runs (a zombie has ended: it holds nothing but its entry)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def event_line(**fields):
    """Shell snippet appending one event line to $GPUQ_EVENTS."""
    return "echo '" + json.dumps(fields) + "' >> \"$GPUQ_EVENTS\""


# A job that reports its GPU and when it ran (wall clock), as a result event.
TIMED = ('t0=$(date +%s.%N); sleep {sleep}; t1=$(date +%s.%N); '
         'echo "{{\\"type\\":\\"result\\",\\"gpu\\":\\"$CUDA_VISIBLE_DEVICES\\",\\"t0\\":$t0,\\"t1\\":$t1}}" >> "$GPUQ_EVENTS"')


def max_overlap(intervals):
    """The most intervals (t0, t1) that overlap at any moment."""
    points = sorted([(t0, 1) for t0, _ in intervals] + [(t1, -1) for _, t1 in intervals])
    return max(itertools.accumulate(d for _, d in points))
