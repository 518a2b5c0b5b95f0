"""docs/cookbook.md, run as written: every `sh` block in order in one shell against a real gpuqd
(four fake GPUs, so the jobs train on the CPU), and every `json` block compared with the job
file it names."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import BIN, REPO, Daemon, DaemonTest

COOKBOOK = os.path.join(REPO, "docs/cookbook.md")
FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
PYTHON = os.environ.get("GPUQ_TEST_PYTHON", "/usr/bin/python3")


def blocks(path):
    """(language, text, the last non-empty line before the block) for each fenced block."""
    with open(path) as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w+)$", lines[i])
        if m:
            end = lines.index("```", i + 1)
            before = next((l for l in reversed(lines[:i]) if l.strip()), "")
            out.append((m.group(1), "\n".join(lines[i + 1:end]), before))
            i = end
        i += 1
    return out


class Cookbook(DaemonTest):
    def check_config(self, config):
        """A configuration file of the cookbook: gpuqd starts with it, and its hook is valid shell."""
        hook = config["on_finish"]
        self.assertEqual(hook[:2], ["sh", "-c"])
        r = subprocess.run(["sh", "-n", "-c", hook[2]], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, (hook, r.stderr))
        tmp = tempfile.mkdtemp(prefix="gpuq-it-cfg-", dir=self.tmp)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f)
        d = Daemon(tmp, env=dict(os.environ, GPUQ_CONFIG=os.path.join(tmp, "config.json"))).start()
        d.stop()

    def test_json_blocks_are_the_job_files(self):
        checked = 0
        for lang, text, before in blocks(COOKBOOK):
            if lang != "json":
                continue
            if before.endswith("`~/.config/gpuq/config.json`:"):
                self.check_config(json.loads(text))
                continue
            m = re.match(r"^`(jobs/cookbook/[\w.-]+\.json)`:$", before)
            self.assertTrue(m, f"a json block that names no job file: {before}")
            with open(os.path.join(REPO, m.group(1))) as f:
                self.assertEqual(json.loads(text), json.load(f), m.group(1))
            checked += 1
        self.assertEqual(checked, 5)
        # Every job file of the cookbook is valid as it stands (a build without LibTorch checks the
        # specs, then refuses train jobs for want of gpuq-worker)
        has_worker = os.path.exists(os.path.join(BIN, "gpuq-worker"))
        for name in sorted(os.listdir(os.path.join(REPO, "jobs/cookbook"))):
            r = self.d.run("submit", os.path.join(REPO, "jobs/cookbook", name), "--json")
            if r.returncode != 0 and not has_worker:
                self.assertIn("needs gpuq-worker, which this gpuqd was built without", r.stderr, name)
                self.assertNotIn("invalid job spec", r.stderr, name)
                continue
            self.assertEqual(r.returncode, 0, (name, r.stderr))
            self.d.ok("cancel", *map(str, json.loads(r.stdout)["ids"]))

    @unittest.skipUnless(os.path.exists(FASHION), "needs dataset-fashion-mnist")
    @unittest.skipUnless(shutil.which("jq"), "needs jq")
    @unittest.skipUnless(os.path.exists(os.path.join(BIN, "gpuq-worker")), "needs gpuq-worker (LibTorch)")
    def test_every_recipe_runs_as_written(self):
        script = "\n".join(text for lang, text, _ in blocks(COOKBOOK) if lang == "sh")
        work = self.tmp_path("cookbook")
        os.makedirs(work)
        os.symlink(os.path.join(REPO, "jobs"), os.path.join(work, "jobs"))  # the files' relative paths
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket,
                   PATH=":".join([BIN, os.path.dirname(PYTHON), os.environ["PATH"]]))
        r = subprocess.run(["bash", "-c", "set -euo pipefail -x\n" + script], cwd=work, env=env,
                           capture_output=True, text=True, timeout=840)
        self.assertEqual(r.returncode, 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        out = r.stdout
        self.assertIn("already running", out)  # `gpuq daemon start` found the test's daemon
        self.assertRegex(out, r"fashion-mlp +succeeded")
        self.assertRegex(out, r"synthetic-mlp +succeeded")
        self.assertRegex(out, r"\[rank 1\] rank 1 epoch 2: loss")  # logs -f of the ddp gang
        self.assertRegex(out, r"world_size: 2")
        self.assertRegex(out, r"split-mlp +succeeded")
        self.assertRegex(out, r"hybrid-mlp +succeeded")
        # The sweep's results table, best first, its labels (the matrix's values) as columns.
        best = re.findall(r"^\d+ +sweep-\S+ +succeeded +(0\.\d+|1) +(0\.3|0\.1|0\.03) +(\[[0-9,]+\])$", out, re.M)
        self.assertEqual(len(best), 12, out)
        accuracies = [float(b[0]) for b in best]
        self.assertEqual(accuracies, sorted(accuracies, reverse=True))
        self.assertGreater(accuracies[0], 0.7)
        for picture in ("two-datasets.png", "script.svg"):
            self.assertGreater(os.path.getsize(os.path.join(work, picture)), 5000, picture)
        status = json.loads(self.d.ok("status", "--all", "--json"))
        finished = [j for j in status["jobs"] if j["state"] == "succeeded"]
        self.assertEqual(len(finished), 2 + 1 + 2 + 12 + 1 + 1)
        # The torchrun script as `gpuq run`, its results read from what it printed.
        self.assertRegex(out, r"script-run +succeeded +[0-9.e-]+ +[0-9.]+\n")


if __name__ == "__main__":
    unittest.main()
