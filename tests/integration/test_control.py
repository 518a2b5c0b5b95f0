"""Changing jobs after submission, through the real daemon and CLI: restart, hold and release,
clean (and --forget), update, and a batch's limit on running jobs."""
import json
import os
import pathlib
import subprocess
import time
import unittest

from harness import BIN, Daemon, DaemonTest, alive, event_line, wait_until


class Restart(DaemonTest):
    def test_a_failed_job_restarts_under_its_id_with_fresh_retries_and_brings_back_what_failed_waiting_for_it(self):
        jobs = [
            # Fails runs 1 and 2 (its retry); after the restart fails run 3 and succeeds on run 4,
            # which only a retry budget counted from the restart allows. Runs, not attempt numbers:
            # a launch withdrawn by the kill below takes a number and runs nothing.
            {"name": "prep", "retries": 1,
             "shell": f'n=$(($(cat {self.tmp}/prep-runs 2>/dev/null || echo 0) + 1)); echo $n > {self.tmp}/prep-runs; '
                      f'echo "prep $GPUQ_ATTEMPT"; [ $n -ge 4 ]'},
            {"name": "train", "after": ["prep"], "command": ["true"]},
            {"name": "eval", "after": ["train"], "command": ["true"]},
            {"name": "aside", "command": ["true"]},
        ]
        prep, train, evaluate, aside = self.d.submit(jobs)["ids"]
        first = self.d.wait([prep, train, evaluate, aside])
        self.assertEqual([first[i]["state"] for i in (prep, train, evaluate, aside)],
                         ["failed", "failed", "failed", "succeeded"])
        self.assertEqual(first[prep]["attempt"], 2)

        out = self.d.json("restart", str(prep))["jobs"]
        self.assertEqual(out, [{"id": prep, "was": "failed", "with": 0}, {"id": train, "was": "failed", "with": prep},
                               {"id": evaluate, "was": "failed", "with": train}])
        # Durable as soon as it is acknowledged: a daemon killed now finds them queued (or running).
        self.d.kill9()
        self.d.start()
        done = self.d.wait([prep, train, evaluate, aside])
        self.assertEqual([done[i]["state"] for i in (prep, train, evaluate, aside)], ["succeeded"] * 4)
        show = self.d.show(prep)
        # The kill may land between marking attempt 3 running and its start; the new gpuqd then
        # withdraws that launch (a running/queued pair that the rest does not depend on) and runs
        # the job as the next attempt: the numbers from there on are one up, the tries the same.
        history = show["history"]
        withdrawn = [history[i - 1]["attempt"] for i in range(1, len(history))
                     if history[i]["reason"] == "requeued: gpuqd stopped before the job started"]
        for i in reversed(range(1, len(history))):
            if history[i]["reason"] == "requeued: gpuqd stopped before the job started":
                del history[i - 1:i + 1]
        self.assertLessEqual(len(withdrawn), 1)
        number = [0] + [n for n in range(1, 7) if n not in withdrawn][:4]  # the k-th run's attempt number
        self.assertEqual((done[prep]["attempt"], done[prep]["attempt_base"], done[prep]["restarts"]),
                         (number[4], 2 + len(withdrawn), 1))
        self.assertEqual((done[train]["attempt"], done[train]["restarts"]), (1, 1))
        self.assertEqual(done[aside]["restarts"], 0)
        self.assertGreaterEqual(done[train]["started_at"], done[prep]["ended_at"])

        states = [(h["attempt"], h["state"]) for h in history]
        self.assertEqual(states, [(0, "queued"), (number[1], "running"), (number[1], "failed"), (number[1], "queued"),
                                  (number[2], "running"), (number[2], "failed"), (number[2], "queued"),
                                  (number[3], "running"), (number[3], "failed"), (number[3], "queued"),
                                  (number[4], "running"), (number[4], "succeeded")])
        self.assertEqual(history[6]["reason"], "restarted (it had ended failed)")
        self.assertEqual(self.d.show(train)["history"][-3]["reason"], f"restarted with job {prep}")
        self.assertLessEqual(set(number[1:]), {log["attempt"] for log in show["logs"]})  # every attempt's log kept
        self.assertEqual(self.d.ok("logs", str(prep), "--attempt", "1").split(), ["prep", "1"])
        text = self.d.ok("show", str(prep))
        self.assertIn(f"attempt:   2 of 2 since restart 1 (attempt {number[4]} in all)", text)

    def test_a_requeued_job_checkpoints_on_sigterm_and_resumes_as_its_next_attempt_no_retry_spent(self):
        started = self.tmp_path("started")
        script = ('ck="$GPUQ_CHECKPOINT_DIR/step"; '
                  'if [ -f "$ck" ]; then echo "resumed from step $(cat "$ck") as attempt $GPUQ_ATTEMPT"; exit 0; fi; '
                  'trap \'echo 41 > "$ck"; echo saved; exit 143\' TERM; '
                  f'touch {started}; while true; do sleep 0.05; done')
        job = self.d.submit({"name": "long", "shell": script, "gpus": 1, "timeout_s": 120})["ids"][0]  # retries: 0
        wait_until(lambda: os.path.exists(started), what="the job to start")
        out = self.d.ok("requeue", str(job))
        self.assertIn(f"job {job}: stopping", out)
        done = self.d.wait([job])[job]
        self.assertEqual(done["state"], "succeeded", done["reason"])
        self.assertEqual((done["attempt"], done["attempt_base"], done["retries"]), (2, 1, 0))
        self.assertEqual(self.d.ok("logs", str(job)).strip(), "resumed from step 41 as attempt 2")
        self.assertEqual(self.d.ok("logs", str(job), "--attempt", "1").split()[-1], "saved")
        history = [(h["attempt"], h["state"], h["reason"]) for h in self.d.show(job)["history"]]
        self.assertIn((1, "queued", "requeued (gpuq requeue): attempt 1 was stopped"), history)
        self.assertEqual([s for _, s, _ in history], ["queued", "running", "queued", "running", "succeeded"])
        self.assertIn("attempt:   1 of 1 (attempt 2 in all; requeued 1 time)", self.d.ok("show", str(job)))

    def test_a_requeue_that_cannot_be_done_changes_nothing_and_says_why(self):
        gate = self.tmp_path("gate")
        running = self.d.submit({"name": "runs", "shell": f"while [ ! -e {gate} ]; do sleep 0.05; done",
                                 "timeout_s": 120})["ids"][0]
        queued = self.d.submit({"name": "waits", "command": ["true"], "after": [running]})["ids"][0]
        wait_until(lambda: self.d.show(running)["job"]["state"] == "running", what="the first job to run")
        for ids, said in (([running, queued], f"job {queued} (waits) is queued; only a running job can be requeued "
                                              "(it is in line already)"),
                          ([running, 999], "no job 999")):
            r = self.d.run("requeue", *map(str, ids))
            self.assertEqual(r.returncode, 4, r.stderr)
            self.assertIn(said, r.stderr)
        self.assertFalse(self.d.show(running)["job"]["attempt_base"])  # nothing was asked of it
        open(gate, "w").close()
        done = self.d.wait([running, queued])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        self.assertEqual(done[running]["attempt"], 1)
        r = self.d.run("requeue", str(running))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"job {running} (runs) is succeeded; only a running job can be requeued (`gpuq restart` queues "
                      "an ended one)", r.stderr)

    def test_a_requeue_asked_before_gpuqd_dies_is_carried_out_by_the_next(self):
        # The job takes its time to stop (it traps SIGTERM and waits for the gate); gpuqd is killed
        # meanwhile. The intent was stored: the next gpuqd requeues it when it ends.
        gate, started, stopping = self.tmp_path("gate"), self.tmp_path("started"), self.tmp_path("stopping")
        script = ('if [ "$GPUQ_ATTEMPT" = 2 ]; then exit 0; fi; '
                  f"trap 'touch {stopping}; while [ ! -e {gate} ]; do sleep 0.05; done; exit 143' TERM; "
                  f"touch {started}; while true; do sleep 0.05; done")
        job = self.d.submit({"name": "slow-stop", "shell": script, "timeout_s": 120})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the job to start")  # its trap set
        self.d.ok("requeue", str(job))
        wait_until(lambda: os.path.exists(stopping), what="the job to get its SIGTERM")
        self.d.kill9()
        open(gate, "w").close()
        self.d.start()
        done = self.d.wait([job])[job]
        self.assertEqual((done["state"], done["attempt"], done["attempt_base"]), ("succeeded", 2, 1), done["reason"])

    def test_a_restart_that_cannot_be_done_changes_nothing_and_says_why(self):
        broken, waiting = self.d.submit([{"name": "broken", "command": ["false"]},
                                         {"name": "waiting", "after": ["broken"], "command": ["true"]}])["ids"]
        self.d.wait([broken, waiting])
        r = self.d.run("restart", str(waiting))
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"job {waiting} (waiting) waits for job {broken}, which ended failed: restart that job too",
                      r.stderr)
        running = self.d.submit({"name": "busy", "shell": "sleep 9187"})["ids"][0]
        wait_until(lambda: self.d.show(running)["job"]["state"] == "running", what="busy to start")
        r = self.d.run("restart", str(broken), str(running))
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"job {running} (busy) is running; only a job that has ended can be restarted", r.stderr)
        self.assertIn("wrong_state", self.d.request({"cmd": "restart", "ids": [running]})["error"]["code"])
        r = self.d.run("restart", "999")
        self.assertEqual((r.returncode, "no job 999" in r.stderr), (4, True))
        self.assertEqual(self.d.run("restart").returncode, 2)
        # Nothing moved: both still failed, with their first and only end.
        for job_id in (broken, waiting):
            self.assertEqual(self.d.show(job_id)["job"]["state"], "failed")
            self.assertEqual(self.d.show(job_id)["history"][-1]["state"], "failed")
        self.d.ok("cancel", str(running))

    def test_restarting_a_batch_requeues_only_what_did_not_succeed_and_a_running_wait_waits_for_it_again(self):
        flag = self.tmp_path("second-time")
        again = f'[ -e {flag} ]'
        jobs = [
            {"name": "ok", "command": ["true"]},
            {"name": "bad", "shell": f"{again} && sleep 1"},
            {"name": "slow", "timeout_s": 0.5, "shell": f"{again} || sleep 9187"},
            {"name": "stopped", "shell": f"{again} || sleep 9187"},
            {"name": "long", "shell": f"while [ ! -e {flag}.go ]; do sleep 0.1; done"},
        ]
        sub = self.d.submit(jobs)
        ok, bad, slow, stopped, long_ = sub["ids"]
        wait_until(lambda: self.d.show(stopped)["job"]["state"] == "running", what="stopped to start")
        self.d.ok("cancel", str(stopped))
        self.d.wait([ok, bad, slow, stopped])
        # A wait on `bad` and a job still running: it must not return before the restarted `bad` ends again.
        waiter = subprocess.Popen([os.path.join(BIN, "gpuq"), "--socket", self.d.socket, "wait", str(bad), str(long_),
                                   "--json"], stdout=subprocess.PIPE, text=True)
        open(flag, "w").close()
        out = self.d.json("restart", "--batch", str(sub["batch"]))["jobs"]
        self.assertEqual([(j["id"], j["was"]) for j in out], [(bad, "failed"), (slow, "timed_out"), (stopped, "cancelled")])
        open(flag + ".go", "w").close()  # `long` ends now; `bad` takes a second more
        waited = {j["id"]: j for j in json.loads(waiter.communicate(timeout=60)[0])["jobs"]}
        self.assertEqual(waiter.returncode, 0)
        self.assertEqual(waited[bad]["state"], "succeeded")
        done = self.d.wait(sub["ids"])
        self.assertEqual({done[i]["state"] for i in sub["ids"]}, {"succeeded"})
        self.assertEqual(done[ok]["restarts"], 0)
        nothing = self.d.run("restart", "--batch", str(sub["batch"]))
        self.assertEqual(nothing.returncode, 0)
        self.assertIn(f"nothing to restart: every job of batch {sub['batch']} succeeded", nothing.stdout)
        self.assertEqual(self.d.run("restart", "--batch", "99").returncode, 4)

    def test_a_restarted_job_resumes_from_its_checkpoints_unless_fresh(self):
        job_id = self.d.submit({"name": "ck", "shell": 'ck="$GPUQ_CHECKPOINT_DIR/epoch"; '
                                '[ -e "$ck" ] && echo "resumed from $(cat "$ck")" || echo "from scratch"; '
                                'echo "$GPUQ_ATTEMPT" > "$ck"; exit 1'})["ids"][0]
        self.d.wait([job_id])
        self.d.ok("restart", str(job_id))
        self.d.wait([job_id])
        out = self.d.ok("restart", "--fresh", str(job_id))
        self.assertIn(f"job {job_id}: queued again (it had ended failed), checkpoints removed", out)
        self.d.wait([job_id])
        logs = [self.d.ok("logs", str(job_id), "--attempt", str(a)).strip() for a in (1, 2, 3)]
        self.assertEqual(logs, ["from scratch", "resumed from 1", "from scratch"])


