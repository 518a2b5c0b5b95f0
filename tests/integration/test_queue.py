"""Scheduling through the real daemon: exclusivity, matrices, deep queues, dependencies, retries,
timeouts, results, waits and logs, big batches. (Placement: test_placement; changing jobs after
submission: test_control.)"""
import fcntl
import itertools
import json
import os
import pathlib
import pty
import struct
import subprocess
import threading
import termios
import time
import unittest

from harness import BIN, TIMED, DaemonTest, event_line, max_overlap, pids_matching, wait_until


def on_terminal(argv, rows=24, cols=100, timeout=60):
    """Runs argv on a pseudo-terminal of rows x cols; returns its exit code and everything it wrote."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout), out.decode(errors="replace")


class Exclusive(DaemonTest):
    def test_fifty_jobs_on_four_gpus_never_share_a_gpu(self):
        jobs = [{"name": f"j{i}", "gpus": 1, "shell": TIMED.format(sleep=0.2)} for i in range(50)]
        sub = self.d.submit(jobs)
        done = self.d.wait(sub["ids"], timeout=300)
        self.assertEqual(len(done), 50)
        self.assertTrue(all(j["state"] == "succeeded" for j in done.values()), done)
        results = self.d.json("results", "--batch", str(sub["batch"]))["jobs"]
        runs = [(r["result"]["gpu"], r["result"]["t0"], r["result"]["t1"]) for r in results]
        # Each job saw exactly one GPU, one of the four.
        self.assertTrue(all(gpu in {"0", "1", "2", "3"} for gpu, _, _ in runs), runs)
        # Never more than four at once, and never two at once on one GPU.
        self.assertLessEqual(max_overlap([(t0, t1) for _, t0, t1 in runs]), 4)
        for (g1, a0, a1), (g2, b0, b1) in itertools.combinations(runs, 2):
            if a0 < b1 and b0 < a1:
                self.assertNotEqual(g1, g2, f"two jobs overlapped on GPU {g1}")
        self.assertGreater(max_overlap([(t0, t1) for _, t0, t1 in runs]), 1, "jobs never ran in parallel")


class Matrix(DaemonTest):
    def test_a_matrix_submits_one_job_per_combination_and_after_waits_for_all_of_them(self):
        out = self.tmp_path("out")
        os.makedirs(out)
        spec = [
            {"name": "train", "matrix": {"lr": [0.1, 0.3], "seed": [1, 2]},
             "env": {"SEED": "{seed}"},
             "shell": f'echo "{{lr}} $SEED" > {out}/$GPUQ_JOB_NAME; ' + event_line(type="result", lr="{lr}")},
            {"name": "report", "after": ["train"], "shell": f"cat {out}/train-* > {out}/report"},
        ]
        dry = self.d.ok("submit", "--dry-run", "-", input=json.dumps(spec))
        self.assertIn("5 jobs; dry run, nothing submitted", dry)
        self.assertIn("train-0.3-2", dry)
        self.assertEqual(self.d.json("status")["jobs"], [])  # nothing was submitted
        sub = self.d.submit(spec)
        self.assertEqual(len(sub["ids"]), 5)
        done = self.d.wait(sub["ids"])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        jobs = self.d.json("results", "--batch", str(sub["batch"]))["jobs"]
        by_name = {j["name"]: j for j in jobs}
        self.assertEqual(sorted(by_name), ["report", "train-0.1-1", "train-0.1-2", "train-0.3-1", "train-0.3-2"])
        self.assertEqual(by_name["train-0.3-1"]["labels"], {"lr": 0.3, "seed": 1})  # as typed in the matrix
        self.assertEqual(pathlib.Path(out, "train-0.3-1").read_text(), "0.3 1\n")
        # The report ran after all four: it saw every file.
        self.assertEqual(sorted(pathlib.Path(out, "report").read_text().splitlines()),
                         ["0.1 1", "0.1 2", "0.3 1", "0.3 2"])
        self.assertEqual(sorted(self.d.show(by_name["report"]["id"])["job"]["after"]),
                         sorted(by_name[n]["id"] for n in by_name if n.startswith("train-")))

    def test_a_matrix_mistake_is_refused_with_the_key_named(self):
        r = self.d.run("submit", "-", input=json.dumps({"name": "s", "matrix": {"lr": [0.1], "sed": [1]},
                                                       "shell": "run {lr} {seed}"}))
        self.assertEqual(r.returncode, 4)
        self.assertIn("job[0] (s): field `matrix.sed` is used nowhere", r.stderr)


class DeepQueue(DaemonTest):
    def on_fake_gpus(self, n):
        """Restarts gpuqd on n fake GPUs; returns a file to create and a shell line that waits for it."""
        go = self.tmp_path("go")
        self.d.stop()
        self.d.gpus = f"fake:{n}"
        self.d.start()
        return go, f"while [ ! -e {go} ]; do sleep 0.05; done"

    def test_a_deep_queue_behind_busy_gpus_still_starts_a_cpu_job_at_its_end_and_says_why_each_waits(self):
        go, hold = self.on_fake_gpus(2)
        batch = ([{"name": f"busy{i}", "gpus": 1, "shell": hold} for i in range(2)] +
                 [{"name": f"gpu{i}", "gpus": 1, "command": ["true"]} for i in range(300)] +
                 [{"name": "cpu", "command": ["true"]}])
        ids = self.d.submit(batch)["ids"]
        # The CPU job is last in line, but a CPU slot is free: the pass must reach it.
        self.assertEqual(self.d.wait([ids[-1]])[ids[-1]]["state"], "succeeded")
        reason = lambda i: self.d.show(ids[i])["job"]["reason"]
        # The first two waiting jobs reserve a GPU each; the pass stops there, and the jobs behind
        # it wait for the same thing examining them would have said.
        self.assertEqual([reason(2), reason(3)], ["waiting for 1 free GPU (reserved)"] * 2)
        for i in (4, 150, 301):
            self.assertEqual(reason(i), "waiting for GPUs held by higher-priority jobs")
        # Jobs submitted now are behind where every pass stops: never examined, they still say why.
        more = self.d.submit([{"name": f"late{i}", "gpus": 1, "command": ["true"]} for i in range(50)])["ids"]
        self.assertEqual(self.d.show(more[-1])["job"]["reason"], "waiting for GPUs held by higher-priority jobs")
        self.assertIn("waiting for GPUs held by higher-priority jobs", self.d.ok("show", str(more[0])))
        ids += more
        open(go, "w").close()
        done = self.d.wait(ids, timeout=300)
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        self.assertEqual(len(done), len(batch) + 50)

    def test_status_shows_the_first_queued_jobs_in_line_and_counts_the_rest(self):
        go, hold = self.on_fake_gpus(1)
        ids = self.d.submit([{"name": "busy", "gpus": 1, "shell": hold}] +
                            [{"name": f"q{i}", "gpus": 1, "command": ["true"]} for i in range(30)])["ids"]
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        wait_until(lambda: self.d.show(ids[0])["job"]["state"] == "running", what="the busy job running")
        table = self.d.ok("status", "-q", "3")
        names = [line.split()[1] for line in table.splitlines()[1:] if line and not line.startswith("(")]
        self.assertEqual(names, ["busy", "q0", "q1", "urgent"])  # in id order; urgent is first in line
        self.assertIn("(3 of 31 queued jobs shown, the first in line; --queued N for more)", table)
        everything = self.d.json("status")  # --json: the first 200 queued jobs unless asked otherwise
        self.assertEqual((len(everything["jobs"]), everything["queued_total"]), (32, 31))
        few = self.d.json("status", "--queued", "0")
        self.assertEqual([j["name"] for j in few["jobs"]], ["busy"])
        self.assertEqual(few["queued_total"], 31)
        # A deep queue: --json's first page is 200 of it, in line; -q asks for more.
        self.d.submit({"name": "deep-{i}", "command": ["true"], "matrix": {"i": list(range(250))}}, "--hold")
        first = self.d.json("status", "-n", "0")
        queued = [j for j in first["jobs"] if j["state"] == "queued"]
        self.assertEqual((len(queued), first["queued_total"]), (200, 281))
        self.assertEqual(queued[0]["name"], "q0")
        self.assertEqual(len(self.d.json("status", "-n", "0", "-q", "281")["jobs"]), 282)
        bad = self.d.request({"cmd": "status", "queued": -5})
        self.assertFalse(bad["ok"])
        self.assertIn("queued", bad["error"]["message"])
        open(go, "w").close()
        self.d.wait(ids + [urgent])


# Reports the rank's CPU affinity and thread settings as a result event, then waits for `go`.


class Dependencies(DaemonTest):
    def test_after_runs_in_order_and_a_failed_dependency_fails_its_dependents(self):
        order = self.tmp_path("order")
        jobs = [
            {"name": "prep", "shell": f"sleep 0.3; echo prep >> {order}"},
            {"name": "train", "after": ["prep"], "shell": f"echo train >> {order}"},
            {"name": "broken", "command": ["false"]},
            {"name": "report", "after": ["broken", "train"], "command": ["true"]},
            {"name": "later", "after": ["report"], "command": ["true"]},
        ]
        sub = self.d.submit(jobs)
        done = self.d.wait(sub["ids"])
        by_name = {j["name"]: j for j in done.values()}
        self.assertEqual(open(order).read().split(), ["prep", "train"])
        self.assertEqual(by_name["train"]["state"], "succeeded")
        self.assertEqual(by_name["report"]["state"], "failed")
        self.assertIn(f"dependency {sub['ids'][2]} ended failed", by_name["report"]["reason"])
        self.assertEqual(by_name["later"]["state"], "failed")
        self.assertIn("dependency", by_name["later"]["reason"])

    def test_a_chain_failing_at_its_head_fails_to_its_end_over_several_passes_each_naming_the_job_before(self):
        # 1,200 jobs: more than one pass fails (512 a pass), so the rest must be picked up after.
        chain = [{"name": "c0", "command": ["false"]}] + \
                [{"name": f"c{i}", "command": ["true"], "after": [f"c{i - 1}"]} for i in range(1, 1200)]
        ids = self.d.submit(chain)["ids"]
        done = self.d.wait(ids, timeout=120)
        self.assertEqual({j["state"] for j in done.values()}, {"failed"})
        for before, job in zip(ids, ids[1:]):
            self.assertEqual(done[job]["reason"], f"dependency {before} ended failed")
            self.assertEqual(done[job]["attempt"], 0)  # never started

    def test_after_an_existing_job_by_id(self):
        first = self.d.submit({"name": "first", "shell": "sleep 0.5"})["ids"][0]
        second = self.d.submit({"name": "second", "after": [first], "command": ["true"]})["ids"][0]
        done = self.d.wait([second])
        self.assertEqual(done[second]["state"], "succeeded")
        self.assertGreaterEqual(done[second]["started_at"], self.d.show(first)["job"]["ended_at"])


class RetriesAndTimeouts(DaemonTest):
    def test_a_failing_job_is_retried_with_its_attempt_number_then_succeeds(self):
        sub = self.d.submit({"name": "flaky", "retries": 2,
                             "shell": 'echo "attempt $GPUQ_ATTEMPT"; [ "$GPUQ_ATTEMPT" -ge 2 ]'})
        job = self.d.wait(sub["ids"])[sub["ids"][0]]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["attempt"], 2)
        show = self.d.show(job["id"])
        states = [(h["attempt"], h["state"]) for h in show["history"]]
        self.assertEqual(states, [(0, "queued"), (1, "running"), (1, "failed"), (1, "queued"), (2, "running"),
                                  (2, "succeeded")])
        self.assertEqual(len(show["logs"]), 2)

    def test_a_failed_jobs_reason_ends_with_what_its_failing_rank_said_last(self):
        # The last line with something in it, as a terminal shows it (after a carriage return,
        # without colour codes), from stderr or stdout alike; a rank that said nothing adds nothing.
        shell = (r"echo 'epoch 1'; printf 'step 10\rstep 20\r\033[31mValueError: no such column: label\033[0m\n\n\n' >&2; "
                 "exit 2")
        ids = self.d.submit([{"name": "said", "shell": shell}, {"name": "quiet", "shell": "exit 3"},
                             {"name": "long", "shell": "printf 'é%.0s' $(seq 1 600); exit 4"}])["ids"]
        jobs = self.d.wait(ids)
        self.assertEqual(jobs[ids[0]]["reason"], "rank 0 exited with code 2: ValueError: no such column: label")
        self.assertEqual(jobs[ids[1]]["reason"], "rank 0 exited with code 3")
        long_reason = jobs[ids[2]]["reason"]
        self.assertTrue(long_reason.startswith("rank 0 exited with code 4: éé"), long_reason)
        self.assertTrue(long_reason.endswith("é..."), long_reason)  # cut between characters, said so
        self.assertLess(len(long_reason.encode()), 500)

    def test_retries_run_out_and_the_reason_names_the_exit_code(self):
        sub = self.d.submit({"name": "bad", "retries": 1, "shell": "exit 3"})
        job = self.d.wait(sub["ids"])[sub["ids"][0]]
        self.assertEqual(job["state"], "failed")
        self.assertEqual(job["attempt"], 2)
        self.assertEqual(job["exit_code"], 3)
        self.assertEqual(job["reason"], "rank 0 exited with code 3")
        self.assertIn("failed (3)", self.d.ok("show", str(job["id"])))

    def test_a_signal_death_is_recorded_as_the_signal(self):
        sub = self.d.submit({"name": "killed", "shell": "kill -9 $$"})
        job = self.d.wait(sub["ids"])[sub["ids"][0]]
        self.assertEqual(job["state"], "failed")
        self.assertEqual(job["exit_signal"], 9)
        self.assertIn("signal 9 (SIGKILL)", job["reason"])

    def test_timeout_kills_the_job_and_marks_it_timed_out(self):
        # A sleep of its own: other tests' jobs (and other modules', run alongside) sleep 9187.
        sub = self.d.submit({"name": "slow", "timeout_s": 0.5, "shell": "sleep 9461"})
        job = self.d.wait(sub["ids"])[sub["ids"][0]]
        self.assertEqual(job["state"], "timed_out")
        self.assertLess(job["ended_at"] - job["started_at"], 5)
        self.assertEqual(pids_matching("^sleep 9461$"), [])


class ResultsWaitLogs(DaemonTest):
    def test_results_of_a_batch_are_collected_in_one_json_document(self):
        jobs = [{"name": f"ds{i}", "labels": {"dataset": f"d{i}"},
                 "shell": event_line(type="progress", step=1, loss=1.5) + "; " +
                 event_line(type="result", test_accuracy=0.5 + i / 10, epochs=i)} for i in range(3)]
        sub = self.d.submit(jobs)
        self.d.wait(sub["ids"])
        res = self.d.json("results", "--batch", str(sub["batch"]))["jobs"]
        self.assertEqual([r["name"] for r in res], ["ds0", "ds1", "ds2"])
        self.assertEqual([r["result"]["test_accuracy"] for r in res], [0.5, 0.6, 0.7])
        self.assertEqual(res[2]["labels"], {"dataset": "d2"})
        table = self.d.ok("results", "--batch", str(sub["batch"]))
        self.assertIn("test_accuracy", table.splitlines()[0])
        self.assertEqual(self.d.json("result", str(sub["ids"][1]))["result"], {"test_accuracy": 0.6, "epochs": 1})

    def test_bad_event_lines_are_counted_not_fatal_and_the_first_is_shown(self):
        sub = self.d.submit({"name": "noisy", "shell": "echo garbage >> $GPUQ_EVENTS; echo '{\"x\":1}' >> $GPUQ_EVENTS; " +
                             event_line(type="result", ok=1)})
        job_id = sub["ids"][0]
        job = self.d.wait(sub["ids"])[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["bad_event_lines"], 2)
        self.assertEqual(job["result"], {"ok": 1})
        self.assertRegex(job["first_bad_event"], r'^rank 0: event line is not valid JSON .*: "garbage"$')
        # Said where its owner looks: show, status, and what wait prints when the jobs end.
        said = f'job {job_id}: 2 event lines not taken; the first, rank 0: event line is not valid JSON'
        self.assertIn(said, self.d.ok("status"))
        self.assertIn(said, self.d.ok("wait", str(job_id)))
        shown = self.d.ok("show", str(job_id))
        self.assertIn("event lines not taken: 2", shown)
        self.assertIn('the first: rank 0: event line is not valid JSON', shown)
        # (The first was kept, not the last.) A line without a type is named so.
        other = self.d.submit({"name": "typeless", "shell": "echo '{\"x\":1}' >> $GPUQ_EVENTS"})["ids"][0]
        self.assertEqual(self.d.wait([other])[other]["first_bad_event"], 'rank 0: no "type" string: "{\\"x\\":1}"')

    def test_a_flooded_events_file_is_read_at_most_8_mib_at_a_time_while_the_job_runs(self):
        # 30 MB of bad lines (each under the 1 MiB line limit) and one progress event appear at
        # once (a rename), so one unbounded read would take them all; then the job waits.
        release = os.path.join(self.tmp, "release")
        flood = ("python3 -c 'import sys; [sys.stdout.write(\"x\" * 999999 + \"\\n\") for _ in range(30)]' "
                 "> \"$GPUQ_EVENTS.new\"; " + event_line(type="progress", step=1).replace("$GPUQ_EVENTS", "$GPUQ_EVENTS.new") +
                 f"; mv \"$GPUQ_EVENTS.new\" \"$GPUQ_EVENTS\"; while [ ! -e {release} ]; do sleep 0.05; done")
        job_id = self.d.submit({"name": "flood", "shell": flood})["ids"][0]
        wait_until(lambda: (self.d.show(job_id)["job"]["progress"] or {}).get("step") == 1, timeout=120,
                   what="the event after the flood")
        gpus = self.d.json("gpus")
        self.assertEqual(self.d.show(job_id)["job"]["bad_event_lines"], 30)
        self.assertGreaterEqual(gpus["events_reads"], 4)  # 30 MB at 8 MiB a read
        self.assertGreater(gpus["events_read_max_bytes"], 0)
        self.assertLessEqual(gpus["events_read_max_bytes"], 8 << 20)
        open(release, "w").close()
        self.assertEqual(self.d.wait([job_id])[job_id]["state"], "succeeded")

    def test_a_job_that_ends_with_more_than_a_read_of_events_unread_loses_none_of_them(self):
        # Its first event is read while it runs; then 10 MB of (bad) lines and its result appear at
        # once, and it ends: all of it is read at the end, re-reads of lines cut by a chunk's end
        # included (once counted against the file's size, they cut the last chunk short and the
        # result, the last line, was never read).
        release = os.path.join(self.tmp, "release")
        script = (event_line(type="progress", step=0) + f"; while [ ! -e {release} ]; do sleep 0.05; done; "
                  "cp \"$GPUQ_EVENTS\" \"$GPUQ_EVENTS.new\"; "
                  "python3 -c 'import sys; [sys.stdout.write(\"x\" * 999 + \"\\n\") for _ in range(10000)]' "
                  ">> \"$GPUQ_EVENTS.new\"; " + event_line(type="result", ok=1).replace("$GPUQ_EVENTS", "$GPUQ_EVENTS.new") +
                  "; mv \"$GPUQ_EVENTS.new\" \"$GPUQ_EVENTS\"")
        job_id = self.d.submit({"name": "burst", "shell": script})["ids"][0]
        wait_until(lambda: (self.d.show(job_id)["job"]["progress"] or {}).get("step") == 0, what="the first event")
        open(release, "w").close()
        done = self.d.wait([job_id])[job_id]
        self.assertEqual(done["state"], "succeeded", done["reason"])
        self.assertEqual(done["result"], {"ok": 1})
        self.assertEqual(done["bad_event_lines"], 10000)

    def test_progress_is_visible_while_the_job_runs(self):
        sub = self.d.submit({"name": "live", "shell": event_line(type="progress", epoch=1, step=7) + "; sleep 30"})
        job_id = sub["ids"][0]
        wait_until(lambda: (self.d.show(job_id)["job"]["progress"] or {}).get("step") == 7, what="live progress")
        self.assertIn("step=7", self.d.ok("status"))
        self.d.ok("cancel", str(job_id))

    def test_wait_exit_codes_reflect_the_outcome(self):
        ok = self.d.submit({"name": "ok", "command": ["true"]})["ids"][0]
        bad = self.d.submit({"name": "bad", "command": ["false"]})["ids"][0]
        slow = self.d.submit({"name": "slow", "shell": "sleep 30"})["ids"][0]
        self.assertEqual(self.d.run("wait", str(ok)).returncode, 0)
        self.assertEqual(self.d.run("wait", str(ok), str(bad)).returncode, 1)
        self.assertEqual(self.d.run("wait", str(slow), "--timeout", "0.3").returncode, 124)
        self.d.ok("cancel", str(slow))

    def test_wait_on_a_terminal_redraws_a_progress_bar_per_job(self):
        steps = "; ".join(event_line(type="progress", epoch=e, epochs=4, loss=1.0 / e) + "; sleep 0.6"
                          for e in range(1, 5))
        job_id = self.d.submit({"name": "bar", "shell": steps + "; " + event_line(type="result", accuracy=0.9)})["ids"][0]
        code, text = on_terminal([os.path.join(BIN, "gpuq"), "--socket", self.d.socket, "wait", str(job_id)])
        self.assertEqual(code, 0)
        self.assertIn("\x1b[2K", text)  # lines are cleared and redrawn in place
        self.assertIn("\x1b[1F", text)
        self.assertRegex(text, r"\[#{5,15}-{5,15}\] \d+%  epoch [23]/4")
        self.assertIn("bar  succeeded  accuracy=0.9", text)

    def test_wait_on_a_small_terminal_summarises_a_batch_that_does_not_fit(self):
        sub = self.d.submit([{"name": f"many{i}", "shell": "sleep 0.3"} for i in range(20)] +
                            [{"name": "broken", "command": ["false"]}])
        code, text = on_terminal([os.path.join(BIN, "gpuq"), "--socket", self.d.socket, "wait", "--batch",
                                  str(sub["batch"])], rows=10)
        self.assertEqual(code, 1)  # one job failed
        # 21 jobs do not fit in 8 lines: one summary line, then what runs and what failed.
        self.assertRegex(text, r"21 jobs  \[[#-]{20}\] \d+%")
        self.assertRegex(text, r"21 jobs  \[#{20}\] 100%  20 succeeded  1 failed")
        self.assertRegex(text, r"\d+  many\d+  running")
        self.assertRegex(text, r"\d+  broken  failed")
        self.assertNotRegex(text, r"many\d+  queued")  # queued jobs get no line of their own

    def test_wait_without_a_terminal_prints_plain_progress_lines(self):
        job_id = self.d.submit({"name": "plain", "shell": event_line(type="progress", epoch=1, epochs=2) +
                                "; sleep 0.8; " + event_line(type="result", ok=1)})["ids"][0]
        out = self.d.ok("wait", str(job_id))
        self.assertNotIn("\x1b", out)
        self.assertIn(f"{job_id}  plain  [##########----------] 50%  epoch 1/2", out)
        self.assertIn(f"{job_id}  plain  succeeded  ok=1", out)

    def test_submit_wait_returns_the_jobs_outcome(self):
        r = self.d.run("submit", "--wait", "-", input=json.dumps({"name": "w", "command": ["false"]}))
        self.assertEqual(r.returncode, 1)
        self.assertIn("failed", r.stdout)

    def test_logs_follow_prints_everything_until_the_job_ends(self):
        sub = self.d.submit({"name": "talker", "retries": 1,
                             "shell": 'for i in 1 2 3; do echo "line $i of $GPUQ_ATTEMPT"; sleep 0.2; done; '
                                      '[ "$GPUQ_ATTEMPT" = 2 ]'})
        out = self.d.ok("logs", "-f", str(sub["ids"][0]), timeout=60)
        self.assertEqual(out.split("\n")[:6], [f"line {i} of {a}" for a in (1, 2) for i in (1, 2, 3)])
        last = self.d.ok("logs", str(sub["ids"][0]))
        self.assertEqual(last.split(), "line 1 of 2 line 2 of 2 line 3 of 2".split())

    def test_logs_tail_prints_the_last_lines_then_follows(self):
        # 100,000 lines before the ones that matter: a tail reads only the end of the file.
        job_id = self.d.submit({"name": "long", "retries": 1, "shell":
                                'seq 1 100000; [ "$GPUQ_ATTEMPT" = 2 ] || exit 1; seq 100001 100003; '
                                f'while [ ! -e {self.tmp}/more ]; do sleep 0.05; done; echo last; printf partial'})["ids"][0]
        wait_until(lambda: self.d.show(job_id)["job"]["attempt"] == 2 and
                   self.d.ok("logs", str(job_id), "-n", "1").strip() == "100003", what="attempt 2 to print")
        self.assertEqual(self.d.ok("logs", str(job_id), "--tail", "2").split(), ["100002", "100003"])
        self.assertEqual(self.d.ok("logs", str(job_id), "--attempt", "1", "-n", "3").split(),
                         ["99998", "99999", "100000"])
        self.assertEqual(self.d.ok("logs", str(job_id), "-n", "0"), "")
        follower = subprocess.Popen([os.path.join(BIN, "gpuq"), "--socket", self.d.socket, "logs", "-f", "-n", "1",
                                     str(job_id)], stdout=subprocess.PIPE, text=True)
        watchdog = threading.Timer(60, follower.kill)  # a follower that prints nothing fails, not hangs
        watchdog.start()
        self.addCleanup(watchdog.cancel)
        first = follower.stdout.readline()  # attached: it printed the tail, and follows from there
        open(f"{self.tmp}/more", "w").close()
        out, _ = follower.communicate(timeout=30)
        # Attempt 1 is skipped; the partial last line is printed once the job has ended.
        self.assertEqual((first + out).split(), ["100003", "last", "partial"])

    def test_status_shows_active_and_recent_jobs_and_all_on_request(self):
        ids = self.d.submit([{"name": f"n{i}", "command": ["true"]} for i in range(30)])["ids"]
        self.d.wait(ids)
        recent = self.d.json("status")
        self.assertEqual(recent["total"], 30)
        self.assertEqual(len(recent["jobs"]), 20)
        self.assertEqual(len(self.d.json("status", "--all")["jobs"]), 30)
        self.assertIn("20 of 30 jobs shown", self.d.ok("status"))

    def test_status_lists_only_the_jobs_of_a_batch_in_given_states_with_matching_names(self):
        sweep = self.d.submit([{"name": "lr-0.1", "command": ["true"]}, {"name": "lr-0.01", "command": ["false"]},
                               {"name": "eval", "command": ["true"]}])
        self.d.wait(sweep["ids"])
        lr1, lr01, ev = sweep["ids"]
        busy = self.d.submit({"name": "lr-1", "shell": "sleep 9187"})["ids"][0]
        held = self.d.submit({"name": "lr-held", "command": ["true"]}, "--hold")["ids"][0]
        wait_until(lambda: self.d.show(busy)["job"]["state"] == "running", what="lr-1 to start")
        ids = lambda *args: [j["id"] for j in self.d.json("status", *args)["jobs"]]
        self.assertEqual(ids("--state", "failed"), [lr01])
        self.assertEqual(ids("--name", "lr-*"), [lr1, lr01, busy, held])
        self.assertEqual(ids("-b", str(sweep["batch"]), "-s", "succeeded,failed", "--name", "lr*"), [lr1, lr01])
        self.assertEqual(ids("-s", "succeeded", "-s", "running"), [lr1, ev, busy])
        queued = self.d.json("status", "--state", "queued")
        self.assertEqual(([j["id"] for j in queued["jobs"]], queued["queued_total"], queued["total"]), ([held], 1, 1))
        self.assertEqual(self.d.json("status", "--name", "lr-0.?")["total"], 1)  # lr-0.1, not lr-0.01
        self.assertEqual(ids("--all", "--state", "running"), [busy])
        self.assertEqual(ids("--all", "--name", "[e]*"), [ev])
        self.assertEqual(self.d.ok("status", "--name", "nothing*").strip(), "no jobs match")
        r = self.d.run("status", "--state", "done")
        self.assertEqual(r.returncode, 2)
        self.assertIn("done", r.stderr)
        reply = self.d.request({"cmd": "status", "states": ["done"]})
        self.assertEqual(reply["error"]["message"], "field `states` must be an array of job states: queued, running, "
                                                    "succeeded, failed, cancelled, timed_out, out_of_memory")
        self.d.ok("cancel", str(busy), str(held))
        self.d.wait([busy, held])


class BigBatches(DaemonTest):
    def test_commands_on_many_jobs_print_counts_instead_of_a_line_each(self):
        failed = self.d.submit([{"name": f"f{i}", "command": ["false"]} for i in range(25)])
        self.d.wait(failed["ids"])
        self.assertEqual(self.d.ok("restart", "--batch", str(failed["batch"]), "--fresh").strip(),
                         "25 jobs queued again (25 had ended failed), checkpoints removed")
        held = self.d.submit([{"name": f"h{i}", "command": ["true"]} for i in range(25)], "--hold")
        batch = str(held["batch"])
        self.assertEqual(self.d.ok("update", "--batch", batch, "--priority", "3").strip(), "25 jobs updated, 0 unchanged")
        self.assertEqual(self.d.ok("hold", "--batch", batch).strip(), "0 jobs held, 25 left as they were")
        self.assertEqual(self.d.ok("release", "--batch", batch).strip(), "25 jobs released, 0 left as they were")
        done = self.d.wait(failed["ids"] + held["ids"])
        self.assertEqual(sum(j["state"] == "succeeded" for j in done.values()), 25)


if __name__ == "__main__":
    unittest.main()
