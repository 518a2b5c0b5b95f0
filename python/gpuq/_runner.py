"""A `gpuq.map` job: imports the caller's function by name, calls it on its item, reports what it
returned (or the exception, with its traceback) as the job's result."""
import importlib
import importlib.util
import json
import os
import sys
import traceback

from . import report

MAX_INLINE_BYTES = 512 << 10  # a result event is at most 1 MiB: larger values go to a file


def load_function(payload):
    sys.path[:] = payload.get("sys_path", []) + [p for p in sys.path if p not in payload.get("sys_path", [])]
    os.environ["GPUQ_MAP_LOADING"] = "1"  # a gpuq.map at the script's top level would submit again
    if payload.get("file"):  # the caller's __main__: loaded under another name, so its main block does not run
        spec = importlib.util.spec_from_file_location("__gpuq_main__", payload["file"])
        module = importlib.util.module_from_spec(spec)
        sys.modules["__gpuq_main__"] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(payload["module"])
    del os.environ["GPUQ_MAP_LOADING"]
    target = module
    for part in payload["qualname"].split("."):
        target = getattr(target, part)
    return target


def main():
    payload = json.loads(sys.argv[1])
    try:
        function = load_function(payload)
        value = function(payload["item"])
        text = json.dumps(value, allow_nan=False)
    except BaseException as e:  # noqa: B902 - what the function raised is the job's outcome
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        report(result={"error": {"type": type(e).__name__, "message": str(e)[:4096], "traceback": tb[-60000:]}})
        sys.exit(1)
    if len(text) <= MAX_INLINE_BYTES:
        report(result={"value": value})
        return
    path = os.path.join(os.environ.get("GPUQ_JOB_DIR") or os.getcwd(),
                        f"map-result-{os.environ.get('GPUQ_ATTEMPT', '1')}.json")
    with open(path, "w") as f:
        f.write(text)
    report(result={"file": path})


if __name__ == "__main__":
    main()
