"""`gpuq run`: one command submitted without a spec file (docs/cli.md)."""
import json
import os
import signal
import subprocess

from harness import BIN, DaemonTest, wait_until

ECHO_ARGS = "import json, sys; print(json.dumps(sys.argv[1:]))"


class Run(DaemonTest):
    def gpuq(self, *args, **kw):
        return self.d.run(*args, **kw)

    def test_a_matrix_reaches_the_program_byte_for_byte_with_its_values_in_place(self):
        odd = ["a b", "it's", '"quoted"', '{"x": 1}', "{nokey}", "$HOME", "*", "--", "-c", "tab\there", "ünï"]
        r = self.gpuq("run", "--json", "--matrix", "lr=0.1,0.3", "--matrix", "seed=1,2", "--",
                      "python3", "-c", ECHO_ARGS, *odd, "--lr={lr}", "{seed}")
        self.assertEqual(r.returncode, 0, r.stderr)
        ids = json.loads(r.stdout)["ids"]
        self.assertEqual(len(ids), 4)
        done = self.d.wait(ids)
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"})
        seen = {}
        for i in ids:
            job = self.d.show(i)["job"]
            argv = json.loads(self.d.ok("logs", str(i)))
            self.assertEqual(argv[:len(odd)], odd)  # no shell in between: nothing expanded or split
            seen[(job["labels"]["lr"], job["labels"]["seed"])] = argv[len(odd):]
        self.assertEqual(seen, {(0.1, 1): ["--lr=0.1", "1"], (0.1, 2): ["--lr=0.1", "2"],
                                (0.3, 1): ["--lr=0.3", "1"], (0.3, 2): ["--lr=0.3", "2"]})
        names = sorted(self.d.show(i)["job"]["name"] for i in ids)
        self.assertEqual(names, ["python3-0.1-1", "python3-0.1-2", "python3-0.3-1", "python3-0.3-2"])

    def test_the_options_are_the_specs_fields(self):
        first = json.loads(self.gpuq("run", "--json", "--hold", "--", "true").stdout)["ids"][0]
        r = self.gpuq("run", "--json", "--name", "tuned", "--gpus", "2", "--cpus", "1", "--memory", "2G",
                      "--gpu-memory", "512", "--priority", "7", "--retries", "2", "--timeout", "90m",
                      "--env", "GREETING=hi there", "--label", "group=a", "--label", "seed=7", "--label", "lr=0.30", "--after", str(first), "--cwd", "/",
                      "--hold", "--shell", "--", "echo", "$GREETING", "from", "$(pwd)")
        self.assertEqual(r.returncode, 0, r.stderr)
        job_id = json.loads(r.stdout)["ids"][0]
        shown = self.d.show(job_id)
        job, spec = shown["job"], shown["spec"]
        self.assertEqual((job["name"], spec["gpus"], spec["cpus"], spec["memory_mb"], spec["gpu_memory_mb"]),
                         ("tuned", 2, 1, 2048, 512))
        self.assertEqual((spec["priority"], spec["retries"], spec["timeout_s"], spec["cwd"]), (7, 2, 5400, "/"))
        self.assertEqual((spec["env"], spec["labels"], spec["after"]), ({"GREETING": "hi there"}, {"group": "a", "seed": 7, "lr": "0.30"}, [first]))
        # A label is a number where its text reads back as that number (seed=7), else text (0.30).
        self.assertEqual(spec["shell"], "echo $GREETING from $(pwd)")
        self.d.ok("release", str(first), str(job_id))
        self.assertEqual(self.d.wait([first, job_id])[job_id]["state"], "succeeded")
        self.assertEqual(self.d.ok("logs", str(job_id)).strip(), "hi there from /")

    def test_follow_prints_the_output_and_exits_as_the_job_did(self):
        r = self.gpuq("run", "--follow", "--", "sh", "-c", "echo one; echo two; exit 3")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertTrue(r.stdout.startswith("one\ntwo\n"), r.stdout)
        self.assertIn("failed", r.stdout)
        self.assertNotIn("no log files", r.stderr)  # a running job's log may be still to come
        r = self.gpuq("run", "--wait", "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("succeeded", r.stdout)

    def test_ctrl_c_detaches_and_the_job_goes_on(self):
        release = self.tmp_path("release")
        p = subprocess.Popen([os.path.join(BIN, "gpuq"), "run", "--follow", "--", "sh", "-c",
                              f"echo started; while [ ! -e {release} ]; do sleep 0.05; done; echo released"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, GPUQ_SOCKET=self.d.socket))
        self.assertEqual(p.stdout.readline(), "started\n")  # following: its output came
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130)
        self.assertIn("detached; job 1 goes on (`gpuq wait 1` to wait again, `gpuq cancel 1` to stop it)", err)
        self.assertEqual(self.d.show(1)["job"]["state"], "running")
        open(release, "w").close()
        self.assertEqual(self.d.wait([1])[1]["state"], "succeeded")
        self.assertEqual(self.d.ok("logs", "1"), "started\nreleased\n")

    def test_dry_run_lists_the_jobs_and_submits_nothing(self):
        r = self.gpuq("run", "--dry-run", "--matrix", "n=1,2,3", "--", "echo", "{n}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("3 jobs; dry run, nothing submitted", r.stdout)
        self.assertIn("echo 3", r.stdout)
        self.assertEqual(self.d.json("status", "--all")["jobs"], [])

    def test_mistakes_are_named_and_submit_nothing(self):
        for args, said in [
            ((), "no command"),
            (("--bogus", "x"), "run has no option --bogus"),
            (("--memory", "lots", "--", "true"), "--memory lots is not a size"),
            (("--memory", "0x10", "--", "true"), "--memory 0x10 is not a size"),  # strtod's hex
            (("--memory", "-5G", "--", "true"), "--memory -5G is not a size"),
            (("--memory", "1e3", "--", "true"), "--memory 1e3 is not a size"),
            (("--memory", "inf", "--", "true"), "--memory inf is not a size"),
            (("--after", "+5", "--", "true"), "`after` names \"+5\", which is not a job in this batch"),
            (("--timeout", "soon", "--", "true"), "--timeout soon is not a duration"),
            (("--env", "NOVALUE", "--", "true"), "--env NOVALUE is not KEY=VALUE"),
            (("--matrix", "lr", "--", "true"), "--matrix lr is not KEY=V1,V2"),
            (("--matrix", "lr=1", "--", "true"), "field `matrix.lr` is used nowhere"),
            (("--follow", "--matrix", "n=1,2", "--", "echo", "{n}"), "--follow prints one job's output"),
        ]:
            r = self.gpuq("run", *args)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(said, r.stderr, args)
        self.assertEqual(self.d.json("status", "--all")["jobs"], [])
        # All of them at once, as a spec's problems are.
        r = self.gpuq("run", "--memory", "lots", "--timeout", "soon", "--env", "NOVALUE", "--", "true")
        self.assertEqual(r.returncode, 2, r.stderr)
        for said in ("3 problems with its options:", "--memory lots is not a size", "--timeout soon is not a duration",
                     "--env NOVALUE is not KEY=VALUE"):
            self.assertIn(said, r.stderr)
        # A size that is not a whole MiB is rounded up, as Slurm's --mem is (it was cut to 1).
        dry = json.loads(self.gpuq("run", "--json", "--dry-run", "--memory", "4097K", "--gpus", "1", "--gpu-memory", "1.5G",
                                   "--", "true").stdout)["jobs"][0]
        self.assertEqual((dry["memory_mb"], dry["gpu_memory_mb"]), (5, 1536))

    def test_a_program_may_take_options_that_look_like_runs_own(self):
        # Options end at the program's name: -c, --name and a later -- are the program's.
        r = self.gpuq("run", "--wait", "--json", "python3", "-c", ECHO_ARGS, "--name", "-g", "--", "x")
        self.assertEqual(r.returncode, 0, r.stderr)
        job_id = json.loads(r.stdout)["jobs"][0]["id"]
        self.assertEqual(json.loads(self.d.ok("logs", str(job_id))), ["--name", "-g", "--", "x"])
        self.assertEqual(self.d.show(job_id)["job"]["name"], "python3")
