"""What a hostile or buggy job or client sends: each case a reproduction of an attack that once
crashed, stalled or fooled gpuqd (docs/reliability.md, "Untrusted input"). Every test checks the
daemon is still answering afterwards."""
import json
import os
import signal
import socket
import subprocess
import time
import unittest

from harness import BIN, DaemonTest, event_line, wait_until


def python_job(code, **spec):
    """A job whose command is a Python program (for bytes a shell cannot write easily)."""
    return dict({"command": ["python3", "-c", code]}, **spec)


class HostileEvents(DaemonTest):
    def assert_alive(self):
        self.assertEqual(self.d.request({"cmd": "hello", "protocol_version": 1})["ok"], True)

    def test_an_event_line_nested_100000_deep_is_one_bad_line_and_survives_a_restart(self):
        # It used to overflow gpuqd's stack, and its offset was never committed, so every restart
        # read it again and died again.
        code = ("import os\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write('{\"type\":\"progress\",\"x\":' + '[' * 100000 + ']' * 100000 + '}\\n')\n"
                "    f.write('{\"type\": \"result\", \"after\": 1}\\n')\n")
        job_id = self.d.submit(python_job(code, name="deep"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["bad_event_lines"], 1)
        self.assertEqual(job["result"], {"after": 1})
        self.d.kill9()
        self.d.start()
        self.assert_alive()
        self.assertEqual(self.d.show(job_id)["job"]["bad_event_lines"], 1)

    def test_a_last_event_line_without_a_newline_is_read_once_the_job_ends(self):
        code = ("import json, os\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write(json.dumps({'type': 'result', 'acc': 0.5}))\n")
        job_id = self.d.submit(python_job(code, name="no-newline"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"acc": 0.5})
        self.assertEqual(job["bad_event_lines"], 0)

    def test_a_50_mb_line_counts_once_and_a_result_forged_at_its_end_is_not_taken(self):
        code = ("import os\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write(' ' * (50 << 20) + ',{\"type\": \"result\", \"forged\": 1}\\n')\n"
                "    f.write('{\"type\": \"result\", \"real\": 1}\\n')\n")
        job_id = self.d.submit(python_job(code, name="overlong"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"real": 1})
        self.assertEqual(job["bad_event_lines"], 1)
        self.assert_alive()

    def test_a_forged_exit_record_of_the_wrong_types_fails_the_job_instead_of_gpuqd(self):
        # The job's directory is the job's to write: an exit record with every field of the wrong
        # type, left where the supervisor would write one, must not throw inside gpuqd.
        bad = json.dumps({"ranks": [1, "x", None], "first_failure": {"rank": "r", "signal": "9"},
                          "ended_at": "now", "cancelled": "yes", "error": 7})
        code = ("import os, signal\n"
                "d = os.path.dirname(os.environ['GPUQ_EVENTS'])\n"
                f"open(os.path.join(d, 'exit.json'), 'w').write({bad!r})\n"
                "os.kill(os.getppid(), signal.SIGKILL)\n")  # the supervisor: no record of its own
        job_id = self.d.submit(python_job(code, name="forger"))["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "failed")
        self.assert_alive()

    def test_an_exit_record_written_by_a_running_job_does_not_end_it_across_a_restart(self):
        release = self.tmp_path("release")
        code = ("import json, os, time\n"
                "d = os.path.dirname(os.environ['GPUQ_EVENTS'])\n"
                "open(os.path.join(d, 'exit.json'), 'w').write(json.dumps({'ranks': [{'exit_code': 0}]}))\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write('{\"type\": \"progress\", \"forged\": 1}\\n')\n"
                f"while not os.path.exists({release!r}):\n"
                "    time.sleep(0.05)\n"
                "with open(os.environ['GPUQ_EVENTS'], 'a') as f:\n"
                "    f.write('{\"type\": \"result\", \"finished\": 1}\\n')\n")
        job_id = self.d.submit(python_job(code, name="early-record"))["ids"][0]
        wait_until(lambda: (self.d.show(job_id)["job"]["progress"] or {}).get("forged") == 1,
                   what="the forged record to be written")
        self.d.kill9()
        self.d.start()
        self.assertEqual(self.d.show(job_id)["job"]["state"], "running")
        open(release, "w").close()
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["result"], {"finished": 1})


class VanishedCwd(DaemonTest):
    def test_a_job_whose_cwd_vanished_fails_with_the_reason_and_runs_nowhere_else(self):
        scratch = self.tmp_path("scratch")
        os.mkdir(scratch)
        job_id = self.d.submit({"name": "rm-star", "shell": "pwd; touch CREATED_BY_JOB", "cwd": scratch},
                               "--hold")["ids"][0]
        os.rmdir(scratch)
        self.d.ok("release", str(job_id))
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "failed")
        self.assertIn(f"working directory {scratch} is gone (No such file or directory)", job["reason"])
        created = [os.path.join(root, "CREATED_BY_JOB") for root, _, files in os.walk(self.tmp)
                   if "CREATED_BY_JOB" in files]
        self.assertEqual(created, [])
        self.assertFalse(os.path.exists(os.path.join(os.getcwd(), "CREATED_BY_JOB")))

    def test_the_supervisor_refuses_a_working_directory_that_vanishes_after_gpuqd_checked_it(self):
        # The window between gpuqd's check and the rank's start, driven by hand: the supervisor
        # alone, given a launch document whose directory is gone.
        adir = self.tmp_path("attempt")
        os.mkdir(adir)
        doc = {"job_id": 1, "attempt": 1, "timeout_s": 0, "grace_s": 1, "log_limit_bytes": 0,
               "ranks": [{"rank": 0, "argv": ["/bin/sh", "-c", "touch CREATED_BY_JOB"],
                          "env": {"PATH": "/usr/bin:/bin"}, "cwd": self.tmp_path("gone"),
                          "log": os.path.join(adir, "rank-0.log")}],
               "pid_file": os.path.join(adir, "shim.pid"), "exit_file": os.path.join(adir, "exit.json")}
        with open(os.path.join(adir, "launch.json"), "w") as f:
            json.dump(doc, f)
        subprocess.run([os.path.join(BIN, "gpuq-shim"), os.path.join(adir, "launch.json")], cwd=self.tmp,
                       timeout=60, check=True)
        with open(os.path.join(adir, "exit.json")) as f:
            self.assertEqual(json.load(f)["ranks"][0]["exit_code"], 127)
        with open(os.path.join(adir, "rank-0.log")) as f:
            self.assertIn(f"cannot enter the job's working directory {self.tmp_path('gone')}", f.read())
        self.assertFalse(os.path.exists(self.tmp_path("CREATED_BY_JOB")))


if __name__ == "__main__":
    unittest.main()
