"""Preemption through the real daemon and CLI: an urgent job stops preemptible jobs of lower
priority that hold the GPUs it needs; they get $GPUQ_PREEMPT_FILE, their signal and their grace to
checkpoint, and go back in line as preempted, no retry spent."""
import json
import os
import re
import tempfile
import time
import unittest

from harness import FAKE_NVML_DIR, Daemon, DaemonTest, wait_until

# A job of `steps` steps that checkpoints its step count on its signal (SIGTERM unless `signal`)
# and resumes from it: each step is appended to `log` once, whatever the attempts. In attempt 1 it
# stops after step `park` and waits there (a long training); `started` appears once the trap is set.
STEPPER = r'''
ck="$GPUQ_CHECKPOINT_DIR/step"; s=0; [ -f "$ck" ] && s=$(cat "$ck")
save() {{
  echo "$s" > "$ck"
  echo "{{\"type\": \"checkpoint\", \"step\": $s}}" >> "$GPUQ_EVENTS"
  [ -f "$GPUQ_PREEMPT_FILE" ] && echo "preempt file seen at step $s"
  {on_signal}
}}
trap save {signal}
touch {started}-$GPUQ_ATTEMPT
while [ "$s" -lt {steps} ]; do
  if [ "$GPUQ_ATTEMPT" = 1 ] && [ "$s" -ge {park} ]; then sleep 0.05; continue; fi
  s=$((s + 1)); echo "$s" >> {log}
done
echo "{{\"type\": \"result\", \"steps\": $s}}" >> "$GPUQ_EVENTS"
'''


def stepper(started, log, steps=10, park=3, signal="TERM", on_signal="exit 143"):
    return STEPPER.format(started=started, log=log, steps=steps, park=park, signal=signal, on_signal=on_signal)


def slow_to_stop(started, stopping, gate):
    """A job that, on SIGTERM, touches `stopping` and ends only once `gate` exists; its second
    attempt succeeds at once: a victim whose stopping and wait in line can be looked at."""
    return ('[ "$GPUQ_ATTEMPT" = 2 ] && exit 0; '
            f"trap 'touch {stopping}; while [ ! -e {gate} ]; do sleep 0.05; done; exit 143' TERM; "
            f"touch {started}; while true; do sleep 0.05; done")


def history(d, job):
    return [(h["attempt"], h["state"], h["reason"]) for h in d.show(job)["history"]]


