"""gpuq's Python client: submit jobs to gpuqd, wait for them, read their results, report from
inside a job, and run a function over items one job each (docs/python.md)."""
import json
import os
import sys

from .client import (Batch, BadRequest, Client, Error, Forbidden, InvalidSpec, NotFound, StoreError, TooLarge,
                     Unavailable, VersionMismatch, WrongState, default_socket)

__all__ = ["Client", "Batch", "Error", "BadRequest", "InvalidSpec", "NotFound", "WrongState", "Forbidden",
           "TooLarge", "Unavailable", "VersionMismatch", "StoreError", "JobFailed", "report", "map",
           "default_socket"]

MAX_ITEM_BYTES = 100 << 10  # an item travels as one argument of the job's command (exec: 128 KiB)


def report(progress=None, result=None):
    """From inside a job: `progress` (a dict: epoch, step, loss, ...) becomes its progress, and
    `result`'s fields merge into its result (docs/job-spec.md). Outside a gpuq job, nothing
    happens (returns False), so a script runs the same standalone."""
    path = os.environ.get("GPUQ_EVENTS")
    if not path:
        return False
    lines = []
    if progress is not None:
        lines.append(_event_line({**progress, "type": "progress"}))
    if result is not None:
        lines.append(_event_line({**result, "type": "result"}))
    with open(path, "a") as f:
        for line in lines:
            f.write(line + "\n")  # one write a line (O_APPEND): ranks may report at once
    return True


def _plain(value):
    """A value as JSON can hold it: numpy and torch scalars as Python numbers (.item()), NaN and
    infinities as null (JSON has none), anything else unknown as its text."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "item"):
        try:
            return _plain(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _event_line(event):
    return json.dumps(_plain(event), allow_nan=False)


class JobFailed(Exception):
    """An item's job did not succeed: `index` (the item's), `job` (its id), `state`, `reason`,
    and `remote_traceback` where the function raised."""

    def __init__(self, index, job, state, reason, remote_traceback=None):
        self.index, self.job, self.state, self.reason = index, job, state, reason
        self.remote_traceback = remote_traceback
        message = f"item {index} (job {job}) {state}: {reason}"
        if remote_traceback:
            message += "\n\nIn the job:\n" + remote_traceback
        super().__init__(message)


def _function_name(function):
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module or "<" in qualname:
        raise ValueError(f"gpuq.map runs a function by its importable name; {function!r} has none (a lambda or a "
                         "function defined inside another): define it at a module's top level")
    if module == "__main__":
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name and spec.name != "__main__":
            # Started as `python -m pkg.mod`: the job imports pkg.mod by that name, so its relative
            # imports work (loaded from its file as a script they would not).
            return {"module": spec.name, "file": None, "qualname": qualname}
        main_file = getattr(main, "__file__", None)
        if not main_file:
            raise ValueError("gpuq.map cannot run a function of an interactive session's __main__: put it in a module")
        return {"module": "__main__", "file": os.path.abspath(main_file), "qualname": qualname}
    return {"module": module, "file": None, "qualname": qualname}


def map(function, items, gpus=1, name=None, client=None, timeout=0, **spec):  # noqa: A001 - as the builtin
    """Runs `function(item)` once per item, each in a job of its own with `gpus` GPUs (and any
    other spec field: memory_mb, cpus, shared, retries, timeout_s, env, ...), and returns what they
    returned, in the items' order: the one-dataset-per-GPU launcher in one call.

    How it travels: the function by its importable name (`module.function`; a script's own
    function is loaded from the script's file, its `if __name__ == "__main__"` block not run),
    run by this interpreter (sys.executable) with this process's sys.path, environment and
    working directory; each item as JSON in the job's command (at most 100 KiB: pass a path for
    more), each return value as JSON in the job's result (over 512 KiB, a file in the job's
    directory). So it works where the jobs see this machine's files: locally, or under gpuqd's
    Slurm executor where the nodes share the filesystem and the interpreter.

    A job that fails raises JobFailed for the first such item, with the job's reason and, where the
    function raised, its traceback; `timeout` (seconds) bounds the whole wait (TimeoutError). A
    wait that ends without the results (the timeout, Ctrl-C, a lost gpuqd) cancels the jobs still
    queued or running: nobody would read what they return."""
    if os.environ.get("GPUQ_MAP_LOADING"):
        raise RuntimeError("gpuq.map was called while a gpuq.map job loaded its function's script: the script "
                           "calls gpuq.map at its top level; put that under if __name__ == \"__main__\":")
    items = list(items)
    where = _function_name(function)
    where["sys_path"] = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bootstrap = f"import sys; sys.path.append({package_root!r}); from gpuq._runner import main; main()"
    base = name or where["qualname"].replace(".", "-")
    jobs = []
    for i, item in enumerate(items):
        payload = json.dumps({**where, "item": item}, allow_nan=False)
        if len(payload) > MAX_ITEM_BYTES:
            raise ValueError(f"item {i} is {len(payload)} bytes as JSON; gpuq.map passes at most {MAX_ITEM_BYTES} "
                             "in a job's command: pass a path to the data instead")
        jobs.append({"name": f"{base}-{i}", "gpus": gpus, "command": [sys.executable, "-c", bootstrap, payload],
                     **spec})
    if not jobs:
        return []
    own = client is None
    client = client or Client()
    try:
        batch = client.submit(jobs)
        try:
            done = {j["id"]: j for j in client.wait(batch.ids, timeout=timeout)}
        except BaseException:
            try:
                client.cancel(batch.ids)
            except Exception:  # noqa: BLE001 - what stopped the wait is what the caller hears of
                pass
            raise
        out = []
        for i, job_id in enumerate(batch.ids):
            job = done.get(job_id) or client.jobs([job_id])[0]
            result = job.get("result") or {}
            if job.get("state") != "succeeded":
                error = result.get("error") if isinstance(result.get("error"), dict) else {}
                raise JobFailed(i, job_id, job.get("state"), job.get("reason", ""), error.get("traceback"))
            if "file" in result and "value" not in result:
                with open(result["file"]) as f:
                    out.append(json.load(f))
            else:
                out.append(result.get("value"))
        return out
    finally:
        if own:
            client.close()