class Hold(DaemonTest):
    GPUS = "fake:1"

    def test_held_jobs_wait_out_of_line_across_a_daemon_crash_until_released(self):
        held = self.d.submit([{"name": f"later{i}", "gpus": 1, "command": ["true"]} for i in range(2)], "--hold")
        free = self.d.submit({"name": "now", "gpus": 1, "command": ["true"]})["ids"][0]
        self.assertEqual(self.d.wait([free])[free]["state"], "succeeded")  # nothing held is in its way
        self.assertEqual(self.d.run("wait", *map(str, held["ids"]), "--timeout", "0.5").returncode, 124)
        jobs = {j["id"]: j for j in self.d.json("status")["jobs"]}
        for job_id in held["ids"]:
            self.assertEqual((jobs[job_id]["state"], jobs[job_id]["held"]), ("queued", True))
            self.assertEqual(jobs[job_id]["reason"], f"held until `gpuq release {job_id}`")
        self.assertRegex(self.d.ok("status"), rf"{held['ids'][0]}\s+later0\s+held")
        self.d.kill9()
        self.d.start()
        self.d.wait_for_counter("scheduling_passes", at_least=1)  # the restarted gpuqd has looked at its queue
        self.assertEqual({self.d.show(i)["job"]["state"] for i in held["ids"]}, {"queued"})
        out = self.d.ok("release", "--batch", str(held["batch"]))
        self.assertEqual(out.split("\n")[:2], [f"job {i}: released" for i in held["ids"]])
        done = self.d.wait(held["ids"])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        self.assertFalse(any(j["held"] for j in done.values()))
        history = [(h["state"], h["reason"]) for h in self.d.show(held["ids"][0])["history"]]
        self.assertEqual(history[:2], [("queued", ""), ("queued", "released")])

    def test_a_held_job_reserves_nothing_and_a_later_job_takes_the_gpu(self):
        busy = self.d.submit({"name": "busy", "gpus": 1, "shell": f"while [ ! -e {self.tmp}/go ]; do sleep 0.05; done"})
        first, second = self.d.submit([{"name": "first", "gpus": 1, "priority": 5, "command": ["true"]},
                                       {"name": "second", "gpus": 1, "command": ["true"]}])["ids"]
        self.assertEqual(self.d.json("hold", str(first))["jobs"], [{"id": first, "state": "queued", "changed": True}])
        self.assertEqual(self.d.json("hold", str(first))["jobs"][0]["changed"], False)
        open(f"{self.tmp}/go", "w").close()
        self.assertEqual(self.d.wait([second])[second]["state"], "succeeded")
        self.assertEqual(self.d.show(first)["job"]["state"], "queued")
        self.assertGreaterEqual(self.d.show(second)["job"]["started_at"], self.d.show(busy["ids"][0])["job"]["ended_at"])
        self.d.ok("release", str(first))
        self.assertEqual(self.d.wait([first])[first]["state"], "succeeded")

    def test_only_queued_jobs_can_be_held_and_a_held_job_can_be_cancelled(self):
        running = self.d.submit({"name": "running", "shell": "sleep 9187"})["ids"][0]
        wait_until(lambda: self.d.show(running)["job"]["state"] == "running", what="the job to start")
        queued = self.d.submit({"name": "queued", "command": ["true"]}, "--hold")["ids"][0]
        r = self.d.run("hold", str(queued), str(running))
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"job {running} (running) is running; only a queued job can be held (`gpuq cancel` stops a "
                      "running one)", r.stderr)
        self.assertEqual(self.d.run("hold", "424242").returncode, 4)
        self.assertEqual(self.d.run("hold").returncode, 2)
        self.assertEqual(self.d.ok("release", str(running)).strip(), f"job {running}: running, not held")
        self.d.ok("cancel", str(queued))
        job = self.d.show(queued)["job"]
        self.assertEqual((job["state"], job["held"]), ("cancelled", False))
        self.d.ok("cancel", str(running))


