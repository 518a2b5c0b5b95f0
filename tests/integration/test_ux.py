"""User-facing extras: bash completion (subcommands and options from gpuq's own --help, job ids
from the running daemon)."""
import os
import subprocess
import unittest

from harness import BIN, REPO, DaemonTest

COMPLETION = os.path.join(REPO, "packaging/gpuq.bash-completion")


class Completion(DaemonTest):
    def complete(self, *words):
        """What bash completion offers for the last of `words` (the word being typed)."""
        script = (f"source {COMPLETION}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
                  f"COMP_CWORD={len(words) - 1}; _gpuq; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        env = dict(os.environ, PATH=BIN + ":" + os.environ["PATH"], GPUQ_SOCKET=self.d.socket)
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return sorted(w for w in r.stdout.split("\n") if w)

    def test_subcommands_options_and_job_ids_complete(self):
        self.assertEqual(self.complete("gpuq", "ca"), ["cancel"])
        self.assertEqual(self.complete("gpuq", "res"), ["result", "results"])
        self.assertIn("wait", self.complete("gpuq", ""))
        self.assertEqual(self.complete("gpuq", "wait", "--ti"), ["--timeout"])
        self.assertEqual(self.complete("gpuq", "--socket", "x", "submit", "--wa"), ["--wait"])
        self.assertEqual(self.complete("gpuq", "daemon", "st"), ["start", "status", "stop"])
        ids = self.d.submit([{"name": f"j{i}", "shell": "sleep 30"} for i in range(3)])["ids"]
        self.assertEqual(self.complete("gpuq", "cancel", ""), sorted(str(i) for i in ids))
        self.assertEqual(self.complete("gpuq", "logs", str(ids[1])), [str(ids[1])])


if __name__ == "__main__":
    unittest.main()