class Preemption(DaemonTest):
    GPUS = "fake:2"

    def test_an_urgent_job_preempts_a_low_gang_which_checkpoints_and_resumes_where_it_stopped(self):
        started, log = self.tmp_path("started"), self.tmp_path("steps")
        low = self.d.submit({"name": "low", "gpus": 2, "preemptible": True, "timeout_s": 300,
                             "shell": stepper(started, log)})["ids"][0]
        wait_until(lambda: os.path.exists(started + "-1"), what="the low job to start")
        wait_until(lambda: os.path.exists(log) and len(open(log).read().split()) == 3, what="three steps")
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        done = self.d.wait([low, urgent])
        self.assertEqual(done[urgent]["state"], "succeeded", done[urgent]["reason"])
        self.assertEqual(done[low]["state"], "succeeded", done[low]["reason"])
        # Every step once, in order: it resumed exactly where it stopped.
        self.assertEqual(open(log).read().split(), [str(i) for i in range(1, 11)])
        self.assertEqual(done[low]["result"], {"steps": 10})
        # No retry spent (retries 0), attempt 2, one preemption, by the urgent job.
        self.assertEqual((done[low]["attempt"], done[low]["attempt_base"], done[low]["retries"]), (2, 1, 0))
        self.assertEqual(done[low]["preemptions"], 1)
        why = f"preempted by job {urgent} (urgent): attempt 1 was stopped (it had checkpointed)"
        self.assertIn((1, "queued", why), history(self.d, low))
        # The urgent job started after the victim's attempt ended, on a GPU it had held.
        attempt1_end = [h for h in self.d.show(low)["history"] if h["state"] == "queued" and h["attempt"] == 1][0]["at"]
        self.assertGreaterEqual(done[urgent]["started_at"], attempt1_end)
        self.assertTrue(set(done[urgent]["gpus"]) <= {0, 1})
        self.assertIn("preempt file seen at step 3", self.d.ok("logs", str(low), "--attempt", "1"))
        text = self.d.ok("show", str(low))
        self.assertIn("attempt:   1 of 1 (attempt 2 in all; preempted 1 time)", text)
        self.assertIn("preempt:   preemptible; preempted 1 time", text)

    def test_a_job_that_ignores_its_signal_is_killed_after_its_grace_and_the_urgent_job_runs(self):
        started = self.tmp_path("started")
        script = f"[ \"$GPUQ_ATTEMPT\" = 2 ] && exit 0; trap '' TERM; touch {started}; while true; do sleep 0.05; done"
        low = self.d.submit({"name": "stubborn", "gpus": 2, "preemptible": True, "preempt_grace_s": 1,
                             "shell": script, "timeout_s": 300})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the stubborn job to start")
        urgent = self.d.submit({"name": "urgent", "gpus": 2, "priority": 5, "command": ["true"]})["ids"][0]
        done = self.d.wait([low, urgent])
        self.assertEqual(done[urgent]["state"], "succeeded", done[urgent]["reason"])
        self.assertEqual((done[low]["state"], done[low]["attempt"], done[low]["preemptions"]), ("succeeded", 2, 1))
        self.assertIn((1, "queued", f"preempted by job {urgent} (urgent): attempt 1 was stopped"), history(self.d, low))

    def test_gpuq_preempt_sends_the_specs_signal_and_records_who(self):
        started, log = self.tmp_path("started"), self.tmp_path("steps")
        # Not preemptible: by hand, its owner may preempt it all the same.
        low = self.d.submit({"name": "usr1", "gpus": 1, "preempt_signal": "USR1", "timeout_s": 300,
                             "shell": stepper(started, log, steps=6, park=2, signal="USR1")})["ids"][0]
        wait_until(lambda: os.path.exists(started + "-1"), what="the job to start")
        wait_until(lambda: os.path.exists(log) and len(open(log).read().split()) == 2, what="two steps")
        out = self.d.ok("preempt", str(low))
        self.assertIn(f"job {low}: preempting", out)
        done = self.d.wait([low])[low]
        self.assertEqual((done["state"], done["attempt"], done["preemptions"]), ("succeeded", 2, 1), done["reason"])
        self.assertEqual(open(log).read().split(), [str(i) for i in range(1, 7)])
        reasons = [r for _, s, r in history(self.d, low) if s == "queued"]
        self.assertTrue(any(re.fullmatch(r"preempted by \S+ \(gpuq preempt\): attempt 1 was stopped \(it had "
                                         r"checkpointed\)", r) for r in reasons), reasons)
        # A job that is not running, or named again while being preempted, is refused, saying why.
        r = self.d.run("preempt", str(low))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"job {low} (usr1) is succeeded; only a running job can be preempted", r.stderr)

    def test_each_process_gets_the_preempt_signal_once(self):
        # A handler that takes its time: a second signal would run it again (as a second SIGINT
        # makes many programs quit at once). The rank's main process leads its process group.
        started = self.tmp_path("started")
        script = (f"[ \"$GPUQ_ATTEMPT\" = 2 ] && exit 0; trap 'echo got; sleep 0.5; exit 0' USR1; touch {started}; "
                  "while true; do sleep 0.05; done")
        job = self.d.submit({"name": "once", "gpus": 1, "preempt_signal": "USR1", "shell": script,
                             "timeout_s": 120})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the job to start")
        self.d.ok("preempt", str(job))
        done = self.d.wait([job])[job]
        self.assertEqual((done["state"], done["attempt"]), ("succeeded", 2), done["reason"])
        # (The shell also says its `sleep` died of the signal: the group's every process gets it.)
        self.assertEqual(self.d.ok("logs", str(job), "--attempt", "1").split().count("got"), 1)

    def test_a_preempted_job_shows_as_preempted_with_who_while_it_waits(self):
        gate, started, stopping = self.tmp_path("gate"), self.tmp_path("started"), self.tmp_path("stopping")
        # The victim takes its time to stop (it waits for the gate), so its `preempting` state and
        # then its wait in line can be looked at.
        script = slow_to_stop(started, stopping, gate)
        low = self.d.submit({"name": "low", "gpus": 2, "preemptible": True, "shell": script,
                             "timeout_s": 300})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the low job to start")
        # The urgent job holds the GPUs while the victim is back in line.
        urgent_gate = self.tmp_path("urgent-gate")
        urgent = self.d.submit({"name": "urgent", "gpus": 2, "priority": 10, "timeout_s": 300,
                                "shell": f"while [ ! -e {urgent_gate} ]; do sleep 0.05; done"})["ids"][0]
        wait_until(lambda: os.path.exists(stopping), what="the low job to get its signal")
        job = self.d.show(low)["job"]
        self.assertEqual((job["state"], job["preempting"], job["preempted_by"]), ("running", True, f"job {urgent} (urgent)"))
        # `why` says what the urgent job waits for: the victim's stop, within its grace.
        self.assertTrue(any(re.fullmatch(rf"job {low} \(low\) \(\S+'s\) is being preempted for it: its GPUs are free "
                                         r"within \d+ s", d) for d in self.d.json("why", str(urgent))["details"]),
                        self.d.json("why", str(urgent))["details"])
        self.assertRegex(self.d.ok("status"), rf"(?m)^\s*{low}\s.*preempting")
        for refused in (("requeue", f"job {low} (low) is being preempted already"),
                        ("preempt", f"job {low} (low) is being preempted already")):
            r = self.d.run(refused[0], str(low))
            self.assertEqual(r.returncode, 4, r.stderr)
            self.assertIn(refused[1], r.stderr)
        open(gate, "w").close()
        wait_until(lambda: self.d.show(urgent)["job"]["state"] == "running", what="the urgent job to start")
        job = self.d.show(low)["job"]
        self.assertEqual((job["state"], job["preempting"], job["preempted_by"]), ("queued", False, f"job {urgent} (urgent)"))
        self.assertGreater(job["preempted_at"], 0)
        self.assertRegex(self.d.ok("status"), rf"(?m)^\s*{low}\s.*preempted")
        self.assertRegex(self.d.ok("why", str(low)), rf"it was preempted by job {urgent} \(urgent\) \d+ s ago \(no retry "
                                                     r"spent\); it runs again as attempt 2, from its checkpoint")
        open(urgent_gate, "w").close()
        done = self.d.wait([low, urgent])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        self.assertEqual(done[low]["preempted_by"], "")  # it ran again

    def test_why_names_the_jobs_a_waiting_job_may_preempt_and_those_it_may_not(self):
        started, gate = self.tmp_path("started"), self.tmp_path("gate")
        low = self.d.submit({"name": "low", "gpus": 1, "preemptible": True, "timeout_s": 300,
                             "shell": f'touch {started}-$GPUQ_ATTEMPT; [ "$GPUQ_ATTEMPT" = 2 ] && exit 0; '
                                      'while true; do sleep 0.05; done'})["ids"][0]
        keep = self.d.submit({"name": "keep", "gpus": 1, "timeout_s": 300,
                              "shell": f"while [ ! -e {gate} ]; do sleep 0.05; done"})["ids"][0]
        wait_until(lambda: os.path.exists(started + "-1"), what="the low job to start")
        wait_until(lambda: self.d.show(keep)["job"]["state"] == "running", what="the other job to hold its GPU")
        # The urgent job waits for a dependency first: it preempts nothing until that has succeeded.
        dep = self.d.submit({"name": "dep", "gpus": 0, "shell": f"while [ ! -e {gate}-dep ]; do sleep 0.05; done"})["ids"][0]
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "priority": 10, "after": [dep],
                                "command": ["true"]})["ids"][0]
        details = self.d.json("why", str(urgent))["details"]
        self.assertIn(f"job {low} (low) may be preempted for it", details)
        self.assertFalse(any(f"job {keep}" in d and "preempted" in d for d in details), details)  # not preemptible: not named
        self.assertEqual(self.d.show(low)["job"]["preemptions"], 0)
        open(gate + "-dep", "w").close()
        done = self.d.wait([urgent, low])
        self.assertEqual((done[urgent]["state"], done[low]["state"], done[low]["preemptions"]), ("succeeded", "succeeded", 1))
        open(gate, "w").close()
        self.d.wait([keep])

    def test_a_grace_past_the_configured_ceiling_is_refused_and_one_from_before_is_held_to_it(self):
        r = self.d.run("submit", "-", input='{"name": "slowpoke", "command": ["true"], "preempt_grace_s": 601}')
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("`preempt_grace_s` 601 is more than this gpuqd gives a preempted job (preempt_grace_max_s 600)",
                      r.stderr)
        # Submitted under a higher ceiling, preempted under a lower one: the lower holds.
        started = self.tmp_path("started")
        low = self.d.submit({"name": "stubborn", "gpus": 2, "preemptible": True, "preempt_grace_s": 600,
                             "timeout_s": 900, "shell": f'touch {started}-$GPUQ_ATTEMPT; [ "$GPUQ_ATTEMPT" = 2 ] && '
                                                        'exit 0; trap "" TERM; while true; do sleep 0.05; done'})["ids"][0]
        wait_until(lambda: os.path.exists(started + "-1"), what="the job to start")
        self.d.stop()
        self.d = Daemon(self.tmp, self.GPUS, extra=["--preempt-grace-max", "1"]).start()
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        done = self.d.wait([urgent, low], timeout=60)  # the victim's own grace would be 600 s
        self.assertEqual((done[urgent]["state"], done[low]["state"], done[low]["preemptions"]), ("succeeded", "succeeded", 1))

    def test_two_urgent_jobs_never_preempt_one_victim_twice(self):
        gate = self.tmp_path("gate")
        started = [self.tmp_path(f"started-{i}") for i in range(2)]
        stopping = [self.tmp_path(f"stopping-{i}") for i in range(2)]
        lows = []
        for i in range(2):
            # Slow to stop: several passes run while they are stopping.
            script = slow_to_stop(started[i], stopping[i], gate)
            lows.append(self.d.submit({"name": f"low{i}", "gpus": 1, "preemptible": True, "shell": script,
                                       "timeout_s": 300})["ids"][0])
        for s in started:
            wait_until(lambda s=s: os.path.exists(s), what="the low jobs to start")
        urgent = self.d.submit([{"name": f"urgent{i}", "gpus": 1, "priority": 10, "command": ["true"]}
                                for i in range(2)])["ids"]
        for s in stopping:
            wait_until(lambda s=s: os.path.exists(s), what="both low jobs to get their signal")
        # More passes while both stop: nothing more is asked of anyone.
        extra = self.d.submit({"name": "more", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        wait_until(lambda: "waiting" in self.d.show(extra)["job"]["reason"], what="a pass to look at the third job")
        open(gate, "w").close()
        done = self.d.wait(lows + urgent + [extra])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        self.assertEqual([done[i]["preemptions"] for i in lows], [1, 1])
        self.assertEqual([done[i]["attempt"] for i in lows], [2, 2])
        bys = {done[i]["id"]: [r for _, s, r in history(self.d, i) if s == "queued" and "preempted" in r] for i in lows}
        self.assertEqual(sorted(len(v) for v in bys.values()), [1, 1])
        self.assertEqual(sorted(re.search(r"job (\d+)", v[0]).group(1) for v in bys.values()),
                         sorted(str(u) for u in urgent))

    def test_jobs_not_preemptible_or_not_lower_are_left_alone(self):
        gate = self.tmp_path("gate")
        hold = f"while [ ! -e {gate} ]; do sleep 0.05; done"
        fixed = self.d.submit({"name": "fixed", "gpus": 1, "priority": 0, "shell": hold, "timeout_s": 300})["ids"][0]
        peer = self.d.submit({"name": "peer", "gpus": 1, "priority": 10, "preemptible": True, "shell": hold,
                              "timeout_s": 300})["ids"][0]
        wait_until(lambda: all(self.d.show(j)["job"]["state"] == "running" for j in (fixed, peer)), what="both to run")
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        wait_until(lambda: "waiting" in self.d.show(urgent)["job"]["reason"], what="a pass to look at the urgent job")
        for j in (fixed, peer):
            self.assertFalse(self.d.show(j)["job"]["preempting"])
        open(gate, "w").close()
        done = self.d.wait([fixed, peer, urgent])
        self.assertEqual([done[j]["preemptions"] for j in (fixed, peer, urgent)], [0, 0, 0])


class Protection(DaemonTest):
    GPUS = "fake:1"

    def setUp(self):
        super().setUp()
        self.d.stop()
        self.d = Daemon(self.tmp, self.GPUS, extra=["--preempt-protect-after", "1", "--preempt-min-run", "1h"]).start()

    def test_a_job_preempted_often_enough_runs_min_run_s_before_it_is_preempted_again(self):
        started = self.tmp_path("started")
        script = f"touch {started}-$GPUQ_ATTEMPT; while true; do sleep 0.05; done"
        low = self.d.submit({"name": "low", "gpus": 1, "preemptible": True, "preempt_grace_s": 0.5, "shell": script,
                             "timeout_s": 300})["ids"][0]
        wait_until(lambda: os.path.exists(started + "-1"), what="the low job to start")
        first = self.d.submit({"name": "urgent1", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        self.assertEqual(self.d.wait([first])[first]["state"], "succeeded")
        wait_until(lambda: os.path.exists(started + "-2"), what="the low job to run again")
        second = self.d.submit({"name": "urgent2", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        wait_until(lambda: "waiting" in self.d.show(second)["job"]["reason"], what="a pass to look at urgent2")
        job = self.d.show(low)["job"]
        self.assertEqual((job["state"], job["preempting"], job["preemptions"]), ("running", False, 1))
        self.assertIn(f"not to be preempted for it: job {low} (low): protected: preempted (stopped or frozen) 1 time, it runs 3600 s first",
                      self.d.json("why", str(second))["details"])
        self.d.ok("cancel", str(low))
        done = self.d.wait([low, second])
        self.assertEqual((done[low]["state"], done[second]["state"]), ("cancelled", "succeeded"))


class Recovery(DaemonTest):
    GPUS = "fake:1"

    def test_gpuqd_killed_mid_preemption_recovers_and_finishes_it(self):
        gate, started, stopping = self.tmp_path("gate"), self.tmp_path("started"), self.tmp_path("stopping")
        script = slow_to_stop(started, stopping, gate)
        low = self.d.submit({"name": "low", "gpus": 1, "preemptible": True, "shell": script,
                             "timeout_s": 300})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the low job to start")
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        wait_until(lambda: os.path.exists(stopping), what="the low job to get its signal")
        self.d.kill9()
        open(gate, "w").close()
        self.d.start()
        done = self.d.wait([low, urgent])
        self.assertEqual(done[urgent]["state"], "succeeded", done[urgent]["reason"])
        self.assertEqual((done[low]["state"], done[low]["attempt"], done[low]["preemptions"]), ("succeeded", 2, 1),
                         done[low]["reason"])
        self.assertIn((1, "queued", f"preempted by job {urgent} (urgent): attempt 1 was stopped"), history(self.d, low))


    def test_a_preemption_stored_but_never_sent_is_sent_by_the_next_gpuqd(self):
        # gpuqd dies right after storing the intent, before signalling the victim's supervisor:
        # the next one, adopting the victim, sends it (with its grace).
        started, stopping, gate = self.tmp_path("started"), self.tmp_path("stopping"), self.tmp_path("gate")
        self.d.stop()
        self.d.start(env=dict(os.environ, GPUQ_TEST_DIE_AFTER_PREEMPT_INTENT="1"))
        low = self.d.submit({"name": "low", "gpus": 1, "preemptible": True, "timeout_s": 300,
                             "shell": slow_to_stop(started, stopping, gate)})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the low job to start")
        self.d.run("submit", "-", input=json.dumps({"name": "urgent", "gpus": 1, "priority": 10, "command": ["true"]}))
        wait_until(lambda: self.d.proc.poll() is not None, what="gpuqd to die after storing the preemption")
        self.assertEqual(self.d.proc.returncode, 86)
        self.assertFalse(os.path.exists(stopping))  # no signal reached it
        self.d.start()
        job = self.d.show(low)["job"]
        self.assertEqual((job["state"], job["preempting"]), ("running", True))
        wait_until(lambda: os.path.exists(stopping), what="the adopted victim to get its signal")
        open(gate, "w").close()
        urgent = [j["id"] for j in self.d.json("status", "--all")["jobs"] if j["name"] == "urgent"][0]
        done = self.d.wait([low, urgent])
        self.assertEqual((done[urgent]["state"], done[low]["state"], done[low]["preemptions"]), ("succeeded", "succeeded", 1))


class PreemptHooks(DaemonTest):
    """on_preempt hooks (job-spec.md): the configuration's and the job's own, each time the job is
    preempted, as its owner, told who preempted it."""
    GPUS = "fake:1"

    def test_a_preempted_job_runs_its_on_preempt_hooks_once_a_preemption_and_its_on_finish_once(self):
        out = self.tmp_path("hooks.jsonl")
        hook = ["sh", "-c", 'printf \'{"who": "%s", "hook": "%s", "by": "%s", "state": "%s", "preemptions": %s}\\n\' '
                            '"$1" "$GPUQ_HOOK" "$GPUQ_PREEMPTED_BY" "$GPUQ_JOB_STATE" "$(jq .job.preemptions)" >> ' + out,
                "hook"]
        self.d.stop()
        config = self.tmp_path("config.json")
        with open(config, "w") as f:
            json.dump({"on_preempt": hook + ["every"]}, f)
        self.d = Daemon(self.tmp, self.GPUS, env=dict(os.environ, GPUQ_CONFIG=config)).start()
        started = self.tmp_path("started")
        low = self.d.submit({"name": "low", "gpus": 1, "preempt_grace_s": 5, "on_preempt": hook + ["own"],
                             "on_finish": hook + ["own"],
                             "shell": f'touch {started}-$GPUQ_ATTEMPT; [ "$GPUQ_ATTEMPT" = 3 ] && exit 0; '
                                      'trap "exit 143" TERM; while true; do sleep 0.05; done'})["ids"][0]
        for attempt in (1, 2):
            wait_until(lambda: os.path.exists(f"{started}-{attempt}"), what=f"attempt {attempt}")
            self.d.ok("preempt", str(low))
        self.assertEqual(self.d.wait([low])[low]["state"], "succeeded")

        def lines():
            with open(out) as f:
                return [json.loads(line) for line in f if line.endswith("\n")] if os.path.exists(out) else []
        wait_until(lambda: len(lines()) == 5, what="four on_preempt hooks and one on_finish")
        by = lines()[0]["by"]
        self.assertRegex(by, r"^\S+ \(gpuq preempt\)$")
        preempts = sorted((h["preemptions"], h["who"]) for h in lines() if h["hook"] == "preempt")
        self.assertEqual(preempts, [(1, "every"), (1, "own"), (2, "every"), (2, "own")])
        self.assertTrue(all(h["by"] == by for h in lines() if h["hook"] == "preempt"))
        self.assertEqual([(h["who"], h["state"]) for h in lines() if h["hook"] == "finish"], [("own", "succeeded")])
        # each in a directory of its own
        self.assertTrue(os.path.isdir(os.path.join(self.d.state, "jobs", str(low), "on-preempt-2-1")))


if __name__ == "__main__":
    unittest.main()


# A job that holds a token in its memory only (a shell variable made at its start), writes it out
# once at the start, and once more as its result when `gate` exists: the same token at the end says
# its process, memory and all, went on where it was. `on_term`: what a SIGTERM runs.
KEEPER = ('token=$RANDOM$RANDOM$RANDOM; {trap}echo $$ > {base}.pid; echo "$token" > {base}.token; '
          'while [ ! -e {gate} ]; do sleep 0.05; done; '
          'echo "{{\\"type\\": \\"result\\", \\"token\\": \\"$token\\"}}" >> "$GPUQ_EVENTS"')


def keeper(base, gate, on_term=None):
    trap = f"trap '{on_term}' TERM; " if on_term else ""
    return KEEPER.format(base=base, gate=gate, trap=trap)


def waiter(started, gate):
    return f"touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done"


def skip_without_freezer(test):
    """Skips `test` (its daemon stopped) where gpuqd has no cgroup v2 freezer to suspend with."""
    if not test.d.cgroups or not os.path.exists(os.path.join(test.d.cgroups, "cgroup.freeze")):
        test.d.stop()
        test.skipTest("no cgroup v2 freezer here: gpuqd suspends nothing (docs/preemption.md)")


def attempt_frozen(d, job):
    """Whether the kernel holds the first attempt of `job` frozen (its cgroup's cgroup.events)."""
    with open(os.path.join(d.cgroups, f"{job}-attempt-1", "cgroup.events")) as f:
        return "frozen 1" in f.read().split("\n")


class Suspension(DaemonTest):
    """A job without GPUs that waits for CPU slots freezes preemptible jobs of lower priority in
    place (their cgroup's freezer) and runs on their slots; once it has ended they are thawed and go
    on, memory and all: nothing is lost, no attempt is spent."""
    GPUS = "fake:1"

    def setUp(self):
        super().setUp()
        self.d.stop()
        self.d.extra += ["--cpu-slots", "1"]  # one job without GPUs at a time
        self.d.start()
        skip_without_freezer(self)

    def frozen(self, job):
        return attempt_frozen(self.d, job)

    def start_pair(self, victim_spec=None, timeout_s=300, urgent_spec=None, on_term=None):
        """A preemptible keeper of priority 0 running (`on_term`: what its SIGTERM runs), then an
        urgent waiter that freezes it: the ids, the keeper's token file, and the gates of both."""
        base, vgate = self.tmp_path("keeper"), self.tmp_path("vgate")
        ustarted, ugate = self.tmp_path("ustarted"), self.tmp_path("ugate")
        spec = {"name": "keeper", "preemptible": True, "timeout_s": timeout_s,
                "shell": keeper(base, vgate, on_term=on_term)}
        spec.update(victim_spec or {})
        victim = self.d.submit(spec)["ids"][0]
        wait_until(lambda: os.path.exists(base + ".token"), what="the keeper to start")
        uspec = {"name": "urgent", "priority": 10, "shell": waiter(ustarted, ugate)}
        uspec.update(urgent_spec or {})
        urgent = self.d.submit(uspec)["ids"][0]
        wait_until(lambda: os.path.exists(ustarted), what="the urgent job to start beside the frozen keeper")
        wait_until(lambda: self.frozen(victim), what="the keeper's cgroup to be frozen")
        return victim, urgent, base, vgate, ugate

    def test_an_urgent_cpu_job_freezes_a_low_job_which_goes_on_where_it_was_once_it_has_ended(self):
        victim, urgent, base, vgate, ugate = self.start_pair()
        job = self.d.show(victim)["job"]
        self.assertEqual((job["state"], job["suspended_for"], job["suspensions"]),
                         ("running", f"job {urgent} (urgent)", 1))
        status = self.d.ok("status")
        self.assertRegex(status, rf"(?m)^{victim}\s+keeper\s+suspended\s.*frozen for job {urgent} \(urgent\)")
        self.assertIn(f"frozen now for job {urgent} (urgent)", self.d.ok("show", str(victim)))
        # Frozen, it cannot see its gate: it ends only after the urgent job, once thawed.
        open(vgate, "w").close()
        open(ugate, "w").close()
        done = self.d.wait([victim, urgent])
        self.assertEqual(done[urgent]["state"], "succeeded", done[urgent]["reason"])
        self.assertEqual(done[victim]["state"], "succeeded", done[victim]["reason"])
        self.assertGreaterEqual(done[victim]["ended_at"], done[urgent]["ended_at"])
        # The same process, memory and all: the token it held, attempt 1, nothing preempted.
        with open(base + ".token") as f:
            self.assertEqual(done[victim]["result"], {"token": f.read().strip()})
        self.assertEqual((done[victim]["attempt"], done[victim]["preemptions"], done[victim]["suspensions"]),
                         (1, 0, 1))
        self.assertEqual(done[victim]["suspended_for"], "")
        self.assertIn("preempt:   preemptible; suspended 1 time", self.d.ok("show", str(victim)))

    def test_a_frozen_jobs_timeout_clock_stands_still(self):
        # Frozen twice as long as its timeout: the time it stood frozen does not count.
        victim, urgent, _, vgate, ugate = self.start_pair(timeout_s=8)
        frozen_at = time.monotonic()
        while time.monotonic() - frozen_at < 14:
            self.assertEqual(self.d.show(victim)["job"]["state"], "running")
            time.sleep(0.5)
        self.assertTrue(self.frozen(victim))
        open(vgate, "w").close()
        open(ugate, "w").close()
        done = self.d.wait([victim, urgent])
        self.assertEqual(done[victim]["state"], "succeeded", done[victim]["reason"])

    def test_a_job_frozen_in_its_timeouts_grace_gets_the_whole_grace_after_its_thaw(self):
        # Its own timeout began its teardown (gpuqd does not know): frozen then, its grace stands
        # still, and once thawed its SIGTERM handler finishes within it.
        base, vgate, termed, saved = (self.tmp_path(n) for n in ("keeper", "vgate", "termed", "saved"))
        ustarted, ugate = self.tmp_path("ustarted"), self.tmp_path("ugate")
        handler = f"touch {termed}; while [ ! -e {vgate} ]; do sleep 0.05; done; touch {saved}; exit 0"
        victim = self.d.submit({"name": "keeper", "preemptible": True, "timeout_s": 1,
                                "shell": keeper(base, self.tmp_path("never"), on_term=handler)})["ids"][0]
        wait_until(lambda: os.path.exists(termed), what="the keeper's timeout to send its SIGTERM")
        urgent = self.d.submit({"name": "urgent", "priority": 10, "shell": waiter(ustarted, ugate)})["ids"][0]
        wait_until(lambda: os.path.exists(ustarted) and self.frozen(victim), what="the keeper to be frozen")
        frozen_at = time.monotonic()
        while time.monotonic() - frozen_at < 5:  # past its grace (gpuqd's --grace 2), frozen
            time.sleep(0.25)
        self.assertTrue(self.frozen(victim))
        open(vgate, "w").close()
        open(ugate, "w").close()
        done = self.d.wait([victim, urgent])
        self.assertEqual(done[victim]["state"], "timed_out", done[victim]["reason"])
        self.assertTrue(os.path.exists(saved), "its handler was killed: its grace ran out while it was frozen")

    def test_a_frozen_job_cancelled_is_thawed_first_and_handles_its_signal(self):
        termed = self.tmp_path("termed")
        victim, urgent, _, _, ugate = self.start_pair(on_term=f"touch {termed}; exit 0")
        self.d.ok("cancel", str(victim))
        done = self.d.wait([victim])[victim]
        self.assertEqual(done["state"], "cancelled", done["reason"])
        self.assertTrue(os.path.exists(termed), "its SIGTERM handler never ran: it was killed frozen")
        self.assertEqual(self.d.show(urgent)["job"]["state"], "running")  # the urgent job runs on
        open(ugate, "w").close()
        self.assertEqual(self.d.wait([urgent])[urgent]["state"], "succeeded")

    def test_gpuqd_killed_mid_suspension_keeps_it_and_thaws_it_once_the_urgent_job_has_ended(self):
        victim, urgent, base, vgate, ugate = self.start_pair()
        # A restart while the urgent job runs: the keeper stays frozen, and says so.
        self.d.kill9()
        self.d.start()
        job = self.d.show(victim)["job"]
        self.assertEqual((job["state"], job["suspended_for"]), ("running", f"job {urgent} (urgent)"))
        self.assertTrue(self.frozen(victim))
        # The urgent job ends while no gpuqd runs: the next one thaws the keeper.
        self.d.kill9()
        open(ugate, "w").close()
        urgent_exit = os.path.join(self.d.state, "jobs", str(urgent), "attempt-1", "exit.json")
        wait_until(lambda: os.path.exists(urgent_exit), what="the urgent job to end while no gpuqd runs")
        self.assertTrue(self.frozen(victim))
        open(vgate, "w").close()
        self.d.start()
        done = self.d.wait([victim, urgent])
        self.assertEqual(done[urgent]["state"], "succeeded", done[urgent]["reason"])
        self.assertEqual(done[victim]["state"], "succeeded", done[victim]["reason"])
        with open(base + ".token") as f:
            self.assertEqual(done[victim]["result"], {"token": f.read().strip()})
        self.assertEqual((done[victim]["attempt"], done[victim]["suspensions"]), (1, 1))

    def test_a_job_that_may_only_be_requeued_is_not_frozen_and_the_urgent_job_waits(self):
        base, vgate = self.tmp_path("keeper"), self.tmp_path("vgate")
        victim = self.d.submit({"name": "keeper", "preemptible": True, "preempt_mode": "requeue",
                                "timeout_s": 300, "shell": keeper(base, vgate)})["ids"][0]
        wait_until(lambda: os.path.exists(base + ".token"), what="the keeper to start")
        urgent = self.d.submit({"name": "urgent", "priority": 10, "command": ["true"]})["ids"][0]
        wait_until(lambda: "waiting for 1 CPU slot" in self.d.show(urgent)["job"]["reason"],
                   what="the urgent job to wait for a CPU slot")
        self.assertFalse(self.frozen(victim))
        self.assertIn(f"not to be frozen for it: job {victim} (keeper): cannot be frozen (preempt_mode requeue",
                      self.d.ok("why", str(urgent)))
        open(vgate, "w").close()
        done = self.d.wait([victim, urgent])
        self.assertEqual((done[victim]["state"], done[victim]["suspensions"]), ("succeeded", 0))
        self.assertEqual(done[urgent]["state"], "succeeded")

    def test_a_shared_gpu_job_runs_beside_a_frozen_job_whose_memory_stays_on_the_gpu(self):
        # The low job holds the one GPU whole, saying it uses 20 GiB of its 80: the urgent job,
        # which says 30 GiB, fits beside it frozen.
        victim, urgent, base, vgate, ugate = self.start_pair(
            victim_spec={"gpus": 1, "gpu_memory_mb": 20480},
            urgent_spec={"gpus": 1, "shared": True, "gpu_memory_mb": 30720})
        job = self.d.show(urgent)["job"]
        self.assertEqual((job["state"], job["gpus"]), ("running", [0]))
        self.assertEqual(self.d.show(victim)["job"]["suspended_for"], f"job {urgent} (urgent)")
        open(vgate, "w").close()
        open(ugate, "w").close()
        done = self.d.wait([victim, urgent])
        self.assertEqual(done[victim]["state"], "succeeded", done[victim]["reason"])
        self.assertGreaterEqual(done[victim]["ended_at"], done[urgent]["ended_at"])
        with open(base + ".token") as f:
            self.assertEqual(done[victim]["result"], {"token": f.read().strip()})
        self.assertEqual((done[victim]["attempt"], done[victim]["preemptions"]), (1, 0))

    def test_a_job_running_on_a_frozen_jobs_slot_is_not_frozen_in_turn(self):
        # Frozen in turn, it could end (cancelled) while a third job ran on the first one's slot,
        # and the first would be thawed under it: two jobs on one slot.
        victim, borrower, _, vgate, bgate = self.start_pair(urgent_spec={"priority": 5, "preemptible": True})
        started3, gate3 = self.tmp_path("started3"), self.tmp_path("gate3")
        third = self.d.submit({"name": "third", "priority": 10, "shell": waiter(started3, gate3)})["ids"][0]
        wait_until(lambda: "not to be frozen for it" in self.d.ok("why", str(third)),
                   what="the third job to say why nothing is frozen for it")
        self.assertIn(f"job {borrower} (urgent): it runs on what a frozen job lends", self.d.ok("why", str(third)))
        self.assertEqual(self.d.show(third)["job"]["state"], "queued")
        for gate in (vgate, bgate, gate3):
            open(gate, "w").close()
        done = self.d.wait([victim, borrower, third])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        self.assertEqual(done[borrower]["suspensions"], 0)

    def test_a_borrower_keeps_to_its_batchs_limit(self):
        self.d.stop()
        self.d.extra[self.d.extra.index("--cpu-slots") + 1] = "2"
        self.d.start()
        keepers = []
        for n in range(2):
            base = self.tmp_path(f"keeper{n}")
            keepers.append((self.d.submit({"name": f"keeper{n}", "preemptible": True, "timeout_s": 300,
                                           "shell": keeper(base, self.tmp_path("vgate"))})["ids"][0], base))
        for _, base in keepers:
            wait_until(lambda: os.path.exists(base + ".token"), what="the keepers to start")
        started = [self.tmp_path(f"u{n}") for n in range(2)]
        gate = self.tmp_path("ugate")
        # Two urgent jobs in one batch that runs one at a time, and a GPU job of it behind them:
        # the pass looks past both, starts it, and then both are listed for a suspension.
        batch = self.d.submit([{"name": f"u{n}", "priority": 10, "shell": waiter(started[n], gate)} for n in range(2)]
                              + [{"name": "gpu", "gpus": 1, "command": ["true"]}], "--max-running", "1")["ids"]
        wait_until(lambda: any(os.path.exists(s) for s in started), what="one urgent job to start")
        self.assertEqual(self.d.wait([batch[2]])[batch[2]]["state"], "succeeded")
        states = [self.d.show(i)["job"]["state"] for i in batch[:2]]
        self.assertEqual(sorted(states), ["queued", "running"])
        frozen = [k for k, _ in keepers if self.frozen(k)]
        self.assertEqual(len(frozen), 1)
        open(gate, "w").close()
        open(self.tmp_path("vgate"), "w").close()
        done = self.d.wait([k for k, _ in keepers] + batch[:2])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})


class NvmlSuspension(DaemonTest):
    """What a frozen job keeps on its GPU is what NVML saw its processes hold (tests/fake_nvml, one
    80 GiB GPU): a shared job that fits beside that runs beside it frozen; one that does not, does not."""
    GPU = "GPU-11111111-aaaa H100-SXM 81559 0 0 1a 0 0 0 -"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.devices = self.tmp_path("nvml-devices")
        self.set_procs("-")
        env = dict(os.environ, LD_LIBRARY_PATH=FAKE_NVML_DIR, GPUQ_FAKE_NVML=self.devices)
        self.d = Daemon(self.tmp, "nvml", extra=["--gpu-process-interval", "0.1"], env=env).start()
        skip_without_freezer(self)

    def set_procs(self, procs):
        with open(self.devices + ".new", "w") as f:
            f.write(f"{self.GPU} {procs}\n")
        os.replace(self.devices + ".new", self.devices)

    def frozen(self, job):
        return attempt_frozen(self.d, job)

    def low_job_holding(self, mib, mode="auto"):
        """A preemptible job holding the GPU whole, its spec naming no memory, whose process NVML
        shows holding `mib`; once gpuqd has seen it."""
        base, gate = self.tmp_path("keeper"), self.tmp_path("vgate")
        victim = self.d.submit({"name": "keeper", "gpus": 1, "preemptible": True, "preempt_mode": mode,
                                "timeout_s": 300, "shell": keeper(base, gate)})["ids"][0]
        wait_until(lambda: os.path.exists(base + ".token"), what="the keeper to start")
        with open(base + ".pid") as f:
            self.set_procs(f"{f.read().strip()}:{mib}")
        wait_until(lambda: self.d.show(victim)["job"]["gpu_memory_peak_mb"] == mib, what="gpuqd to see its memory")
        return victim, base, gate

    def test_a_shared_job_runs_beside_what_the_frozen_job_holds(self):
        victim, base, vgate = self.low_job_holding(20000)
        started, ugate = self.tmp_path("ustarted"), self.tmp_path("ugate")
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "shared": True, "gpu_memory_mb": 30000, "priority": 10,
                                "shell": waiter(started, ugate)})["ids"][0]
        wait_until(lambda: os.path.exists(started), what="the urgent job to start beside the frozen one")
        self.assertTrue(self.frozen(victim))
        self.assertEqual(self.d.show(victim)["job"]["suspended_for"], f"job {urgent} (urgent)")
        open(vgate, "w").close()
        open(ugate, "w").close()
        done = self.d.wait([victim, urgent])
        self.assertEqual(done[victim]["state"], "succeeded", done[victim]["reason"])
        with open(base + ".token") as f:
            self.assertEqual(done[victim]["result"], {"token": f.read().strip()})
        self.assertEqual((done[victim]["attempt"], done[victim]["suspensions"]), (1, 1))

    def test_a_shared_job_that_does_not_fit_beside_it_is_not_started(self):
        # 60000 of 81559 MiB held: 30000 more do not fit, frozen or not. A job only ever frozen
        # (preempt_mode suspend) is not requeued for it either: the urgent job waits.
        victim, _, vgate = self.low_job_holding(60000, mode="suspend")
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "shared": True, "gpu_memory_mb": 30000, "priority": 10,
                                "command": ["true"]})["ids"][0]
        wait_until(lambda: "waiting for 1 GPU" in self.d.show(urgent)["job"]["reason"], what="the urgent job to wait")
        self.assertFalse(self.frozen(victim))
        self.assertEqual(self.d.show(victim)["job"]["suspensions"], 0)
        # Its process ends and the driver lists it no more: a PID still listed once its job has
        # ended is memory held outside gpuq, and the urgent job would wait on it for good.
        self.set_procs("-")
        open(vgate, "w").close()
        done = self.d.wait([victim, urgent])
        self.assertEqual((done[victim]["state"], done[urgent]["state"]), ("succeeded", "succeeded"))