class Clean(DaemonTest):
    def test_clean_frees_ended_jobs_files_and_keeps_their_results_and_history(self):
        write = ('head -c 200000 /dev/zero > "$GPUQ_CHECKPOINT_DIR/model.pt"; echo "trained $GPUQ_JOB_NAME"; ' +
                 event_line(type="result", accuracy=0.9))
        sub = self.d.submit([{"name": "a", "shell": write}, {"name": "b", "shell": write},
                             {"name": "busy", "shell": "sleep 9187"}])
        a, b, busy = sub["ids"]
        self.d.wait([a, b])
        wait_until(lambda: self.d.show(busy)["job"]["state"] == "running", what="busy to start")
        jobs_dir = os.path.join(self.d.state, "jobs")

        out = self.d.json("clean", "--checkpoints", str(a))
        self.assertEqual(out["cleaned"], [a])
        self.assertGreaterEqual(out["bytes_freed"], 200000)
        self.assertEqual(os.listdir(os.path.join(jobs_dir, str(a), "checkpoints")), [])
        self.assertEqual(self.d.ok("logs", str(a)).strip(), "trained a")  # logs kept

        r = self.d.run("clean", str(busy))
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"job {busy} (busy) is running; only the files of a job that has ended can be removed", r.stderr)
        self.assertIn("nothing to remove", self.d.ok("clean", "--older-than", "1h"))  # all ended just now

        out = self.d.ok("clean", "--batch", str(sub["batch"]))
        self.assertRegex(out, r"removed the files of 2 jobs \(\d+\.\d KiB\); their results and history stay")
        self.assertFalse(os.path.exists(os.path.join(jobs_dir, str(a))))
        self.assertFalse(os.path.exists(os.path.join(jobs_dir, str(b))))
        self.assertTrue(os.path.exists(os.path.join(jobs_dir, str(busy))))  # still running: untouched
        results = {j["id"]: j["result"] for j in self.d.json("results", "--batch", str(sub["batch"]))["jobs"]}
        self.assertEqual(results[b], {"accuracy": 0.9})
        self.assertEqual(self.d.show(b)["history"][-1]["state"], "succeeded")
        r = self.d.run("logs", str(b))
        self.assertEqual(r.returncode, 0)
        self.assertIn(f"job {b} has no log files left", r.stderr)
        self.assertIn("nothing to remove", self.d.ok("clean", str(a), str(b)))
        self.d.ok("restart", str(a))  # a cleaned job runs again in a new directory
        self.assertEqual(self.d.wait([a])[a]["state"], "succeeded")
        self.assertEqual(self.d.ok("logs", str(a)).strip(), "trained a")
        self.d.ok("clean", str(a))

        self.d.ok("cancel", str(busy))
        self.d.wait([busy])
        self.assertEqual(self.d.json("clean", "--older-than", "0")["cleaned"], [busy])
        self.assertEqual(os.listdir(jobs_dir), [])
        self.assertEqual(self.d.run("clean", "--older-than", "soon").returncode, 2)
        self.assertEqual(self.d.run("clean").returncode, 2)
        self.assertIn("nothing to remove", self.d.ok("clean", "--checkpoints", str(a)))

    def test_forget_removes_ended_jobs_records_keeps_what_is_still_needed_and_never_reuses_an_id(self):
        write = 'echo "ran $GPUQ_JOB_NAME"; ' + event_line(type="result", accuracy=0.5)
        sub = self.d.submit([{"name": "bad", "shell": "exit 3"}, {"name": "c", "shell": write},
                             {"name": "a", "shell": write}])
        bad, c, a = sub["ids"]
        self.d.wait(sub["ids"])
        y = self.d.submit({"name": "y", "after": [a], "command": ["true"]}, "--hold")["ids"][0]
        busy = self.d.submit({"name": "busy", "shell": "sleep 9187"})["ids"][0]
        waiting = subprocess.Popen([os.path.join(BIN, "gpuq"), "wait", "--json", str(bad), str(busy)],
                                   env=dict(os.environ, GPUQ_SOCKET=self.d.socket),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # Named, a job still needed is an error that forgets nothing. (`a` is always needed, so the
            # probe changes nothing while the wait is still on its way in.)
            def refused_for_the_wait():
                r = self.d.run("clean", "--forget", str(bad), str(a))
                self.assertEqual(r.returncode, 4, r.stderr)
                return f"job {bad} (bad) cannot be forgotten: a `gpuq wait` is waiting on it" in r.stderr
            wait_until(refused_for_the_wait, what="the wait to reach gpuqd")
            r = self.d.run("clean", "--forget", str(a))
            self.assertIn(f"job {a} (a) cannot be forgotten: queued job {y} (y) waits for it (`after`)", r.stderr)
            r = self.d.run("clean", "--forget", str(busy))
            self.assertEqual(r.returncode, 4)
            self.assertIn(f"job {busy} (busy) is running; only a job that has ended can be forgotten", r.stderr)

            # Selected by age, the needed ones are kept and say why; the rest are forgotten whole.
            out = self.d.json("clean", "--forget", "--older-than", "0")
            self.assertEqual(out["forgotten"], [c])
            self.assertEqual(out["cleaned"], [c])
            self.assertEqual([k["id"] for k in out["kept"]], [bad, a])
            self.assertFalse(os.path.exists(os.path.join(self.d.state, "jobs", str(c))))
            r = self.d.run("show", str(c))
            self.assertEqual((r.returncode, r.stderr.strip()), (4, f"gpuq: job {c} was forgotten (`gpuq clean --forget`)"))
            self.assertNotIn(c, [j["id"] for j in self.d.json("status", "--all")["jobs"]])
            self.assertEqual(sorted(j["id"] for j in self.d.json("results", "--batch", str(sub["batch"]))["jobs"]),
                             [bad, a])
            self.assertEqual(self.d.show(a)["job"]["result"], {"accuracy": 0.5})
        finally:
            self.d.ok("cancel", str(busy), str(y))
            self.assertEqual(waiting.wait(timeout=60), 1)  # bad failed

        out = self.d.ok("clean", "--forget", "--batch", str(sub["batch"]))
        self.assertRegex(out, r"^forgot 2 jobs: removed their records and files \(\d+(\.\d)? (B|KiB)\)\n$")
        r = self.d.run("results", "--batch", str(sub["batch"]))
        self.assertEqual((r.returncode, r.stderr.strip()),
                         (4, f"gpuq: batch {sub['batch']} was forgotten (`gpuq clean --forget`)"))
        r = self.d.run("restart", str(y))  # cancelled; it waits for `a`, gone now
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"job {y} (y) waits for job {a}, which was forgotten (`gpuq clean --forget`), so it cannot run "
                      "again", r.stderr)
        self.assertEqual(self.d.json("clean", "--forget", str(y), str(busy))["forgotten"], [y, busy])
        self.assertEqual(self.d.json("status", "--all")["jobs"], [])

        # The highest ids were forgotten, yet neither they nor their batches' come back, even after
        # a crash; a new job cannot wait for a forgotten one.
        self.d.kill9()
        self.d.start()
        r = self.d.run("submit", "-", input=json.dumps({"name": "late", "after": [c], "command": ["true"]}))
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"`after` names job {c}, which was forgotten (`gpuq clean --forget`)", r.stderr)
        late = self.d.submit({"name": "late", "command": ["true"]})
        self.assertEqual(late["ids"], [busy + 1])
        self.assertGreater(late["batch"], sub["batch"] + 2)
        self.assertIn("was forgotten", self.d.run("show", str(a)).stderr)
        self.assertIn(f"no job {busy + 2}", self.d.run("show", str(busy + 2)).stderr)
        self.assertEqual(self.d.run("clean", "--forget", "--checkpoints", str(busy + 1)).returncode, 2)

    def test_forget_after_forgets_jobs_that_ended_long_enough_ago_but_not_one_still_needed(self):
        self.d.stop()
        self.d = Daemon(self.tmp, extra=["--forget-after", "2s"]).start()
        first = self.d.submit([{"name": "old", "command": ["true"]}, {"name": "needed", "command": ["true"]}])
        old, needed = first["ids"]
        self.d.wait(first["ids"])
        held = self.d.submit({"name": "later", "after": [needed], "command": ["true"]}, "--hold")["ids"][0]
        self.assertEqual(self.d.show(old)["job"]["state"], "succeeded")  # not before its time
        wait_until(lambda: self.d.run("show", str(old)).returncode == 4, timeout=30, what="the old job to be forgotten")
        self.assertIn(f"job {old} was forgotten", self.d.run("show", str(old)).stderr)
        self.assertFalse(os.path.exists(os.path.join(self.d.state, "jobs", str(old))))
        self.assertEqual(self.d.show(needed)["job"]["state"], "succeeded")  # `later` waits for it
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            self.assertIn("gpuqd: forgot 1 job(s) that ended over 2 s ago", f.read())
        self.d.ok("release", str(held))
        self.d.wait([held])
        wait_until(lambda: self.d.json("status", "--all")["jobs"] == [], timeout=30, what="every job to be forgotten")
        for bad in ("soon", "-1d"):
            r = subprocess.run([os.path.join(BIN, "gpuqd"), "--forget-after", bad], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(f"--forget-after: {bad} is not a duration like 90s, 30m, 12h, 7d or 2w", r.stderr)

    def test_a_clean_cut_short_by_a_stop_is_finished_at_the_next_start(self):
        # A clean moves the directories into the trash at once and deletes them on another thread.
        left = os.path.join(self.d.state, "trash", "7-1-1", "attempt-1")
        os.makedirs(left)
        open(os.path.join(left, "rank-0.log"), "w").close()
        self.d.stop()
        self.d.start()
        wait_until(lambda: os.listdir(os.path.join(self.d.state, "trash")) == [], what="the trash to be emptied")


class Update(DaemonTest):
    GPUS = "fake:1"

    def test_a_queued_job_moves_up_the_line_and_a_running_one_takes_new_retries(self):
        go = self.tmp_path("go")
        busy = self.d.submit({"name": "busy", "gpus": 1, "shell": f"while [ ! -e {go} ]; do sleep 0.05; done; "
                                                                   '[ "$GPUQ_ATTEMPT" -ge 2 ]'})["ids"][0]
        wait_until(lambda: self.d.show(busy)["job"]["state"] == "running", what="busy to start")
        order = self.tmp_path("order")
        ids = self.d.submit([{"name": f"q{i}", "gpus": 1, "shell": f"echo q{i} >> {order}"} for i in range(3)])["ids"]
        out = self.d.json("update", str(ids[2]), "--priority", "5", "--timeout", "1h")["jobs"]
        self.assertEqual(out, [{"id": ids[2], "state": "queued", "changed": True}])
        self.assertEqual(self.d.json("update", str(ids[2]), "--priority", "5")["jobs"][0]["changed"], False)
        # The running job fails its first attempt: with the retry given now, it runs again.
        self.d.ok("update", str(busy), "--retries", "1")
        r = self.d.run("update", str(busy), "--timeout", "1h")
        self.assertEqual(r.returncode, 4)
        self.assertIn("is running: its supervisor enforces the timeout it started with", r.stderr)
        open(go, "w").close()
        done = self.d.wait([busy] + ids)
        self.assertEqual((done[busy]["state"], done[busy]["attempt"]), ("succeeded", 2))
        self.assertEqual(pathlib.Path(order).read_text().split(), ["q2", "q0", "q1"])
        show = self.d.show(ids[2])
        self.assertEqual((show["spec"]["priority"], show["spec"]["timeout_s"]), (5, 3600))
        self.assertIn(("queued", "updated: priority 0 -> 5, timeout_s 0 -> 3600"),
                      [(h["state"], h["reason"]) for h in show["history"]])
        # Stored: a restarted daemon keeps the new values.
        self.d.stop()
        self.d.start()
        self.assertEqual(self.d.show(ids[2])["spec"]["priority"], 5)

    def test_an_update_that_cannot_be_made_changes_nothing_and_says_why(self):
        ended = self.d.submit({"name": "ended", "command": ["true"]})["ids"][0]
        self.d.wait([ended])
        queued = self.d.submit({"name": "waiting", "after": [ended], "gpus": 1, "command": ["true"]}, "--hold")["ids"][0]
        r = self.d.run("update", str(queued), str(ended), "--priority", "3")
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"job {ended} (ended) has ended succeeded; `gpuq restart` queues it again", r.stderr)
        self.assertEqual(self.d.show(queued)["spec"]["priority"], 0)
        r = self.d.run("update", str(queued), "--retries", "1000")
        self.assertEqual(r.returncode, 4)
        self.assertIn("field `set.retries` must be an integer from 0 to 100", r.stderr)
        self.assertEqual(self.d.run("update", str(queued), "--timeout", "soon").returncode, 2)
        self.assertEqual(self.d.run("update", str(queued)).returncode, 2)
        reply = self.d.request({"cmd": "update", "ids": [queued], "set": {"gpus": 4}})
        self.assertEqual(reply["error"]["code"], "bad_request")
        self.assertIn("only priority, retries, timeout_s and max_running", reply["error"]["message"])
        self.d.ok("update", str(queued), "--timeout", "none", "--priority", "-2")
        self.assertEqual(self.d.show(queued)["spec"]["priority"], -2)


