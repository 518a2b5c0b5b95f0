"""Progress and results from programs that do not write $GPUQ_EVENTS: a spec's `report`
(docs/job-spec.md), read by the job's supervisor from its output and from a file it leaves."""
import json
import os
import textwrap

from harness import DaemonTest, pids_matching, wait_until

# Prints as pytorch/examples' mnist/main.py does (its format strings), and nothing for gpuq.
MNIST_LIKE = r'''
import sys
lr = float(sys.argv[1])
for epoch in (1, 2):
    for batch in (0, 640):
        loss = 2.3 / (epoch + batch / 640) * (1 - lr)
        print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(epoch, batch, 60000, 100. * batch / 60000, loss))
    correct = 9000 + int(1000 * lr) + epoch
    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(0.1 / epoch - lr / 10, correct, 10000,
                                                                            100. * correct / 10000))
'''
PROGRESS = r"Train Epoch: (?P<epoch>\d+) \[(?P<step>\d+)/\d+ .*Loss: (?P<loss>[0-9.]+)"
RESULT = r"Test set: Average loss: (?P<test_loss>-?[0-9.]+), Accuracy: (?P<correct>\d+)/\d+ \((?P<test_accuracy>\d+)%\)"


class Report(DaemonTest):
    def setUp(self):
        super().setUp()
        with open(self.tmp_path("main.py"), "w") as f:
            f.write(MNIST_LIKE)

    def test_a_sweep_of_an_unmodified_script_gives_a_results_table(self):
        r = self.d.run("run", "--json", "--matrix", "lr=0.5,0.1,0.3", "--progress", PROGRESS, "--result", RESULT,
                       "--", "python3", "main.py", "{lr}")
        self.assertEqual(r.returncode, 0, r.stderr)
        ids = json.loads(r.stdout)["ids"]
        done = self.d.wait(ids)
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        results = {self.d.show(i)["job"]["labels"]["lr"]: self.d.json("result", str(i))["result"] for i in ids}
        # The last epoch's line wins; numbers stay numbers, the labels' too.
        self.assertEqual(results[0.1], {"test_loss": 0.04, "correct": 9102, "test_accuracy": 91})
        self.assertEqual(results[0.5], {"test_loss": 0.0, "correct": 9502, "test_accuracy": 95})
        progress = self.d.show(ids[0])["job"]["progress"]
        self.assertEqual((progress["epoch"], progress["step"]), (2, 640))
        self.assertIsInstance(progress["loss"], float)
        # The table of a sweep, a column per field, the labels among them; sorted by a field.
        table = self.d.ok("results", *map(str, ids), "-f", "test_accuracy,lr", "--sort", "test_accuracy", "-r")
        rows = [line.split() for line in table.splitlines()]
        self.assertEqual(rows[0][-2:], ["test_accuracy", "lr"])
        self.assertEqual([row[-2:] for row in rows[1:]], [["95", "0.5"], ["93", "0.3"], ["91", "0.1"]])
        by_lr = self.d.json("results", *map(str, ids), "--sort", "lr")["jobs"]
        self.assertEqual([j["labels"]["lr"] for j in by_lr], [0.1, 0.3, 0.5])
        self.assertIn("lr", self.d.ok("results", *map(str, ids)).splitlines()[0])  # a column by default
        # The output itself is untouched.
        lr01 = next(i for i in ids if self.d.show(i)["job"]["labels"]["lr"] == 0.1)
        self.assertIn("Test set: Average loss: 0.0400, Accuracy: 9102/10000 (91%)", self.d.ok("logs", str(lr01)))

    def test_a_results_file_is_read_when_the_job_ends_and_the_jobs_own_events_still_count(self):
        script = ("import json, os; "
                  "open(os.environ['GPUQ_EVENTS'], 'a').write(json.dumps({'type': 'result', 'own': 1}) + '\\n'); "
                  "print('acc=0.75'); json.dump({'f1': 0.5, 'name': 'x'}, open('out/metrics.json', 'w'))")
        os.mkdir(self.tmp_path("out"))
        job = self.d.submit({"name": "f", "command": ["python3", "-c", script], "cwd": self.tmp,
                             "report": {"result": [r"acc=(?P<acc>[0-9.]+)"], "file": "out/metrics.json"}})["ids"][0]
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
        self.assertEqual(self.d.json("result", str(job))["result"], {"own": 1, "acc": 0.75, "f1": 0.5, "name": "x"})

    def test_a_job_writing_its_own_events_in_pieces_loses_no_line_to_the_reports(self):
        # The job's own result line is written in two pieces; between them its output makes the
        # supervisor write a result of its own. Once both went into $GPUQ_EVENTS, the supervisor's
        # line landed inside the job's and both were lost (two bad lines, neither result).
        script = textwrap.dedent('''
            import os, time
            events = os.environ["GPUQ_EVENTS"]
            with open(events, "a") as f:
                f.write('{"type": "result", "own":')
                f.flush()
                print("acc=0.5", flush=True)
                # The supervisor has written its line when it shows, beside this file or in it.
                report = os.path.join(os.path.dirname(events), "report-0.jsonl")
                deadline = time.time() + 60
                while time.time() < deadline and not (os.path.exists(report) and os.path.getsize(report) > 0) \\
                        and os.path.getsize(events) <= len('{"type": "result", "own":'):
                    time.sleep(0.02)
                f.write(' 1}\\n')
            ''')
        job = self.d.submit({"name": "pieces", "command": ["python3", "-c", script],
                             "report": {"result": [r"^acc=(?P<acc>[0-9.]+)$"]}})["ids"][0]
        done = self.d.wait([job])[job]
        self.assertEqual(done["state"], "succeeded", done["reason"])
        self.assertEqual(done["bad_event_lines"], 0, done["first_bad_event"])
        self.assertEqual(done["result"], {"own": 1, "acc": 0.5})

    def test_a_restarted_gpuqd_reads_on_from_where_it_was_in_the_reports_events(self):
        # The report's events are read from their own offset, kept in the store as a rank's are: a
        # gpuqd killed and started again mid-job takes no event twice.
        gate = self.tmp_path("gate")
        script = f"print('step=1', flush=True)\nimport os, time\nwhile not os.path.exists({gate!r}): time.sleep(0.02)\nprint('step=2')"
        job = self.d.submit({"name": "restarted", "command": ["python3", "-c", script],
                             "report": {"progress": [r"^step=(?P<step>\d+)$"]}})["ids"][0]
        wait_until(lambda: (self.d.show(job)["job"]["progress"] or {}).get("step") == 1, what="the first step")
        self.d.kill9()
        self.d.start()
        open(gate, "w").close()
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
        steps = [e["data"]["step"] for e in self.d.request({"cmd": "events", "id": job})["events"]]
        self.assertEqual(steps, [1, 2])

    def test_a_results_file_that_is_missing_or_not_an_object_is_said_in_the_log(self):
        link = self.tmp_path("secret.json")
        with open(link, "w") as f:
            json.dump({"stolen": 1}, f)
        cases = [("missing.json", "true"), ("list.json", "echo '[1]' > list.json"),
                 ("link.json", f"ln -s {link} link.json")]
        ids = []
        for name, shell in cases:
            ids.append(self.d.submit({"name": "r", "shell": shell, "cwd": self.tmp, "report": {"file": name}})["ids"][0])
        self.d.wait(ids)
        for i, (name, _) in zip(ids, cases):
            self.assertIsNone(self.d.json("result", str(i))["result"], name)
            self.assertIn("gpuq: no result from its results file " + name, self.d.ok("logs", str(i)))

    def test_bad_patterns_are_refused_when_submitted_naming_each(self):
        # The spec's own problems and what RE2 makes of its patterns (gpuqd compiles each as the
        # supervisor will) come in one answer.
        r = self.d.run("submit", "-", input=json.dumps({
            "command": ["true"],
            "report": {"progress": ["(?P<x>1", "no group"], "result": ["(?P<type>x)"], "rank": 3, "extra": 1}}))
        self.assertNotEqual(r.returncode, 0)
        for said in ["`report.progress[1]` has no named group", "`report.extra` is not one of report's",
                     "`report.rank` is 3, and the job has 1 rank",
                     "`report.progress[0]` is not a pattern gpuq can use: missing ): (?P<x>1"]:
            self.assertIn(said, r.stderr)
        r = self.d.run("submit", "-", input=json.dumps(
            {"command": ["true"], "report": {"progress": ["(?P<x>1"], "result": ["(?P<type>x)"]}}))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("`report.progress[0]` is not a pattern gpuq can use: missing ): (?P<x>1", r.stderr)
        self.assertIn("`report.result[0]` is not a pattern gpuq can use: a group named `type`", r.stderr)
        self.assertEqual(self.d.json("status", "--all")["jobs"], [])

    def test_a_flood_of_output_and_lines_past_the_bound_cost_the_supervisor_one_look_each(self):
        # 200,000 lines, some 1 MB long with a match past the bound; the match of each short one counts.
        script = ("import sys\n"
                  "for i in range(200000): sys.stdout.write('x=%d\\n' % i)\n"
                  "sys.stdout.write('y' * 1000000 + ' x=-1\\n')\n")
        job = self.d.submit({"name": "flood", "command": ["python3", "-c", script],
                             "report": {"result": [r"^x=(?P<last>-?\d+)$"]}})["ids"][0]
        self.assertEqual(self.d.wait([job], timeout=300)[job]["state"], "succeeded")
        self.assertEqual(self.d.json("result", str(job))["result"], {"last": 199999})

    def test_a_writer_outside_the_job_holding_its_output_cannot_keep_the_attempt_from_ending(self):
        # Something outside the job's tree (here the test, through /proc/PID/fd/1, as any process
        # of the owner's may) writes into the reporting rank's output for ever: the supervisor's
        # last read of it stops, and the attempt ends.
        import threading
        import time
        go = self.tmp_path("go")
        job = self.d.submit({"name": "held", "shell": f"echo ready; while [ ! -e {go} ]; do sleep 0.05; done",
                             "report": {"result": [r"^n=(?P<n>\d+)$"]}})["ids"][0]
        wait_until(lambda: "ready" in self.d.ok("logs", str(job)), what="the job's first line")
        shells = [p for p in pids_matching(f"while \\[ ! -e {go} \\]")]
        self.assertTrue(shells)
        out = open(f"/proc/{shells[0]}/fd/1", "w")
        stop = threading.Event()

        def flood():
            i = 0
            while not stop.is_set():
                try:
                    out.write(f"n={i}\n")
                    out.flush()
                except OSError:
                    return
                i += 1
        writer = threading.Thread(target=flood)
        writer.start()
        try:
            started = time.monotonic()
            open(go, "w").close()
            done = self.d.wait([job], timeout=60)[job]
            self.assertEqual(done["state"], "succeeded")
            self.assertLess(time.monotonic() - started, 30)
            self.assertIsInstance(self.d.json("result", str(job))["result"]["n"], int)
        finally:
            stop.set()
            writer.join()
            try:
                out.close()
            except OSError:
                pass  # what it had buffered, after the job's end
