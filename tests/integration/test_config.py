"""The configuration file and environment defaults of gpuqd and gpuq:
built-in < ~/.config/gpuq/config.json (or $GPUQ_CONFIG) < environment < command line."""
import json
import os
import subprocess
import unittest

from harness import BIN, DaemonTest, wait_until


class Config(DaemonTest):
    def setUp(self):
        super().setUp()
        self.d.stop()  # these tests start their own daemons, configured through files and variables
        self.home = self.tmp_path("home")
        os.makedirs(os.path.join(self.home, ".config/gpuq"))
        self.socket = self.tmp_path("configured.sock")
        self.procs = []

    def tearDown(self):
        for p, log in self.procs:
            if p.poll() is None:
                p.terminate()
                p.wait(10)
            log.close()
        super().tearDown()

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if k != "GPUQ_CONFIG"}  # the default path, in our HOME
        env.update(HOME=self.home, XDG_CONFIG_HOME="", XDG_RUNTIME_DIR="", XDG_STATE_HOME="")
        env.update(extra)
        return env

    def write_config(self, settings):
        path = os.path.join(self.home, ".config/gpuq/config.json")
        with open(path, "w") as f:
            f.write(settings if isinstance(settings, str) else json.dumps(settings))
        return path

    def gpuq(self, *args, env=None):
        return subprocess.run([os.path.join(BIN, "gpuq"), *args], capture_output=True, text=True,
                              env=env or self.env(), timeout=60)

    def gpuqd(self, *args, env=None):
        log = open(self.tmp_path(f"gpuqd-{len(self.procs)}.log"), "w")
        p = subprocess.Popen([os.path.join(BIN, "gpuqd"), "--foreground", *args], env=env or self.env(),
                             stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((p, log))
        return p

    def test_file_then_environment_then_command_line(self):
        self.write_config({"socket": self.socket, "state_dir": "~/state", "gpus": "fake:3", "retries": 2,
                           "log_limit_mb": 5, "forget_after_s": 2592000})
        # The file alone: socket, state dir, GPUs and default retries come from it
        d = self.gpuqd()
        wait_until(lambda: self.gpuq("daemon", "status").returncode == 0, what="the configured gpuqd")
        status = json.loads(self.gpuq("daemon", "status", "--json").stdout)
        self.assertEqual(status["socket"], self.socket)
        self.assertEqual(status["state_dir"], os.path.join(self.home, "state"))
        self.assertEqual(len(json.loads(self.gpuq("gpus", "--json").stdout)["gpus"]), 3)
        r = subprocess.run([os.path.join(BIN, "gpuq"), "submit", "--json", "-"], text=True, capture_output=True,
                           input=json.dumps([{"name": "plain", "shell": "true"}, {"name": "own", "shell": "true", "retries": 0}]),
                           env=self.env(), timeout=30)
        submitted = json.loads(r.stdout)
        plain, own = submitted["ids"]
        self.assertEqual(json.loads(self.gpuq("show", str(plain), "--json").stdout)["job"]["retries"], 2)
        self.assertEqual(json.loads(self.gpuq("show", str(own), "--json").stdout)["job"]["retries"], 0)
        d.terminate()
        d.wait(10)

        # The environment over the file; the command line over both
        d = self.gpuqd(env=self.env(GPUQ_GPUS="fake:2"))
        wait_until(lambda: self.gpuq("daemon", "status").returncode == 0, what="gpuqd with $GPUQ_GPUS")
        self.assertEqual(len(json.loads(self.gpuq("gpus", "--json").stdout)["gpus"]), 2)
        d.terminate()
        d.wait(10)
        d = self.gpuqd("--gpus", "fake:1", env=self.env(GPUQ_GPUS="fake:2"))
        wait_until(lambda: self.gpuq("daemon", "status").returncode == 0, what="gpuqd with --gpus")
        self.assertEqual(len(json.loads(self.gpuq("gpus", "--json").stdout)["gpus"]), 1)

        # gpuq: $GPUQ_SOCKET over the file, --socket over both
        elsewhere = self.tmp_path("elsewhere.sock")
        r = self.gpuq("status", env=self.env(GPUQ_SOCKET=elsewhere))
        self.assertEqual(r.returncode, 3)
        self.assertIn(elsewhere, r.stderr)
        self.assertEqual(self.gpuq("--socket", self.socket, "status", env=self.env(GPUQ_SOCKET=elsewhere)).returncode, 0)

        # gpuq config names each setting's source
        shown = json.loads(self.gpuq("config", "--json", env=self.env(GPUQ_RETRIES="4")).stdout)
        self.assertEqual(shown["file"], os.path.join(self.home, ".config/gpuq/config.json"))
        self.assertTrue(shown["file_found"])
        self.assertEqual(shown["settings"]["retries"], {"value": 4, "from": "$GPUQ_RETRIES"})
        self.assertEqual(shown["settings"]["gpus"]["from"], shown["file"])
        self.assertEqual(shown["settings"]["forget_after_s"], {"value": 2592000, "from": shown["file"]})
        self.assertEqual(shown["settings"]["state_dir"]["value"], os.path.join(self.home, "state"))

    def test_gpuq_config_without_a_file_and_with_an_explicit_path(self):
        r = self.gpuq("config")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(not present)", r.stdout)
        other = self.tmp_path("other.json")
        with open(other, "w") as f:
            json.dump({"socket": self.socket}, f)
        shown = json.loads(self.gpuq("config", "--json", env=self.env(GPUQ_CONFIG=other)).stdout)
        self.assertEqual(shown["socket"], self.socket)
        self.assertEqual(shown["settings"]["socket"]["from"], other)
        # every key the file sets is shown, those gpuq config once left out among them
        with open(other, "w") as f:
            json.dump({"socket": self.socket, "on_finish": ["true"], "hook_timeout_s": 30,
                       "metrics_listen": "127.0.0.1:9400", "gpu_process_interval_s": 2}, f)
        shown = json.loads(self.gpuq("config", "--json", env=self.env(GPUQ_CONFIG=other)).stdout)["settings"]
        self.assertEqual({k: v["value"] for k, v in shown.items()},
                         {"socket": self.socket, "on_finish": ["true"], "hook_timeout_s": 30,
                          "metrics_listen": "127.0.0.1:9400", "gpu_process_interval_s": 2})

    def test_a_bad_file_or_variable_is_named_and_nothing_starts(self):
        cases = [
            ('{"sokcet": "/tmp/x"}', "unknown setting `sokcet`"),
            ('{"retries": -1}', "`retries` must be an integer from 0 to 100"),
            ('{"socket": "relative.sock"}', "`socket` must be an absolute path or start with ~/"),
            ('{"gpus": "fake:2",}', "the file is not valid JSON"),
            ('{"gpus": "fake:2"}\0junk', "the file contains a NUL byte (at byte 18)"),
            ('[1, 2]', "must be a JSON object of settings"),
        ]
        for text, message in cases:
            with self.subTest(text=text):
                path = self.write_config(text)
                for binary in ("gpuqd", "gpuq"):
                    args = ["--foreground"] if binary == "gpuqd" else ["status"]
                    r = subprocess.run([os.path.join(BIN, binary), *args], capture_output=True, text=True,
                                       env=self.env(), timeout=30)
                    self.assertEqual(r.returncode, 2, (binary, r.stderr))
                    self.assertIn(path + ": " + message, r.stderr)
        self.write_config("{}")
        r = subprocess.run([os.path.join(BIN, "gpuq"), "status"], capture_output=True, text=True,
                           env=self.env(GPUQ_LOG_LIMIT_MB="lots"), timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("$GPUQ_LOG_LIMIT_MB: must be an integer", r.stderr)
        # --help works whatever the file says
        self.write_config('{"nope": 1}')
        self.assertEqual(self.gpuq("--help").returncode, 0)

    def test_gpuqd_options_check_as_the_file_does_and_lab_settings_need_lab_mode(self):
        def gpuqd(*args):
            # Each of these is refused at once; one that starts instead would serve until killed.
            try:
                state = [] if "--state-dir" in args else ["--state-dir", self.tmp_path("state")]
                return subprocess.run([os.path.join(BIN, "gpuqd"), "--foreground", "--socket", self.socket,
                                       *state, *args],
                                      capture_output=True, text=True, env=self.env(), timeout=15)
            except subprocess.TimeoutExpired:
                self.fail(f"gpuqd {' '.join(args)} started instead of refusing")
        # an option takes what the key's rule takes, and says why not
        for args, message in [(["--grace", "-1"], "--grace: must be a number from 0 to 86400"),
                              (["--idle-timeout", "0"], "--idle-timeout: must be a number from 0.1 to 604800"),
                              (["--hang-after", "soon"], "--hang-after: soon is not a duration"),
                              (["--hang-action", "kill"], "--hang-action: must be \"flag\""),
                              (["--state-dir", "state"], "--state-dir: must be an absolute path"),
                              (["--grace", "0x10"], "--grace: must be a number"),
                              (["--forget-after", ""], '--forget-after: "" is not a duration'),
                              (["--multi-user=maybe"], "--multi-user: must be true or false")]:
            with self.subTest(args=args):
                r = gpuqd(*args)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn(message, r.stderr)
        self.assertFalse(os.path.exists(self.socket))
        # lab mode's settings, from the file or an option, are refused outside lab mode: saying so
        self.write_config({"user_limits": {"*": {"max_gpus": 1}}})
        for args in ([], ["--max-priority", "5"], ["--usage-half-life", "1d"], ["--admin-group", "root"]):
            with self.subTest(args=args):
                if args:
                    self.write_config("{}")
                r = gpuqd(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("are for lab mode (--multi-user)", r.stderr)
        self.assertFalse(os.path.exists(self.socket))
        # a flag given false overrides the file's true: no lab mode (which would need root's socket)
        self.write_config({"multi_user": True})
        d = self.gpuqd("--multi-user=false", "--socket", self.socket, "--state-dir", self.tmp_path("state"))
        wait_until(lambda: self.gpuq("--socket", self.socket, "daemon", "status").returncode == 0
                   or d.poll() is not None, what="gpuqd with --multi-user=false")
        hello = json.loads(self.gpuq("--socket", self.socket, "daemon", "status", "--json").stdout)
        self.assertFalse(hello.get("multi_user"), hello)
        d.terminate()
        d.wait(10)
        # gpuq daemon start hands gpuqd absolute paths, whatever it was given
        self.write_config("{}")
        r = subprocess.run([os.path.join(BIN, "gpuq"), "--socket", "rel.sock", "daemon", "start", "--state-dir",
                            "rel-state", "--gpus", "fake:1"], capture_output=True, text=True, env=self.env(),
                           cwd=self.tmp, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "rel.sock")))
        self.assertEqual(subprocess.run([os.path.join(BIN, "gpuq"), "--socket", "rel.sock", "daemon", "stop"],
                                        capture_output=True, text=True, env=self.env(), cwd=self.tmp,
                                        timeout=60).returncode, 0)
        # --help shows the value the file gives as the default
        self.write_config({"grace_s": 7, "gpus": "fake:5"})
        help_text = gpuqd("--help").stdout
        self.assertIn("[7]", help_text)
        self.assertIn("[fake:5]", help_text)


if __name__ == "__main__":
    unittest.main()