class BatchLimit(DaemonTest):
    GPUS = "fake:4"

    def running(self, batch):
        return sorted(j["id"] for j in self.d.json("status")["jobs"] if j["batch"] == batch and j["state"] == "running")

    def test_a_batch_runs_at_most_its_limit_and_a_new_limit_takes_effect_at_once(self):
        go = self.tmp_path("go")
        sweep = self.d.submit([{"name": f"s{i}", "gpus": 1, "shell": f"while [ ! -e {go} ]; do sleep 0.05; done"}
                               for i in range(5)], "--max-running", "2")
        batch, ids = sweep["batch"], sweep["ids"]
        wait_until(lambda: self.running(batch) == ids[:2], what="the first two of the batch")
        # The waiting jobs reserve nothing: a later job of another batch takes a free GPU at once.
        other = self.d.submit({"name": "other", "gpus": 1, "command": ["true"]})["ids"][0]
        self.assertEqual(self.d.wait([other])[other]["state"], "succeeded")
        limit_reason = f"batch {batch} runs 2 jobs, its limit (max_running 2)"
        for job_id in ids[2:]:
            self.assertEqual(self.d.show(job_id)["job"]["reason"], limit_reason)
        self.assertIn(f"batch {batch} (at most 2 of it run at once)", self.d.ok("show", str(ids[3])))
        # Stored with the batch: a gpuqd killed and started again keeps to it.
        self.d.kill9()
        self.d.start()
        self.assertEqual(self.running(batch), ids[:2])
        wait_until(lambda: self.d.show(ids[4])["job"]["reason"] == limit_reason, what="the limit's reason")

        self.assertEqual(self.d.ok("update", "--batch", str(batch), "--max-running", "3"),
                         f"batch {batch}: at most 3 jobs at once (was at most 2 jobs at once)\n")
        wait_until(lambda: self.running(batch) == ids[:3], what="a third job under the raised limit")
        # Lowered below what runs: the running jobs run on, and no more start.
        out = self.d.json("update", "--batch", str(batch), "--max-running", "1")
        self.assertEqual(out["batch_limit"], {"batch": batch, "max_running": 1, "was": 3})
        self.assertEqual(out["jobs"], [])
        self.assertEqual(self.running(batch), ids[:3])
        self.assertEqual(self.d.show(ids[3])["batch_max_running"], 1)
        self.d.ok("update", "--batch", str(batch), "--max-running", "none")
        wait_until(lambda: self.running(batch) == ids[:4], what="every GPU in use without a limit")
        self.assertEqual(self.d.show(ids[4])["batch_max_running"], 0)
        open(go, "w").close()
        self.assertEqual({j["state"] for j in self.d.wait(ids).values()}, {"succeeded"})

    def test_a_limit_that_cannot_be_set_says_why(self):
        job = self.d.submit({"name": "one", "command": ["true"]})["ids"][0]
        r = self.d.run("update", str(job), "--max-running", "2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--max-running is a batch's limit; name the batch with --batch", r.stderr)
        for bad in ("0", "many", "2x"):
            r = self.d.run("update", "--batch", "1", "--max-running", bad)
            self.assertEqual(r.returncode, 2)
            self.assertIn(f"--max-running {bad} is not a number from 1 to 1000000, or none", r.stderr)
        self.assertEqual(self.d.run("submit", "-", "--max-running", "0", input="{}").returncode, 2)
        r = self.d.run("update", "--batch", "999", "--max-running", "2")
        self.assertEqual(r.returncode, 4)
        self.assertIn("no batch 999", r.stderr)
        reply = self.d.request({"cmd": "update", "ids": [job], "set": {"max_running": 2}})
        self.assertEqual(reply["error"]["code"], "bad_request")
        reply = self.d.request({"cmd": "submit", "jobs": {"command": ["true"]}, "cwd": "/", "max_running": -3})
        self.assertIn("field `max_running` must be", reply["error"]["message"])



