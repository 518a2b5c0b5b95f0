"""gpuqd's socket protocol (docs/protocol.md): one JSON object a line each way over a unix socket,
the caller named by the kernel (SO_PEERCRED), never by what it sends."""
import json
import os
import socket
import time

PROTOCOL_VERSION = 1
PROTOCOL_MINOR = 4  # what this client reads: out_of_memory (1), watch (2), typed labels (3), preemption (4)
LAB_SOCKET = "/run/gpuq/gpuqd.sock"
MAX_REPLY_BYTES = 80 << 20  # gpuqd's replies stop at 8 MiB of results; a line is bounded well above


class Error(Exception):
    """gpuqd refused a request: `code` is for programs (docs/protocol.md), the message for people."""

    code = "internal"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code:
            self.code = code


class BadRequest(Error):
    code = "bad_request"


class InvalidSpec(Error):
    code = "invalid_spec"


class NotFound(Error):
    code = "not_found"


class WrongState(Error):
    code = "wrong_state"


class Forbidden(Error):
    code = "forbidden"


class TooLarge(Error):
    code = "too_large"


class Unavailable(Error):
    """gpuqd does not answer (not running, or went away), or said it cannot serve now."""

    code = "unavailable"


class VersionMismatch(Error):
    code = "version_mismatch"


class StoreError(Error):
    code = "store_error"


_BY_CODE = {c.code: c for c in (BadRequest, InvalidSpec, NotFound, WrongState, Forbidden, TooLarge, Unavailable,
                                VersionMismatch, StoreError)}


def error_of(reply):
    err = reply.get("error") or {}
    code = err.get("code", "internal")
    return _BY_CODE.get(code, Error)(err.get("message", "gpuqd refused the request"), code)


def default_socket():
    """As gpuq finds it: $GPUQ_SOCKET, else `socket` in the configuration file, else the user's
    own gpuqd's, else a lab's shared one where the user runs none."""
    if os.environ.get("GPUQ_SOCKET"):
        return os.environ["GPUQ_SOCKET"]
    config = os.environ.get("GPUQ_CONFIG")
    if config is None:
        base = os.environ.get("XDG_CONFIG_HOME") or (os.path.join(os.environ["HOME"], ".config")
                                                     if os.environ.get("HOME") else "")
        config = os.path.join(base, "gpuq", "config.json") if base else ""
    if config:
        try:
            with open(config) as f:
                path = json.load(f).get("socket")
            if isinstance(path, str) and path:
                return path
        except (OSError, ValueError, AttributeError):
            pass
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    own = os.path.join(runtime, "gpuq", "gpuqd.sock") if runtime else f"/tmp/gpuq-{os.getuid()}/gpuqd.sock"
    if not os.path.exists(own) and os.path.exists(LAB_SOCKET):
        return LAB_SOCKET
    return own


