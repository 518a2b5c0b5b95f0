"""The watch stream (docs/protocol.md#watch): gpuqd answers a watch when a job it asks about changes,
from a cursor any connection can resume; the human `gpuq wait` and `gpuq top` are driven by it
instead of by a poll interval."""
import fcntl
import json
import os
import pty
import socket
import struct
import subprocess
import termios
import threading

from harness import BIN, DaemonTest, event_line, wait_until


class Connection:
    """One raw protocol connection, kept open: requests are answered in order on it."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(120)
        self.sock.connect(path)
        self.buf = b""

    def send(self, request):
        self.sock.sendall((json.dumps(request) + "\n").encode())

    def receive(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("gpuqd closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, request):
        self.send(request)
        return self.receive()

    def close(self):
        self.sock.close()


class Watch(DaemonTest):
    def blocked(self, name, **extra):
        release = self.tmp_path(f"release-{name}")
        spec = {"name": name, "shell": f"while [ ! -e {release} ]; do sleep 0.05; done", **extra}
        return self.d.submit(spec)["ids"][0], release

    def test_a_held_watch_is_answered_by_its_job_s_change_and_its_cursor_resumes_on_another_connection(self):
        c = Connection(self.d.socket)
        first = c.call({"cmd": "watch"})  # no cursor yet: where to start, at once
        self.assertTrue(first["ok"], first)
        self.assertTrue(first["reset"])
        epoch, start = first["epoch"], first["cursor"]
        job, release = self.blocked("held")
        wait_until(lambda: self.d.show(job)["job"]["state"] == "running", what="the job to run")
        seen = c.call({"cmd": "watch", "epoch": epoch, "after": start, "ids": [job], "timeout_s": 60})
        self.assertEqual([j["id"] for j in seen["jobs"]], [job])  # once, as it is now
        self.assertEqual(seen["jobs"][0]["state"], "running")
        self.assertFalse(seen["reset"])
        # Nothing more for it: held in gpuqd until the job ends.
        c.send({"cmd": "watch", "epoch": epoch, "after": seen["cursor"], "ids": [job], "timeout_s": 120})
        wait_until(lambda: self.d.json("gpus")["watches_held"] == 1, what="the watch to be held")
        open(release, "w").close()
        ended = c.receive()
        self.assertEqual([(j["id"], j["state"]) for j in ended["jobs"]], [(job, "succeeded")])
        self.assertGreater(ended["cursor"], seen["cursor"])
        c.close()
        # Another connection, with the first cursor: the same changes, as they are now.
        again = Connection(self.d.socket)
        resumed = again.call({"cmd": "watch", "epoch": epoch, "after": start, "timeout_s": 0})
        self.assertEqual([(j["id"], j["state"]) for j in resumed["jobs"]], [(job, "succeeded")])
        self.assertEqual(resumed["cursor"], ended["cursor"])
        # Another run's cursor cannot be resumed: read afresh, from the head.
        other = again.call({"cmd": "watch", "epoch": epoch + 1, "after": start, "timeout_s": 0})
        self.assertTrue(other["reset"])
        self.assertEqual(other["jobs"], [])
        self.assertEqual(other["cursor"], ended["cursor"])
        # A job that does not exist is refused, as `wait` refuses it.
        missing = again.call({"cmd": "watch", "epoch": epoch, "after": start, "ids": [job + 100]})
        self.assertEqual(missing["error"]["code"], "not_found")
        again.close()

    def test_a_submit_says_where_the_stream_stood_before_its_jobs_so_a_watch_from_there_tells_of_them_at_once(self):
        earlier = self.d.submit({"name": "earlier", "shell": "true"})["ids"][0]
        self.assertEqual(self.d.wait([earlier])[earlier]["state"], "succeeded")
        c = Connection(self.d.socket)
        now = c.call({"cmd": "watch"})
        sub = c.call({"cmd": "submit", "cwd": self.tmp, "hold": True,
                      "jobs": [{"name": "a", "shell": "true"}, {"name": "b", "shell": "true"}]})
        self.assertTrue(sub["ok"], sub)
        self.assertEqual(sub["epoch"], now["epoch"])
        self.assertGreaterEqual(sub["cursor"], now["cursor"])  # past the earlier job's changes
        # From there, on the batch's ids or on everything: the batch's jobs, held, and nothing before.
        for ids in ({"ids": sub["ids"]}, {}):
            seen = c.call({"cmd": "watch", "epoch": sub["epoch"], "after": sub["cursor"], "timeout_s": 0, **ids})
            self.assertFalse(seen["reset"], seen)
            self.assertEqual([(j["id"], j["state"], j["held"]) for j in seen["jobs"]],
                             [(i, "queued", True) for i in sub["ids"]])
        c.close()
        # submit --wait follows from there on the connection it submitted on: one request held,
        # the job's end its answer.
        release = self.tmp_path("release-waited")
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket)
        p = subprocess.Popen([os.path.join(BIN, "gpuq"), "submit", "--wait", "-"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        p.stdin.write(json.dumps({"name": "waited", "shell": f"while [ ! -e {release} ]; do sleep 0.05; done"}))
        p.stdin.close()
        wait_until(lambda: self.d.json("gpus")["watches_held"] == 1, what="submit --wait's watch to be held")
        open(release, "w").close()
        self.assertEqual(p.wait(timeout=120), 0, p.stderr.read())
        self.assertRegex(p.stdout.read(), r"\d+  waited  succeeded")

    def test_a_cursor_of_a_gpuqd_that_restarted_is_reset(self):
        c = Connection(self.d.socket)
        first = c.call({"cmd": "watch"})
        c.close()
        self.d.stop()
        self.d.start()
        c = Connection(self.d.socket)
        after = c.call({"cmd": "watch", "epoch": first["epoch"], "after": first["cursor"], "timeout_s": 0})
        self.assertTrue(after["reset"])
        self.assertNotEqual(after["epoch"], first["epoch"])
        c.close()

    def test_the_human_wait_holds_one_watch_while_its_job_runs_and_ends_with_it(self):
        job, release = self.blocked("waited")
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket)
        p = subprocess.Popen([os.path.join(BIN, "gpuq"), "wait", str(job)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        wait_until(lambda: self.d.json("gpus")["watches_held"] == 1, what="the wait's watch to be held")
        answers = self.d.json("gpus")["watch_answers"]
        # Another job runs and ends meanwhile (time for a poll to show itself): not this wait's
        # news, so its watch is still the one held, unanswered.
        other = self.d.submit({"name": "other", "shell": "sleep 1"})["ids"][0]
        self.assertEqual(self.d.wait([other])[other]["state"], "succeeded")
        gpus = self.d.json("gpus")
        self.assertEqual((gpus["watches_held"], gpus["watch_answers"]), (1, answers))
        open(release, "w").close()
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, out + err)
        self.assertIn(f"{job}  waited  succeeded", out)

    def test_the_human_wait_takes_in_progress_as_it_lands(self):
        release = self.tmp_path("release")
        job = self.d.submit({"name": "steps", "shell": event_line(type="progress", epoch=1, epochs=2) +
                             f"; while [ ! -e {release} ]; do sleep 0.05; done"})["ids"][0]
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket)
        p = subprocess.Popen([os.path.join(BIN, "gpuq"), "wait", str(job)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")))
        reader.start()
        wait_until(lambda: any("epoch 1/2" in line for line in lines), what="the progress line")
        open(release, "w").close()
        self.assertEqual(p.wait(timeout=120), 0, p.stderr.read())
        reader.join(timeout=30)

    def test_logs_follow_prints_each_line_as_it_is_written_and_ends_with_the_job(self):
        gates = [self.tmp_path(f"gate{i}") for i in range(4)]
        shell = "; ".join(f"while [ ! -e {g} ]; do sleep 0.05; done; echo line-{i}" for i, g in enumerate(gates))
        job = self.d.submit({"name": "talker", "shell": shell})["ids"][0]
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket)
        p = subprocess.Popen([os.path.join(BIN, "gpuq"), "logs", "-f", str(job)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        wait_until(lambda: self.d.json("gpus")["watches_held"] == 1, what="the follower's watch")
        wait_until(lambda: self.d.show(job)["job"]["state"] == "running", what="the job to run")
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(line.strip() for line in iter(p.stdout.readline, "")))
        reader.start()
        try:
            answers = None
            for i, gate in enumerate(gates[:-1]):
                open(gate, "w").close()
                # The line comes because the kernel said the log grew: no look at the job in between
                # (the watch held since the job started is still the one held), and no timer.
                wait_until(lambda: f"line-{i}" in lines, timeout=60, what=f"line-{i} from logs -f")
                if answers is None:
                    answers = self.d.json("gpus")["watch_answers"]
            gpus = self.d.json("gpus")
            self.assertEqual((gpus["watches_held"], gpus["watch_answers"]), (1, answers))
            open(gates[-1], "w").close()
            self.assertEqual(p.wait(timeout=120), 0, p.stderr.read())
        finally:
            p.kill()
            reader.join(timeout=30)
        self.assertEqual(lines, ["line-0", "line-1", "line-2", "line-3"])

    def test_top_redraws_when_a_job_changes_not_only_at_its_refresh(self):
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        p = subprocess.Popen([os.path.join(BIN, "gpuq"), "--socket", self.d.socket, "top", "--interval", "600"],
                             stdin=follower, stdout=follower, stderr=follower)
        os.close(follower)
        out = []

        def read():
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                out.append(chunk.decode(errors="replace"))

        reader = threading.Thread(target=read)
        reader.start()
        try:
            wait_until(lambda: "no jobs" in "".join(out), what="top's first frame")
            wait_until(lambda: self.d.json("gpus")["watches_held"] == 1, what="top's watch")
            job, release = self.blocked("newcomer")
            # Its refresh is ten minutes away: the job shows because gpuqd told top of it.
            wait_until(lambda: "newcomer" in "".join(out), timeout=60, what="the new job on top's screen")
            open(release, "w").close()
        finally:
            os.write(leader, b"q")
            code = p.wait(timeout=60)
            reader.join(timeout=30)
            os.close(leader)
        self.assertEqual(code, 0)