class Hooks(DaemonTest):
    """on_finish hooks (job-spec.md, cli.md): the configuration's for every job and a job's own,
    run once per terminal state with the job's JSON on stdin, bounded in time, at most a few at
    once, and run at the next start for jobs that ended while gpuqd was down."""

    def restart_with(self, config):
        self.d.stop()
        path = self.tmp_path("config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.d = Daemon(self.tmp, env=dict(os.environ, GPUQ_CONFIG=path)).start()

    def record(self, name):
        """A hook that appends its job's id, state and name, and the JSON it read, to `name`.jsonl."""
        out = self.tmp_path(name + ".jsonl")
        return out, ["sh", "-c", 'printf \'{"id": %s, "state": "%s", "name": "%s", "stdin": %s}\\n\' '
                                 '"$GPUQ_JOB_ID" "$GPUQ_JOB_STATE" "$GPUQ_JOB_NAME" "$(cat)" >> ' + out]

    def lines(self, path):
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def test_hooks_run_once_per_end_with_the_job_as_show_gives_it(self):
        every, every_hook = self.record("every")
        self.restart_with({"on_finish": every_hook})
        own, own_hook = self.record("own")
        ok, bad, dropped = self.d.submit([{"name": "ok", "command": ["true"], "on_finish": own_hook},
                                          {"name": "bad", "command": ["false"]},
                                          {"name": "dropped", "command": ["true"], "after": ["bad"]}])["ids"]
        self.d.wait([ok, bad, dropped])
        wait_until(lambda: len(self.lines(every)) == 3 and len(self.lines(own)) == 1, what="the hooks")
        seen = {r["id"]: r for r in self.lines(every)}
        self.assertEqual({i: (r["state"], r["name"]) for i, r in seen.items()},
                         {ok: ("succeeded", "ok"), bad: ("failed", "bad"), dropped: ("failed", "dropped")})
        self.assertEqual(seen[bad]["stdin"]["job"]["reason"], "rank 0 exited with code 1")
        self.assertEqual(seen[ok]["stdin"]["job"], self.d.show(ok)["job"])
        self.assertEqual(self.lines(own)[0]["id"], ok)
        # A restart ends the job again: its hooks run again, once; the others' not at all.
        self.d.ok("restart", str(ok))
        self.d.wait([ok])
        wait_until(lambda: len(self.lines(own)) == 2, what="the restarted job's own hook")
        self.d.stop()
        self.d.start()
        last = self.d.submit({"name": "last", "command": ["true"]})["ids"][0]
        self.d.wait([last])
        wait_until(lambda: any(r["id"] == last for r in self.lines(every)), what="the last job's hook")
        self.assertEqual(sorted(r["id"] for r in self.lines(every)), sorted([ok, ok, bad, dropped, last]))
        self.assertEqual(len(self.lines(own)), 2)

    def test_hooks_of_a_job_that_ended_while_gpuqd_was_down_run_at_its_next_start(self):
        every, every_hook = self.record("every")
        self.restart_with({"on_finish": every_hook})
        gate = self.tmp_path("gate")
        job = self.d.submit({"name": "slow", "shell": f"while [ ! -e {gate} ]; do sleep 0.05; done"})["ids"][0]
        wait_until(lambda: self.d.show(job)["job"]["state"] == "running", what="the job to run")
        self.d.kill9()
        open(gate, "w").close()
        attempt = os.path.join(self.d.state, "jobs", str(job), "attempt-1", "exit.json")
        wait_until(lambda: os.path.exists(attempt), what="the job to end while gpuqd is down")
        self.assertEqual(self.lines(every), [])
        self.d.start()
        wait_until(lambda: len(self.lines(every)) == 1, what="its hook, at gpuqd's start")
        self.assertEqual((self.lines(every)[0]["id"], self.lines(every)[0]["state"]), (job, "succeeded"))

    def test_a_hanging_hook_is_killed_at_its_limit_and_holds_up_nothing(self):
        self.restart_with({"hook_timeout_s": 1})
        hung = self.d.submit({"name": "hung-hook", "command": ["true"], "on_finish": ["sleep", "7405"]})["ids"][0]
        self.d.wait([hung])
        after = self.d.submit({"name": "after", "command": ["true"]})["ids"][0]
        self.assertEqual(self.d.wait([after])[after]["state"], "succeeded")
        log = os.path.join(self.tmp, "gpuqd.log")
        wait_until(lambda: "on_finish hook was killed after hook_timeout_s (1 s)" in pathlib.Path(log).read_text(),
                   what="the hook killed")
        self.assertIn(f"job {hung}: on_finish hook was killed", pathlib.Path(log).read_text())

    def test_a_hook_that_stops_its_supervisor_is_killed_past_its_limit(self):
        # Single-user mode: the hook runs as its supervisor's user and may SIGSTOP it, so that the
        # supervisor enforces no hook_timeout_s; gpuqd kills it past the limit and the grace.
        self.restart_with({"hook_timeout_s": 1})
        stopped, hook = self.tmp_path("stopped"), self.tmp_path("hook.pid")
        job = self.d.submit({"name": "stopping-hook", "command": ["true"], "on_finish": [
            "sh", "-c", f"echo $$ > {hook}.new && mv {hook}.new {hook}; kill -STOP $PPID; touch {stopped}; exec sleep 7407"]})["ids"][0]
        self.d.wait([job])
        log = os.path.join(self.tmp, "gpuqd.log")
        wait_until(lambda: "on_finish hook's supervisor has not ended it" in pathlib.Path(log).read_text(), timeout=60,
                   what="the stopped supervisor killed")
        self.assertTrue(os.path.exists(stopped), "the hook did not get to stop its supervisor")
        self.assertIn(f"job {job}: its on_finish hook's supervisor has not ended it", pathlib.Path(log).read_text())
        with open(hook) as f:
            pid = int(f.read())
        wait_until(lambda: not alive(pid), what="the hook to die with its supervisor")
        # Its slot is free: the next job's hook runs.
        done = self.tmp_path("done")
        after = self.d.submit({"name": "after", "command": ["true"], "on_finish": ["touch", done]})["ids"][0]
        self.d.wait([after])
        wait_until(lambda: os.path.exists(done), what="the next hook")

    def test_a_thousand_jobs_ending_at_once_queue_their_hooks_and_scheduling_goes_on(self):
        started = self.tmp_path("started")
        self.restart_with({"on_finish": ["sh", "-c", f"echo $GPUQ_JOB_ID >> {started}; sleep 7406"]})
        flood = self.d.submit([{"name": f"f{i}", "command": ["true"]} for i in range(1000)])["ids"]
        self.d.wait(flood, timeout=600)
        # While their hooks wait their turn (at most 4 run), a new job starts and ends as ever.
        late = self.d.submit({"name": "late", "command": ["true"]})["ids"][0]
        self.assertEqual(self.d.wait([late])[late]["state"], "succeeded")
        wait_until(lambda: os.path.exists(started) and len(pathlib.Path(started).read_text().split()) == 4,
                   what="four hooks started")
        self.assertEqual(len(pathlib.Path(started).read_text().split()), 4)  # no more than max_hooks at once
        self.assertEqual(self.d.run("status").returncode, 0)


if __name__ == "__main__":
    unittest.main()


class Hangs(DaemonTest):
    """--hang-after: a running job that reported progress and then nothing for that long is flagged
    as maybe hung (status, show, why); with --hang-action retry it is stopped and retried."""

    def restart_with(self, *extra):
        self.d.stop()
        self.d = Daemon(self.tmp, extra=["--hang-after", "1s", *extra]).start()

    def test_a_job_silent_after_progress_is_flagged_and_one_that_never_reported_is_not(self):
        self.restart_with()
        gate = self.tmp_path("gate")
        wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
        stuck, quiet = self.d.submit([
            {"name": "stuck", "shell": event_line(type="progress", epoch=3, step=200) + "; " + wait},
            {"name": "quiet", "shell": wait}])["ids"]
        wait_until(lambda: self.d.show(stuck)["job"].get("hung"), timeout=30, what="the silent job to be flagged")
        job = self.d.show(stuck)["job"]
        self.assertEqual(job["state"], "running")
        self.assertRegex(job["reason"], r"^no progress for \d+ s since its last progress event at epoch 3, step 200 "
                                        r"\(hang_after_s 1\): it may be hung$")
        self.assertIn("running (hung?)", self.d.ok("status"))
        self.assertIn("it has made no progress for", "\n".join(self.d.json("why", str(stuck))["details"]))
        self.assertFalse(self.d.show(quiet)["job"].get("hung"))  # it never said how it progresses
        open(gate, "w").close()
        jobs = self.d.wait([stuck, quiet])
        self.assertEqual(jobs[stuck]["state"], "succeeded")  # flagged only: it ran to its end
        self.assertFalse(jobs[stuck]["hung"])

    def test_with_hang_action_retry_a_silent_job_is_stopped_and_retried(self):
        self.restart_with("--hang-action", "retry")
        # Attempt 1 reports progress, then hangs; attempt 2 finishes.
        shell = (event_line(type="progress", step=1) + '; if [ "$GPUQ_ATTEMPT" = 1 ]; then sleep 7402; fi')
        job_id = self.d.submit({"name": "flaky", "retries": 1, "shell": shell})["ids"][0]
        job = self.d.wait([job_id], timeout=60)[job_id]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["attempt"], 2)
        reasons = [t["reason"] for t in self.d.show(job_id)["history"]]
        self.assertTrue(any(r.startswith("attempt 1 failed (stopped: no progress for") for r in reasons), reasons)