class Connection:
    """One connection, its hello said. Requests are answered in order."""

    def __init__(self, path, timeout=None):
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise Unavailable(f"cannot reach gpuqd at {path}: {e.strerror or e} (is it running? `gpuq daemon start`)")
        self._buf = b""
        self.broken = False  # a request went unanswered: the next reply could be its, so no more requests here
        self.hello = self.call({"cmd": "hello", "protocol_version": PROTOCOL_VERSION, "protocol_minor": PROTOCOL_MINOR,
                                "client": "gpuq-python"})

    def close(self):
        self._sock.close()

    def call(self, request, timeout=None):
        if self.broken:
            raise Unavailable(f"the connection to gpuqd at {self.path} lost a reply; connect again")
        try:
            line = json.dumps(request, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"
        except UnicodeEncodeError as e:
            raise BadRequest(f"the request cannot be sent: {e} (a string that is not UTF-8?)")
        if timeout is not None:
            self._sock.settimeout(timeout)
        try:
            self._sock.sendall(line)
            reply = self._read_line()
        except socket.timeout:
            self._give_up()
            raise Unavailable(f"gpuqd did not answer `{request.get('cmd')}` in time")
        except OSError as e:
            self._give_up()
            raise Unavailable(f"lost gpuqd at {self.path}: {e}")
        except BaseException:  # an Error, or Ctrl-C mid-request: its reply may still come here
            self._give_up()
            raise
        if not reply.get("ok"):
            raise error_of(reply)
        return reply

    def _give_up(self):
        self.broken = True
        self._sock.close()

    def _read_line(self):
        buf = bytearray(self._buf)
        scanned = 0
        while True:
            nl = buf.find(b"\n", scanned)
            if nl >= 0:
                break
            scanned = len(buf)
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise Unavailable(f"gpuqd at {self.path} closed the connection")
            buf += chunk
            if len(buf) > MAX_REPLY_BYTES:
                raise TooLarge(f"a reply longer than {MAX_REPLY_BYTES} bytes")
        line, self._buf = bytes(buf[:nl]), bytes(buf[nl + 1:])
        try:
            reply = json.loads(line)
        except ValueError as e:
            raise Error(f"gpuqd's reply is not JSON: {e}")
        if not isinstance(reply, dict):
            raise Error("gpuqd's reply is not a JSON object")
        return reply


class Batch:
    """What a submit made: the batch and its jobs' ids, in spec order."""

    def __init__(self, reply):
        self.id = reply["batch"]
        self.ids = list(reply["ids"])

    def __repr__(self):
        return f"Batch({self.id}, ids={self.ids})"


class Client:
    """A client of one gpuqd. A call after one that lost gpuqd (or its reply) connects again
    first; a request is never sent twice. `wait` waits out a restart (gpuqd stopped and started
    again) for up to `reconnect_s` in all."""

    def __init__(self, socket_path=None, timeout=None, reconnect_s=60):
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout
        self.reconnect_s = reconnect_s
        self._conn = Connection(self.socket_path, timeout)

    def close(self):
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def hello(self):
        return self._conn.hello

    def call(self, cmd, **fields):
        """One request as docs/protocol.md has it; the reply (without `ok`), or a typed Error."""
        request = {"cmd": cmd, **{k: v for k, v in fields.items() if v is not None}}
        if self._conn.broken:
            self._reconnect(time.monotonic())  # one try: the caller saw the last one fail
        reply = self._conn.call(request)
        reply.pop("ok", None)
        return reply

    def _reconnect(self, until):
        delay = 0.05
        while True:
            try:
                self._conn.close()
                self._conn = Connection(self.socket_path, self.timeout)
                return
            except Unavailable:
                if time.monotonic() >= until:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def submit(self, jobs, hold=False, max_running=0, cwd=None, env=None):
        """Submits a spec (a dict) or several (a list) as one batch (docs/job-spec.md). The jobs'
        base environment is this process's, as gpuq's; `cwd` defaults to this process's."""
        reply = self.call("submit", jobs=jobs, cwd=os.path.abspath(cwd or os.getcwd()),
                          env=dict(os.environ) if env is None else env, hold=hold, max_running=max_running)
        return Batch(reply)

    def status(self, all=False, limit=20, batch=None, states=None, name=None):
        """Running and queued jobs and the last `limit` that ended (with `all`, every job), each a
        dict (JobInfo). `batch`, `states` and `name` (a glob) keep only the jobs they name."""
        if not all:
            return self.call("status", limit=limit, batch=batch, states=states, name=name)["jobs"]
        jobs, after = [], 0
        while True:
            page = self.call("status", all=True, after=after, batch=batch, states=states, name=name)
            jobs += page["jobs"]
            if not page.get("more") or not page["jobs"]:
                return jobs
            after = page["jobs"][-1]["id"]

    def show(self, job_id):
        return self.call("show", id=job_id)

    def cancel(self, ids):
        return self.call("cancel", ids=_ids(ids))["jobs"]

    def requeue(self, ids):
        """Stops running jobs (SIGTERM, then SIGKILL) and puts them back in line, no retry spent."""
        return self.call("requeue", ids=_ids(ids))["jobs"]

    def preempt(self, ids):
        """Preempts running jobs: their preempt signal, $GPUQ_PREEMPT_FILE and grace to checkpoint,
        then back in line as preempted, no retry spent (gpuqd of protocol minor 4 or later)."""
        return self.call("preempt", ids=_ids(ids))["jobs"]

    def wait(self, ids, timeout=0):
        """Blocks until every job named has ended; returns them (dicts, in id order). With
        `timeout` (seconds) raises TimeoutError when they have not. A gpuqd restarted meanwhile is
        waited out (reconnect_s)."""
        ids = _ids(ids)
        deadline = time.monotonic() + timeout if timeout else None
        lost_since = None  # gpuqd gone: reconnect_s from then in all, not afresh at each loss
        while True:
            left = max(0.001, deadline - time.monotonic()) if deadline else 0
            try:
                if self._conn.broken:
                    self._reconnect((lost_since or time.monotonic()) + self.reconnect_s)
                reply = self._conn.call({"cmd": "wait", "ids": ids, "timeout_s": left}, timeout=None)
                lost_since = None
            except Unavailable:
                now = time.monotonic()
                lost_since = lost_since or now
                if now - lost_since >= self.reconnect_s:
                    raise
                self._conn.broken = True
                continue
            if reply.get("timed_out"):
                raise TimeoutError(f"jobs {ids} had not ended after {timeout} s")
            if not reply.get("more"):
                return reply["jobs"]
            return self._all_results(ids, None)

    def results(self, ids=None, batch=None):
        """{job name: result dict} for the jobs named (ids and/or a batch): the Manager().dict()
        of a torch.multiprocessing launcher. A job that reported nothing maps to None."""
        return {j["name"]: j.get("result") for j in self._all_results(_ids(ids) if ids else None, batch)}

    def jobs(self, ids=None, batch=None):
        """The jobs named, as dicts (JobInfo: state, reason, progress, result, ...), in id order."""
        return self._all_results(_ids(ids) if ids else None, batch)

    def _all_results(self, ids, batch):
        jobs, after = [], 0
        while True:
            page = self.call("results", ids=ids, batch=batch, after=after)
            jobs += page["jobs"]
            if not page.get("more") or not page["jobs"]:
                return jobs
            after = page["jobs"][-1]["id"]


def _ids(ids):
    if isinstance(ids, int):
        return [ids]
    if isinstance(ids, Batch):
        return list(ids.ids)
    return [int(i) for i in ids]
