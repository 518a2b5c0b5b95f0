"""The Python client against a real gpuqd (tests/integration's harness: a temp socket, fake GPUs).
Run with pytest (CTest: python.client) or unittest."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
sys.path.insert(0, PYTHON_DIR)
sys.path.insert(0, os.path.join(os.path.dirname(PYTHON_DIR), "tests", "integration"))

import gpuq  # noqa: E402
from harness import DaemonTest, wait_until  # noqa: E402

WORKERS = '''
import os

def square(x):
    return {"x": x, "square": x * x, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}

def picky(x):
    if x == 2:
        raise ValueError(f"no twos, please (got {x})")
    return x

def big(n):
    return "z" * n

def stuck(gate):
    import time
    while not os.path.exists(gate):
        time.sleep(0.05)
    return gate
'''


class ClientTest(DaemonTest):
    def setUp(self):
        super().setUp()
        self.client = gpuq.Client(self.d.socket)
        self.addCleanup(self.client.close)
        with open(self.tmp_path("workers.py"), "w") as f:
            f.write(WORKERS)
        sys.path.insert(0, self.tmp)
        self.addCleanup(sys.path.remove, self.tmp)
        sys.modules.pop("workers", None)
        import workers  # noqa: F401
        self.workers = sys.modules["workers"]

    def run_script(self, name, body):
        """Runs a script of the caller's (gpuq imported, then `body`) against the test's gpuqd."""
        script = self.tmp_path(name)
        with open(script, "w") as f:
            f.write(f"import sys\nsys.path.insert(0, {PYTHON_DIR!r})\nimport gpuq\n" + textwrap.dedent(body))
        return subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, GPUQ_SOCKET=self.d.socket), cwd=self.tmp)

    def test_submit_status_wait_and_results_as_a_dict(self):
        self.assertEqual(self.client.hello["protocol_version"], 1)
        batch = self.client.submit([
            {"name": f"ds{i}", "shell": f"echo '{{\"type\": \"result\", \"acc\": 0.{i}}}' >> $GPUQ_EVENTS"}
            for i in range(3)])
        self.assertEqual(len(batch.ids), 3)
        self.assertEqual({j["id"] for j in self.client.status()} >= set(batch.ids), True)
        done = self.client.wait(batch)
        self.assertEqual([j["state"] for j in done], ["succeeded"] * 3)
        self.assertEqual(self.client.results(batch=batch.id), {"ds0": {"acc": 0.0}, "ds1": {"acc": 0.1},
                                                               "ds2": {"acc": 0.2}})
        self.assertEqual(self.client.results(ids=batch.ids[:1]), {"ds0": {"acc": 0.0}})
        # It sent this process's environment and directory, as gpuq does.
        os.environ["GPUQ_PY_TEST"] = "from the caller"
        try:
            job = self.client.submit({"name": "env", "shell": "echo $GPUQ_PY_TEST; pwd"}).ids[0]
        finally:
            del os.environ["GPUQ_PY_TEST"]
        self.client.wait([job])
        self.assertEqual(self.d.ok("logs", str(job)), f"from the caller\n{os.getcwd()}\n")

    def test_preempt_and_requeue_put_a_running_job_back_in_line(self):
        started = self.tmp_path("started")
        job = self.client.submit({"name": "long", "timeout_s": 120, "shell":
                                  f'[ "$GPUQ_ATTEMPT" -ge 3 ] && exit 0; touch {started}-$GPUQ_ATTEMPT; '
                                  'while true; do sleep 0.05; done'}).ids[0]
        wait_until(lambda: os.path.exists(f"{started}-1"), what="the job to start")
        self.assertEqual(self.client.preempt([job]), [{"id": job, "state": "running", "changed": True}])
        wait_until(lambda: os.path.exists(f"{started}-2"), what="its second attempt")
        self.assertEqual(self.client.requeue([job])[0]["changed"], True)
        done = self.client.wait([job])[0]
        self.assertEqual((done["state"], done["attempt"], done["attempt_base"], done["preemptions"]),
                         ("succeeded", 3, 2, 1))
        with self.assertRaises(gpuq.WrongState):
            self.client.preempt([job])

    def test_errors_are_typed(self):
        with self.assertRaises(gpuq.InvalidSpec) as e:
            self.client.submit({"name": "x", "command": ["true"], "gpu": 1})
        self.assertIn("unknown field `gpu`", str(e.exception))
        self.assertEqual(e.exception.code, "invalid_spec")
        with self.assertRaises(gpuq.NotFound):
            self.client.show(999)
        with self.assertRaises(gpuq.Unavailable) as e:
            gpuq.Client(self.tmp_path("nobody.sock"))
        self.assertIn("is it running", str(e.exception))
        self.assertIsInstance(e.exception, gpuq.Error)

    def test_map_returns_results_in_order_each_job_on_its_own_gpu(self):
        out = gpuq.map(self.workers.square, [3, 1, 2, 4], gpus=1, client=self.client)
        self.assertEqual([o["square"] for o in out], [9, 1, 4, 16])
        self.assertEqual(sorted(o["gpus"] for o in out), ["0", "1", "2", "3"])  # four GPUs, one each
        self.assertEqual(gpuq.map(self.workers.square, [], client=self.client), [])
        # A value over 512 KiB comes back through a file in the job's directory.
        self.assertEqual(gpuq.map(self.workers.big, [600000], gpus=0, client=self.client), ["z" * 600000])

    def test_map_raises_for_a_failed_item_with_the_remote_traceback(self):
        with self.assertRaises(gpuq.JobFailed) as e:
            gpuq.map(self.workers.picky, [1, 2, 3], gpus=0, client=self.client, name="picky")
        failed = e.exception
        self.assertEqual((failed.index, failed.state), (1, "failed"))
        self.assertIn("ValueError: no twos, please (got 2)", failed.remote_traceback)
        self.assertIn('workers.py", line', failed.remote_traceback)
        self.assertIn("In the job:", str(failed))
        # The other items' results are there all the same.
        batch = self.client.jobs([failed.job])[0]["batch"]
        results = self.client.results(batch=batch)
        self.assertEqual((results["picky-0"], results["picky-2"]), ({"value": 1}, {"value": 3}))
        with self.assertRaises(ValueError):
            gpuq.map(lambda x: x, [1], client=self.client)

    def test_map_cancels_its_jobs_when_its_wait_ends_without_them(self):
        gate = self.tmp_path("never")  # never made: the items' jobs would run on
        with self.assertRaises(TimeoutError):
            gpuq.map(self.workers.stuck, [gate, gate], gpus=0, client=self.client, timeout=2, name="stuck")
        jobs = self.client.status(all=True)
        self.assertEqual(len(jobs), 2)
        ended = self.client.wait([j["id"] for j in jobs], timeout=60)
        self.assertEqual({j["state"] for j in ended}, {"cancelled"})

    def test_ctrl_c_in_map_cancels_its_jobs_at_once(self):
        # Ctrl-C lands while the wait's request is held: its connection is given up, and the cancel
        # goes on a new one (on the old one it would have waited for every job to end).
        gate, started = self.tmp_path("never"), self.tmp_path("started")
        script = self.tmp_path("interrupted.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f'''
                import os, sys, time
                sys.path.insert(0, {PYTHON_DIR!r})
                import gpuq

                def stuck(i):
                    open({started!r} + str(i), "w").close()
                    while not os.path.exists({gate!r}):
                        time.sleep(0.05)

                if __name__ == "__main__":
                    gpuq.map(stuck, [0, 1], gpus=0, name="stuck")
                '''))
        proc = subprocess.Popen([sys.executable, script], env=dict(os.environ, GPUQ_SOCKET=self.d.socket),
                                cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.kill)
        wait_until(lambda: all(os.path.exists(started + str(i)) for i in (0, 1)), what="both items' jobs to run")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        self.assertIn("KeyboardInterrupt", err)
        jobs = self.client.status(all=True)
        ended = self.client.wait([j["id"] for j in jobs], timeout=60)
        self.assertEqual({j["state"] for j in ended}, {"cancelled"})

    def test_map_from_a_module_run_with_python_m_imports_it_by_name(self):
        # `python -m pkg.sweep`: the job imports pkg.sweep, whose relative import works (loaded from
        # its file as a script, it would fail).
        pkg = self.tmp_path("pkg")
        os.mkdir(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write("")
        with open(os.path.join(pkg, "helpers.py"), "w") as f:
            f.write("def double(x):\n    return 2 * x\n")
        with open(os.path.join(pkg, "sweep.py"), "w") as f:
            f.write(textwrap.dedent(f'''
                import json, sys
                sys.path.insert(0, {PYTHON_DIR!r})
                import gpuq
                from .helpers import double

                def train(x):
                    return double(x)

                if __name__ == "__main__":
                    print(json.dumps(gpuq.map(train, [1, 2], gpus=0)))
                '''))
        r = subprocess.run([sys.executable, "-m", "pkg.sweep"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, GPUQ_SOCKET=self.d.socket), cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), [2, 4])

    def test_map_runs_a_scripts_own_function_without_its_main_block(self):
        r = self.run_script("sweep.py", '''
            def train(lr):
                return {"lr": lr, "loss": 1 - lr}

            if __name__ == "__main__":
                import json
                print(json.dumps(gpuq.map(train, [0.1, 0.5], gpus=1)))
            ''')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), [{"lr": 0.1, "loss": 0.9}, {"lr": 0.5, "loss": 0.5}])

    def test_a_script_calling_map_at_its_top_level_fails_its_jobs_instead_of_submitting_more(self):
        r = self.run_script("unguarded.py", '''
            def train(lr):
                return lr

            gpuq.map(train, [1, 2], gpus=0)
            ''')
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("gpuq.JobFailed", r.stderr)
        self.assertIn("put that under if __name__", r.stderr)
        self.assertEqual(len(self.client.status(all=True)), 2)  # the two items' jobs, and no more

    def test_a_connection_that_lost_a_reply_is_not_read_again(self):
        client = gpuq.Client(self.d.socket)
        self.addCleanup(client.close)
        job = client.submit({"name": "w", "shell": "sleep 30"}).ids[0]
        client._conn._sock.settimeout(0.2)
        with self.assertRaises(gpuq.Unavailable):
            client._conn.call({"cmd": "wait", "ids": [job], "timeout_s": 5})  # answered after its timeout
        # The next call connects again, and gets its own reply, not the wait's.
        self.assertEqual(client.show(job)["job"]["id"], job)
        client.cancel([job])

    def test_report_from_inside_a_job(self):
        code = (f"import sys; sys.path.insert(0, {PYTHON_DIR!r}); import gpuq; "
                "gpuq.report(progress={'epoch': 1, 'epochs': 2, 'loss': 0.5}); "
                "gpuq.report(result={'acc': 0.9}); gpuq.report(result={'f1': 0.8})")
        job = self.client.submit({"name": "rep", "command": [sys.executable, "-c", code]}).ids[0]
        done = self.client.wait([job])[0]
        self.assertEqual(done["state"], "succeeded")
        self.assertEqual(done["result"], {"acc": 0.9, "f1": 0.8})
        self.assertEqual((done["progress"]["epoch"], done["progress"]["loss"]), (1, 0.5))
        self.assertFalse(gpuq.report(result={"x": 1}))  # not in a job: nothing happens

    def test_a_waiting_client_outlives_a_gpuqd_restart(self):
        release = self.tmp_path("release")
        job = self.client.submit({"name": "slow", "shell": f"while [ ! -e {release} ]; do sleep 0.05; done"}).ids[0]
        wait_until(lambda: self.client.show(job)["job"]["state"] == "running", what="the job to run")
        got = {}
        waiter = threading.Thread(target=lambda: got.update(jobs=self.client.wait([job], timeout=120)))
        waiter.start()
        wait_until(lambda: self.d.json("gpus").get("waits_held", 1) >= 1, what="the wait to be held")
        self.d.kill9()
        open(release, "w").close()
        self.d.start()
        waiter.join(120)
        self.assertFalse(waiter.is_alive())
        self.assertEqual(got["jobs"][0]["state"], "succeeded")


if __name__ == "__main__":
    unittest.main()
