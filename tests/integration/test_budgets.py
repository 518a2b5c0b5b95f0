"""Budgets per user (docs/reliability.md, "Limits"): one user's clients cannot grow gpuqd without
bound or lock the others out."""
import json
import os
import socket

from harness import DaemonTest, wait_until
from loadgen import assert_rss_grew_less, rss_kib


def big_jobs(test):
    """12 ended jobs of the test's daemon whose progress and result are large (each under the 1 MiB
    a job's details may hold): a status of all of them is cut at the reply's 8 MiB bound."""
    fill = ("import json, os; f = open(os.environ['GPUQ_EVENTS'], 'a'); "
            "f.write(json.dumps({'type': 'progress', 'epoch': 1, 'note': 'p' * 450000}) + '\\n'); "
            "f.write(json.dumps({'type': 'result', 'note': 'r' * 450000}) + '\\n')")
    ids = test.d.submit([{"name": f"big{i}", "command": ["python3", "-c", fill]} for i in range(12)])["ids"]
    test.assertEqual({j["state"] for j in test.d.wait(ids).values()}, {"succeeded"})


class UnreadReplies(DaemonTest):
    def test_replies_nobody_reads_are_bounded_and_their_connections_let_go(self):
        big_jobs(self)
        self.d.json("status")
        before = rss_kib(self.d.proc.pid)
        # 30 clients ask for every job, 8 MiB of reply each, and never read.
        clients = []
        for _ in range(30):
            s = socket.socket(socket.AF_UNIX)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(self.d.socket)
            s.sendall(b'{"cmd": "status", "limit": 2000}\n')
            clients.append(s)
        # gpuqd holds at most 32 MiB of a user's unread replies: most of them are let go.
        wait_until(lambda: self.d.json("gpus")["connections_dropped"] >= 25, timeout=120,
                   what="connections holding unread replies to be dropped")
        gpus = self.d.json("gpus")
        self.assertLessEqual(gpus["replies_unread_bytes"], 32 << 20)
        # What it holds (large blocks are given back as they are freed: heap_trim.hpp): under 64
        # MiB more than before, where 30 x 8 MiB held would be 240.
        assert_rss_grew_less(self, self.d.proc.pid, before, 64 * 1024)
        # Others are still answered: a status in full, its pages read.
        status = self.d.json("status", "--all")
        self.assertEqual(len(status["jobs"]), 12)
        # A dropped connection ends (EOF, its reply cut short); one kept has its reply whole.
        ended = kept = 0
        for s in clients:
            s.settimeout(60)
            got = b""
            while not got.endswith(b"\n"):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                got += chunk
            if got.endswith(b"\n"):
                kept += 1
                self.assertTrue(json.loads(got)["more"])
            else:
                ended += 1
            s.close()
        self.assertEqual(ended + kept, 30)
        self.assertGreaterEqual(ended, 25)
        # A client that reads is never over: 6 replies of 8 MiB on one connection, each read.
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(60)
        s.connect(self.d.socket)
        buf = b""
        for _ in range(6):
            s.sendall(b'{"cmd": "status", "limit": 2000}\n')
            while b"\n" not in buf:
                chunk = s.recv(1 << 20)
                self.assertTrue(chunk, "gpuqd closed a connection that read every reply")
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            self.assertTrue(json.loads(line)["ok"])
        s.close()
        self.assertEqual(self.d.json("gpus")["replies_unread_bytes"], 0)


class DroppedWhileHeld(DaemonTest):
    def test_a_connection_dropped_with_lines_behind_its_held_wait_reads_none_of_them(self):
        big_jobs(self)
        held = self.d.submit({"name": "held", "command": ["true"]}, "--hold")["ids"][0]
        # A wait on it, 60,000 empty lines behind it, read in with it: the connection holds them,
        # the first of the user's connections to hold anything.
        a = socket.socket(socket.AF_UNIX)
        a.connect(self.d.socket)
        a.sendall(json.dumps({"cmd": "wait", "ids": [held]}).encode() + b"\n" * 60001)
        wait_until(lambda: self.d.json("gpus")["waits_held"] == 1, what="the wait to be held")
        # Replies the same user's other connections do not read take him past his 32 MiB: the
        # one holding bytes longest, the waiting one, is dropped (its wait still held).
        others = []
        for _ in range(6):
            s = socket.socket(socket.AF_UNIX)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(self.d.socket)
            s.sendall(b'{"cmd": "status", "limit": 2000}\n')
            others.append(s)
        a.settimeout(120)
        self.assertEqual(a.recv(1), b"", "the waiting connection was not the one dropped")
        # Its wait is answered, to no one, as the job ends. gpuqd used to read on from the closed
        # connection, each line's refusal reading the next, 60,000 calls deep.
        self.d.ok("release", str(held))
        self.assertEqual(self.d.wait([held])[held]["state"], "succeeded")
        self.assertIsNone(self.d.proc.poll())
        wait_until(lambda: self.d.json("gpus")["waits_held"] == 0, what="the dropped connection's wait to be answered")
        self.assertIsNone(self.d.proc.poll())
        for s in others + [a]:
            s.close()


class UnfinishedRequests(DaemonTest):
    def test_lines_not_yet_ended_count_with_unread_replies_against_the_same_bound(self):
        before = rss_kib(self.d.proc.pid)
        # 64 clients each send ~1 MB of a request line and never end it: 64 MB that gpuqd used to
        # hold (up to 1 MiB a connection, for as long as the idle limit), now at most 32 MiB.
        part = b'{"cmd": "status", "pad": "' + b"x" * 1000000
        clients = []
        for _ in range(64):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(60)
            s.connect(self.d.socket)
            try:
                s.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                pass  # dropped already, to make room
            clients.append(s)
        wait_until(lambda: self.d.json("gpus")["connections_dropped"] >= 24, timeout=120,
                   what="connections holding unfinished lines to be dropped")
        self.assertLessEqual(self.d.json("gpus")["replies_unread_bytes"], 32 << 20)
        assert_rss_grew_less(self, self.d.proc.pid, before, 64 * 1024)
        self.d.ok("status")  # others are served
        # A kept one is still served once it ends its line.
        kept = 0
        for s in clients:
            try:
                s.sendall(b'"}\n')
                reply = s.makefile("rb").readline()
            except (BrokenPipeError, ConnectionResetError):
                reply = b""
            if reply:
                kept += 1
                self.assertIn("ok", json.loads(reply))
            s.close()
        self.assertGreater(kept, 0)
        self.assertLessEqual(kept, 40)
        wait_until(lambda: self.d.json("gpus")["replies_unread_bytes"] == 0, what="what they held to be let go")
