"""Prometheus metrics (docs/monitoring.md): gpuqd --metrics-listen serves the text exposition
format, which Debian's promtool checks and a real Prometheus server scrapes (CI installs the
`prometheus` package and sets GPUQ_REQUIRE_PROMETHEUS=1, so neither is skipped there);
--metrics-textfile writes it for node_exporter; hostile HTTP clients do not disturb the unix
socket's clients."""
import json
import os
import pwd
import re
import resource
import shutil
import socket
import subprocess
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from harness import REPO, Daemon, DaemonTest, wait_until

REQUIRED = os.environ.get("GPUQ_REQUIRE_PROMETHEUS") == "1"


def tool(name):
    path = shutil.which(name)
    if not path and REQUIRED:
        raise AssertionError(f"{name} is not installed (GPUQ_REQUIRE_PROMETHEUS=1)")
    return path


def samples(text):
    """{(name, frozenset(labels)): value} from exposition text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)', line)
        assert m, f"not a sample line: {line!r}"
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def assert_closed_by_peer(test, s):
    """gpuqd closed `s` (end of file, or a reset for what it left unread), within 60 s."""
    s.settimeout(60)
    try:
        test.assertEqual(s.recv(1), b"")
    except ConnectionResetError:
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Metrics(DaemonTest):
    def setUp(self):
        super().setUp()
        self.d.stop()
        self.textfile = self.tmp_path("gpuq.prom")
        self.d = Daemon(self.tmp, "fake:2", extra=["--metrics-listen", "127.0.0.1:0",
                                                    "--metrics-textfile", self.textfile]).start()
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            self.port = int(re.findall(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", f.read())[-1])
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def scrape(self):
        with urllib.request.urlopen(self.url, timeout=30) as r:
            self.assertEqual(r.status, 200)
            self.assertEqual(r.headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
            return r.read().decode()

    def value(self, text, name, **labels):
        return samples(text).get((name, frozenset(labels.items())))

    def test_jobs_gpus_and_requests_are_counted_in_prometheus_format(self):
        go = self.tmp_path("go")
        ok, bad, flaky, held = self.d.submit([
            {"name": "ok", "command": ["true"]},
            {"name": "bad", "command": ["false"]},
            {"name": "flaky", "retries": 1, "shell": '[ "$GPUQ_ATTEMPT" = 2 ]'},
            {"name": "held", "gpus": 1, "shared": True, "gpu_memory_mb": 1000,
             "shell": f"while [ ! -e {go} ]; do sleep 0.05; done"}])["ids"]
        self.d.wait([ok, bad, flaky])
        wait_until(lambda: self.d.show(held)["job"]["state"] == "running", what="the GPU job to run")
        self.assertEqual(self.d.run("show", "999").returncode, 4)
        text = self.scrape()
        me = pwd.getpwuid(os.getuid()).pw_name
        self.assertEqual(self.value(text, "gpuq_jobs_finished_total", state="succeeded", user=me), 2)
        self.assertEqual(self.value(text, "gpuq_jobs_finished_total", state="failed", user=me), 1)
        self.assertEqual(self.value(text, "gpuq_jobs_finished_total", state="cancelled", user=me), 0)
        self.assertEqual(self.value(text, "gpuq_retries_total"), 1)
        self.assertEqual(self.value(text, "gpuq_attempts_started_total"), 5)
        self.assertEqual(self.value(text, "gpuq_attempt_run_seconds_count"), 4)  # the running one has not ended
        self.assertEqual(self.value(text, "gpuq_queue_wait_seconds_count"), 5)
        self.assertEqual(self.value(text, "gpuq_queue_wait_seconds_bucket", le="+Inf"), 5)
        user = self.d.json("show", str(held))["job"]["user"]
        self.assertEqual(self.value(text, "gpuq_jobs", state="running", user=user), 1)
        self.assertEqual(self.value(text, "gpuq_jobs", state="queued", user=user), 0)  # 0, not no sample
        gpu = self.d.json("gpus")["gpus"][self.d.show(held)["job"]["gpus"][0]]
        labels = {"gpu": str(gpu["index"]), "uuid": gpu["uuid"]}
        self.assertEqual(self.value(text, "gpuq_gpu_memory_allocated_bytes", **labels), 1000 * 2**20)
        self.assertEqual(self.value(text, "gpuq_gpu_jobs", **labels), 1)
        self.assertEqual(self.value(text, "gpuq_gpu_drained", **labels), 0)
        self.assertGreaterEqual(self.value(text, "gpuq_requests_total", command="submit"), 1)
        self.assertEqual(self.value(text, "gpuq_request_errors_total", command="show", code="not_found"), 1)
        self.assertGreater(self.value(text, "gpuq_store_bytes"), 0)
        self.assertGreater(self.value(text, "gpuq_schedule_pass_seconds_count"), 0)
        # A command no one knows is counted as "unknown", whatever its name: no new series.
        self.d.request({"cmd": "x" * 100})
        text = self.scrape()
        self.assertFalse(any("x" * 100 in line for line in text.splitlines()))
        wait_until(lambda: self.value(self.scrape(), "gpuq_request_errors_total", command="unknown",
                                      code="unknown_command") == 1, what="the unknown command counted")
        promtool = tool("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # The textfile: the same families, written whole, readable by node_exporter's user.
        wait_until(lambda: os.path.exists(self.textfile), what="the textfile")
        self.assertEqual(os.stat(self.textfile).st_mode & 0o777, 0o644)
        with open(self.textfile) as f:
            self.assertIn("# TYPE gpuq_jobs_finished_total counter", f.read())
        open(go, "w").close()
        self.d.wait([held])

    def test_the_grafana_dashboard_queries_only_series_gpuqd_serves_in_valid_promql(self):
        with open(os.path.join(REPO, "packaging", "grafana-dashboard.json")) as f:
            panels = json.load(f)["panels"]
        exprs = [t["expr"] for p in panels for t in p["targets"]]
        # A panel plots what its title names (one titled "... and jobs" plotted the drained flag).
        for p in panels:
            if p["title"].endswith("jobs"):
                self.assertTrue(any("_jobs" in t["expr"] for t in p["targets"]), p["title"])
        families = set(re.findall(r"^# TYPE (\S+) ", self.scrape(), re.M))
        for expr in exprs:
            for name in re.findall(r"\b(gpuq_[a-z_]+)", expr):
                self.assertIn(re.sub(r"_(bucket|sum|count)$", "", name), families, expr)
        promtool = tool("promtool")
        if promtool:  # each query as a recording rule: promtool parses the PromQL
            rules = self.tmp_path("rules.yml")
            with open(rules, "w") as f:
                f.write("groups:\n  - name: dashboard\n    rules:\n")
                for i, expr in enumerate(exprs):
                    f.write(f"      - record: gpuq:dashboard_{i}\n        expr: {json.dumps(expr.replace('$instance', '.*'))}\n")
            r = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_other_methods_paths_and_oversized_headers_are_refused(self):
        req = urllib.request.Request(self.url, method="POST", data=b"")
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        self.assertEqual(e.exception.code, 405)
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(self.url.replace("/metrics", "/admin"), timeout=30)
        self.assertEqual(e.exception.code, 404)
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            reply = b""
            try:
                # gpuqd answers 431 and closes once the header passes its limit, which may be before
                # the megabyte is all sent: the rest then meets a closed socket (EPIPE or a reset).
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            try:
                while chunk := s.recv(65536):
                    reply += chunk
            except ConnectionResetError:
                pass  # closed with the megabyte unread: refused either way
        self.assertTrue(reply == b"" or reply.startswith(b"HTTP/1.1 431"), reply[:100])

    def test_hostile_http_clients_do_not_disturb_the_socket_clients(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
        # A thousand connections, each sending half a request line and then nothing (slowloris).
        flood = []
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", self.port))
            s.sendall(b"GET /met")
            flood.append(s)
        try:
            # Meanwhile the unix socket serves as ever: a job submitted, run and waited for.
            job = self.d.submit({"name": "during", "command": ["true"]})["ids"][0]
            self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
            self.assertEqual(self.d.run("status").returncode, 0)
            # gpuqd closes the ones beyond its limit at once, and the rest when their time is up.
            for s in flood:
                assert_closed_by_peer(self, s)
        finally:
            for s in flood:
                s.close()
        self.assertIn("gpuq_build_info", self.scrape())  # and serves scrapes again


    def test_held_connections_keep_no_scrape_out_the_oldest_is_closed_for_a_new_one(self):
        # 200 connections that send half a request and hold it. gpuqd keeps 64 open; it used to
        # close each new one while 64 were held, so a loop reopening them refused every scrape.
        held = []
        try:
            for _ in range(200):
                s = socket.create_connection(("127.0.0.1", self.port))
                s.sendall(b"GET /met")
                held.append(s)
            # Connected after all of them (accepted in that order), the scrape closes the oldest.
            self.assertIn("gpuq_build_info", self.scrape())
            # The first ones were closed to make room, not left to their 5 s.
            for s in held[:100]:
                assert_closed_by_peer(self, s)
        finally:
            for s in held:
                s.close()


@unittest.skipUnless(REQUIRED or shutil.which("prometheus"), "Debian's prometheus package is not installed")
class PrometheusScrapes(DaemonTest):
    """A real Prometheus server scrapes gpuqd; its HTTP API has the series and values."""

    def test_prometheus_scrapes_gpuqd_and_answers_queries_on_its_series(self):
        self.d.stop()
        port = free_port()
        self.d = Daemon(self.tmp, "fake:2", extra=["--metrics-listen", f"127.0.0.1:{port}"]).start()
        config = self.tmp_path("prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n"
                    f"scrape_configs:\n  - job_name: gpuq\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        web = free_port()
        log = open(self.tmp_path("prometheus.log"), "wb")
        self.addCleanup(log.close)
        prom = subprocess.Popen([tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.tmp_path('tsdb')}",
                                 f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(prom.wait)
        self.addCleanup(prom.terminate)
        ids = self.d.submit([{"name": f"j{i}", "command": ["true"]} for i in range(3)] +
                            [{"name": "no", "command": ["false"]}])["ids"]
        self.d.wait(ids)

        def query(q):
            url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    body = json.load(r)
            except (urllib.error.URLError, ConnectionError):
                return None  # not up yet
            result = body["data"]["result"]
            return result[0]["value"][1] if result else None

        wait_until(lambda: query('gpuq_jobs_finished_total{state="succeeded"}') == "3", timeout=60,
                   what="Prometheus to have scraped the 3 successes")
        self.assertEqual(query('gpuq_jobs_finished_total{state="failed"}'), "1")
        self.assertEqual(query('up{job="gpuq"}'), "1")
        self.assertEqual(query('gpuq_attempts_started_total'), "4")
        self.assertEqual(query('count(gpuq_gpu_memory_total_bytes)'), "2")


if __name__ == "__main__":
    unittest.main()
