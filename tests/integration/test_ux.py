"""User-facing extras: bash completion (subcommands and options from gpuq's own --help, job ids
from the running daemon), training-curve pictures (`gpuq plot`), `logs -f` across retries and ranks."""
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import unittest
import xml.etree.ElementTree as ET
import zlib

from harness import BIN, REPO, DaemonTest, event_line, wait_until

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
        self.assertEqual(self.complete("gpuq", "res"), ["restart", "result", "results"])
        self.assertEqual(self.complete("gpuq", "restart", "--f"), ["--fresh"])
        self.assertIn("wait", self.complete("gpuq", ""))
        self.assertEqual(self.complete("gpuq", "SIG"), [])  # no word of a wrapped description ("...then SIGKILL")
        self.assertEqual(self.complete("gpuq", "wait", "--ti"), ["--timeout"])
        self.assertEqual(self.complete("gpuq", "--socket", "x", "submit", "--wa"), ["--wait"])
        self.assertEqual(self.complete("gpuq", "daemon", "st"), ["start", "status", "stop"])
        ids = self.d.submit([{"name": f"j{i}", "shell": "sleep 30"} for i in range(3)])["ids"]
        self.assertEqual(self.complete("gpuq", "cancel", ""), sorted(str(i) for i in ids))
        self.assertEqual(self.complete("gpuq", "logs", str(ids[1])), [str(ids[1])])
        self.assertEqual(self.complete("gpuq", "plot", ""), sorted(str(i) for i in ids))
        self.assertEqual(self.complete("gpuq", "restart", ""), sorted(str(i) for i in ids))
        self.assertEqual(self.complete("gpuq", "plot", "1", "--x", "e"), ["epoch"])
        self.assertIn("--output", self.complete("gpuq", "plot", "--"))
        self.assertEqual(self.complete("gpuq", "t"), ["top"])


def read_png(path):
    """(width, height, rows of (r, g, b) pixels) of an 8-bit RGB/RGBA PNG, decoded with zlib only."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def curve_job(name, epochs, steps):
    """A shell job reporting progress like a trainer: loss per step, test accuracy per epoch."""
    lines = []
    for e in range(1, epochs + 1):
        for s in range(1, steps + 1):
            step = (e - 1) * steps + s
            lines.append(event_line(type="progress", epoch=e, epochs=epochs, step=step,
                                    total_steps=epochs * steps, loss=round(2.0 / step, 4)))
        lines.append(event_line(type="progress", epoch=e, epochs=epochs, step=e * steps, total_steps=epochs * steps,
                                loss=round(2.0 / (e * steps), 4), test_accuracy=0.5 + 0.1 * e))
    return {"name": name, "shell": "; ".join(lines)}


class Plot(DaemonTest):
    BLUE, ORANGE = (0x4e, 0x79, 0xa7), (0xf2, 0x8e, 0x2b)  # the first two jobs' colours

    def setUp(self):
        super().setUp()
        self.ids = self.d.submit([curve_job("dataset-a", 3, 10), curve_job("dataset-b", 2, 25)])["ids"]
        self.d.wait(self.ids)

    def test_svg_has_one_curve_per_job_and_metric_with_every_point(self):
        out = self.tmp_path("curves.svg")
        r = self.d.ok("plot", *map(str, self.ids), "-o", out, "--json")
        self.assertEqual(json.loads(r)["x"], "epoch")
        ns = {"s": "http://www.w3.org/2000/svg"}
        root = ET.parse(out).getroot()
        series = {(int(p.get("data-job")), p.get("data-metric")): len(p.get("points").split())
                  for p in root.iter("{http://www.w3.org/2000/svg}polyline") if p.get("class") == "series"}
        a, b = self.ids
        # loss: every step plus the epoch-end events; test_accuracy: one point per epoch
        self.assertEqual(series, {(a, "loss"): 33, (a, "test_accuracy"): 3, (b, "loss"): 52, (b, "test_accuracy"): 2})
        texts = [t.text for t in root.findall(".//s:text", ns)]
        self.assertIn("loss", texts)
        self.assertIn("accuracy", texts)
        self.assertTrue(any("dataset-b" in (t or "") for t in texts))

    def test_png_is_a_real_picture_with_both_jobs_curves(self):
        out = self.tmp_path("curves.png")
        self.d.ok("plot", *map(str, self.ids), "-o", out, "--width", "900")
        width, height, rows = read_png(out)
        self.assertEqual(width, 900)
        self.assertGreater(height, 600)  # two panels: loss and accuracy

        def near(px, rgb):
            return all(abs(p - q) <= 24 for p, q in zip(px, rgb))
        blue = sum(near(px, self.BLUE) for row in rows for px in row)
        orange = sum(near(px, self.ORANGE) for row in rows for px in row)
        white = sum(px == (255, 255, 255) for row in rows for px in row)
        self.assertGreater(blue, 300, "job 1's curves are missing")
        self.assertGreater(orange, 300, "job 2's curves are missing")
        self.assertGreater(white, width * height // 2)  # a chart, not a smear

    def test_png_without_its_painter_is_a_clear_error_and_writes_nothing(self):
        lone = self.tmp_path("lone")
        os.mkdir(lone)
        shutil.copy(os.path.join(BIN, "gpuq"), lone)  # gpuq without gpuq-plot-png beside it
        out = self.tmp_path("none.png")
        r = subprocess.run([os.path.join(lone, "gpuq"), "--socket", self.d.socket, "plot", str(self.ids[0]), "-o", out],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(os.path.join(lone, "gpuq-plot-png"), r.stderr)
        self.assertIn("write .svg instead", r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_the_painter_refuses_a_bad_chart_document_and_says_why(self):
        painter = os.path.join(BIN, "gpuq-plot-png")
        out = self.tmp_path("bad.png")
        for doc, said in (("not json", "not JSON"), ('{"jobs": []}', "chart document"),
                          ('{"jobs": [], "title": "", "x": "epoch", "width": 100000, "panel_height": 320, '
                           '"log_y": false}', "out of range")):
            r = subprocess.run([painter, out], input=doc, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, doc)
            self.assertIn(said, r.stderr)
            self.assertFalse(os.path.exists(out))
        # What gpuq reports when the painter cannot write: the painter's own words
        r = self.d.run("plot", str(self.ids[0]), "-o", self.tmp_path("no/such/dir/x.png"))
        self.assertEqual(r.returncode, 4)
        self.assertIn("no/such/dir/x.png", r.stderr)

    def test_a_hostile_metric_name_and_overflowing_losses_still_make_a_well_formed_chart(self):
        bad = {"name": "blown", "shell": "; ".join([
            event_line(type="progress", step=1, loss=0.5, **{"x\uffff\u0001loss": 1.0}),
            event_line(type="progress", step=2, loss=-1e308, **{"x\uffff\u0001loss": 2.0}),
            event_line(type="progress", step=3, loss=1e308, **{"x\uffff\u0001loss": 3.0}),
            event_line(type="progress", step=4, loss=0.25, **{"x\uffff\u0001loss": 4.0})])}
        job = self.d.submit(bad)["ids"][0]
        self.d.wait([job])
        out = self.tmp_path("blown.svg")
        r = self.d.ok("plot", str(job), "-o", out, "--x", "step")
        self.assertIn("2 value(s) not drawn", r)
        root = ET.parse(out).getroot()  # expat refuses U+FFFF and C0 characters: this is the check
        series = {p.get("data-metric"): len(p.get("points").split())
                  for p in root.iter("{http://www.w3.org/2000/svg}polyline") if p.get("class") == "series"}
        self.assertEqual(series, {"loss": 2, "x\ufffd\ufffdloss": 4})
        with open(out, encoding="utf-8") as f:
            self.assertNotIn("nan", f.read())
        self.assertEqual(json.loads(self.d.ok("plot", str(job), "-o", out, "--json"))["skipped"], 2)
        png = self.tmp_path("blown.png")
        self.d.ok("plot", str(job), "-o", png)
        self.assertGreater(read_png(png)[0], 0)

    def test_metric_choice_step_axis_and_bad_requests(self):
        out = self.tmp_path("acc.svg")
        r = self.d.ok("plot", str(self.ids[0]), "-o", out, "--metric", "test_accuracy", "--x", "step")
        self.assertIn("1 curve(s) of 1 job(s) against step", r)
        r = self.d.run("plot", str(self.ids[0]), "-o", self.tmp_path("x.jpg"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("must end in .png or .svg", r.stderr)
        r = self.d.run("plot", str(self.ids[0]), "-o", out, "--metric", "nothing_like_this")
        self.assertEqual(r.returncode, 4)
        self.assertIn("no such fields", r.stderr)
        quiet = self.d.submit({"name": "quiet", "shell": "true"})["ids"][0]
        self.d.wait([quiet])
        r = self.d.run("plot", str(quiet), "-o", out)
        self.assertEqual(r.returncode, 4)
        self.assertIn(f"job {quiet} (quiet) has no progress events", r.stderr)
        r = self.d.run("plot", "999", "-o", out)
        self.assertEqual(r.returncode, 4)
        self.assertIn("no job 999", r.stderr)

    def test_events_request_pages_and_names_a_missing_attempt(self):
        a = self.ids[0]
        got, after = [], 0
        while True:
            r = self.d.request({"cmd": "events", "id": a, "type": "progress", "after": after, "page": 7})
            self.assertTrue(r["ok"], r)
            got += r["events"]
            if not r["more"]:
                break
            after = r["events"][-1]["seq"]
        self.assertEqual(len(got), 33)
        self.assertEqual([e["data"]["step"] for e in got[:3]], [1, 2, 3])
        r = self.d.request({"cmd": "events", "id": a, "attempt": 5})
        self.assertEqual(r["error"]["code"], "not_found")
        self.assertIn("no attempt 5", r["error"]["message"])
        r = self.d.request({"cmd": "events", "id": a, "type": "bogus"})
        self.assertEqual(r["error"]["code"], "bad_request")


class Lean(unittest.TestCase):
    def test_the_cli_links_no_graphics_library_cairo_is_loaded_by_the_painter_alone(self):
        libs = subprocess.run(["ldd", os.path.join(BIN, "gpuq")], capture_output=True, text=True, check=True).stdout
        names = [line.split()[0] for line in libs.splitlines() if line.strip()]
        self.assertEqual([n for n in names if re.search(r"cairo|X11|xcb|fontconfig|freetype|png|pixman", n)], [])


class FollowLogs(DaemonTest):
    def test_logs_follow_prints_every_rank_of_every_attempt_with_a_rank_prefix(self):
        # Two ranks; rank 0 fails the first attempt once both have printed, the retry succeeds.
        job = {"name": "flaky", "mode": "ddp", "ranks": 2, "retries": 1,
               "shell": 'echo "try $GPUQ_ATTEMPT rank $RANK"; sleep 1; echo "late $GPUQ_ATTEMPT rank $RANK"; '
                        'if [ "$RANK$GPUQ_ATTEMPT" = 01 ]; then sleep 0.5; exit 1; fi'}
        job_id = self.d.submit(job)["ids"][0]
        r = self.d.run("logs", "-f", str(job_id), timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        for attempt in (1, 2):
            for rank in (0, 1):
                self.assertIn(f"[rank {rank}] try {attempt} rank {rank}", lines)
                self.assertIn(f"[rank {rank}] late {attempt} rank {rank}", lines)
        self.assertEqual(len(lines), 8)
        self.assertEqual(self.d.show(job_id)["job"]["state"], "succeeded")
        # Without -f: the last attempt only; --rank picks one rank and drops the prefix
        r = self.d.ok("logs", str(job_id), "--rank", "1")
        self.assertEqual(r.splitlines(), ["try 2 rank 1", "late 2 rank 1"])


@unittest.skipUnless(shutil.which("jq"), "needs jq")
class JqOneLiners(DaemonTest):
    def test_every_jq_example_in_the_cli_docs_runs_and_prints_something(self):
        with open(os.path.join(REPO, "docs/cli.md")) as f:
            doc = f.read()
        block = doc.split("One-liners", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
        commands = [line for line in block.split("\n") if line.strip() and not line.startswith("#")]
        self.assertGreaterEqual(len(commands), 8)
        good = [dict(curve_job(f"good-{i}", 1, 3), shell=curve_job(f"good-{i}", 1, 3)["shell"] + "; " +
                     event_line(type="result", test_accuracy=0.8 + 0.1 * i)) for i in range(2)]
        batch = self.d.submit(good)
        bad = self.d.submit(dict(curve_job("bad", 1, 4), shell=curve_job("bad", 1, 4)["shell"] + "; exit 3"))["ids"][0]
        self.d.wait(batch["ids"] + [bad])
        env = dict(os.environ, GPUQ_SOCKET=self.d.socket, PATH=BIN + ":" + os.environ["PATH"],
                   batch=str(batch["batch"]), id=str(bad))
        for command in commands:
            with self.subTest(command=command):
                r = subprocess.run(["bash", "-c", "set -o pipefail; " + command], capture_output=True, text=True,
                                   env=env, timeout=30)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(r.stdout.strip(), "printed nothing")
                self.assertNotIn("null", r.stdout.split("\n")[0], r.stdout)


@unittest.skipUnless(shutil.which("tmux"), "needs tmux")
class Top(DaemonTest):
    """gpuq top in a real terminal: tmux runs it, the test reads the screen and presses q."""

    def setUp(self):
        super().setUp()
        self.server = f"gpuq-test-{os.getpid()}-{id(self)}"

    def tmux(self, *args):
        r = subprocess.run(["tmux", "-L", self.server, "-f", "/dev/null", *args], capture_output=True, text=True,
                           timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def screen(self):
        return self.tmux("capture-pane", "-p", "-t", "top")

    def tearDown(self):
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True)
        super().tearDown()

    def test_top_shows_gpus_and_jobs_live_and_quits_on_q(self):
        train = {"name": "trainer", "gpus": 1,
                 "shell": "; ".join(event_line(type="progress", epoch=1, epochs=4, step=s, total_steps=40, loss=1.0 / s)
                                    for s in range(1, 11)) + "; sleep 60"}
        ids = self.d.submit([train, {"name": "short", "gpus": 2, "shell": "sleep 2"}])["ids"]
        wait_until(lambda: self.d.show(ids[0])["job"]["progress"] is not None, what="progress")
        # A shell around gpuq records its exit status (tmux itself may be slow to reap a pane's process)
        status = self.tmp_path("top.status")
        self.tmux("new-session", "-d", "-s", "top", "-x", "150", "-y", "30",
                  f"env GPUQ_SOCKET={self.d.socket} {BIN}/gpuq top --interval 0.5; echo $? > {status}; sleep 60")
        wait_until(lambda: "short" in self.screen() and "trainer" in self.screen(), what="top's first screen")
        text = self.screen()
        self.assertIn("4 GPU(s) from fake:4", text)
        self.assertRegex(text, rf"\n0 +Fake GPU +\[\|+ *\] +80/80 GiB held +- +exclusive +{ids[0]} trainer")
        self.assertRegex(text, rf"{ids[0]} +trainer +running .*\] 25% +epoch 1/4 +step 10 +loss 0.1")
        self.assertRegex(text, rf"{ids[1]} +short +running")
        # Live: the short job ends and the screen says so without a key press
        wait_until(lambda: re.search(rf"{ids[1]} +short +succeeded", self.screen()), timeout=15, what="a refresh")
        self.assertTrue(self.screen().startswith("gpuq top "), "redrawn from the top-left corner, never scrolled")
        self.tmux("send-keys", "-t", "top", "q")
        wait_until(lambda: os.path.exists(status) and pathlib.Path(status).read_text().strip(), what="top to quit")
        self.assertEqual(pathlib.Path(status).read_text().strip(), "0")
        self.assertNotIn("trainer", self.screen())  # back on the main screen: the alternate one is gone

    def test_results_keep_to_the_terminal_width_metrics_first(self):
        fields = {f"field_{i:02d}": i for i in range(20)}
        job = {"name": "wide", "shell": event_line(type="result", test_accuracy=0.9, **fields)}
        job_id = self.d.submit(job)["ids"][0]
        self.d.wait([job_id])
        self.tmux("new-session", "-d", "-s", "top", "-x", "80", "-y", "10",
                  f"env GPUQ_SOCKET={self.d.socket} {BIN}/gpuq results {job_id}; sleep 30")
        wait_until(lambda: "more field(s)" in self.screen(), what="the results table")
        lines = self.screen().rstrip("\n").split("\n")
        self.assertTrue(lines[0].startswith("ID  NAME  STATE      test_accuracy  field_00"), lines[0])
        self.assertTrue(all(len(l) <= 80 for l in lines[:2]), lines)
        self.assertIn("field_19", self.screen())  # named in the note
        # Not a terminal: every column; --fields: those asked for
        self.assertIn("field_19", self.d.ok("results", str(job_id)).split("\n")[0])
        self.assertEqual(self.d.ok("results", str(job_id), "--fields", "field_03,test_accuracy").split("\n")[1].split(),
                         [str(job_id), "wide", "succeeded", "3", "0.9"])

    def test_top_once_prints_one_frame_for_scripts(self):
        self.d.submit({"name": "solo", "gpus": 1, "shell": "sleep 30"})
        wait_until(lambda: "running" in self.d.ok("status"), what="solo to run")
        out = self.d.ok("top", "--once")
        self.assertIn("solo", out)
        self.assertNotIn("\x1b", out)
        r = subprocess.run([os.path.join(BIN, "gpuq"), "--socket", self.tmp_path("none.sock"), "top", "--once"],
                           capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 3)
        self.assertIn("is not running", r.stdout)


if __name__ == "__main__":
    unittest.main()


class Why(DaemonTest):
    """`gpuq why ID`: what a queued job waits for, who holds the GPUs, and when it can start."""
    GPUS = "fake:2"

    def test_a_waiting_job_is_explained_with_the_holders_the_reservation_and_its_earliest_start(self):
        gate = self.tmp_path("gate")
        hold = {"gpus": 1, "timeout_s": 3600, "shell": f"while [ ! -e {gate} ]; do sleep 0.05; done"}
        running = self.d.submit([dict(hold, name="h0"), dict(hold, name="h1")])["ids"]
        wait_until(lambda: all(self.d.show(i)["job"]["state"] == "running" for i in running), what="both GPUs held")
        [big] = self.d.submit({"name": "big", "gpus": 2, "command": ["true"]})["ids"]
        [small] = self.d.submit({"name": "small", "gpus": 1, "command": ["true"]})["ids"]
        [after] = self.d.submit({"name": "after", "command": ["true"], "after": [big]})["ids"]
        [held] = self.d.submit({"name": "held", "command": ["true"]}, "--hold")["ids"]
        wait_until(lambda: "reserved" in self.d.show(big)["job"]["reason"], what="a pass to reserve big's GPUs")

        why = self.d.json("why", str(big))
        self.assertEqual(why["job"]["state"], "queued")
        self.assertEqual(sorted(h["name"] for h in why["holders"]), ["h0", "h1"])
        ends = [h["ends_by"] for h in why["holders"]]
        self.assertTrue(all(e > 0 for e in ends))
        self.assertEqual(why["estimated_start"], max(ends))  # it needs both GPUs: when the later one is over
        self.assertEqual(why["ahead"], 0)

        why = self.d.json("why", str(small))
        self.assertEqual(why["ahead"], 1)
        self.assertIn(f"GPU(s) 0, 1 are reserved for job {big}", "\n".join(why["details"]))
        self.assertEqual(why["estimated_start"], min(ends))
        text = self.d.ok("why", str(small))
        self.assertIn("GPUs held by:", text)
        self.assertIn("at the earliest", text)

        self.assertIn(f"it waits for job {big} to succeed, which is queued", self.d.json("why", str(after))["details"])
        self.assertIn(f"it is held: `gpuq release {held}` puts it back in line", self.d.json("why", str(held))["details"])
        self.assertEqual(self.d.json("why", str(running[0]))["details"], ["it is running"])
        self.d.ok("drain", "1", "--reason", "test")
        self.assertIn("it asks for 2 GPUs, and only 1 are in service (`gpuq undrain` puts the others back)",
                      self.d.json("why", str(big))["details"])
        self.d.ok("undrain", "1")
        self.d.ok("release", str(held))
        open(gate, "w").close()
        jobs = self.d.wait(running + [big, small, after, held])
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs.values()), jobs)
        self.assertEqual(self.d.run("why", "999").returncode, 4)


class Words(DaemonTest):
    """What the human output says, in words rather than JSON."""

    def test_show_says_the_first_failure_and_the_command_as_a_shell_would_take_them(self):
        job = self.d.submit({"name": "f", "command": ["sh", "-c", "echo 'last words'; exit 3", "it's"]})["ids"][0]
        self.d.wait([job])
        out = self.d.ok("show", str(job))
        self.assertRegex(out, r"first failure: rank 0 exited with code 3 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: last words\n")
        self.assertIn("""command:   sh -c 'echo '\\''last words'\\''; exit 3' 'it'\\''s'\n""", out)
        self.assertNotIn('{"at"', out)
        # The table's suffix is explained under it, and the GPUs column names ids.
        table = self.d.ok("status")
        self.assertIn("failed (3)", table)
        self.assertIn("GPU IDS", table)
        self.assertIn("(N): the exit code of the rank that failed first\n", table)
        self.assertNotIn("sig N", table)

    def test_results_without_ids_shows_the_jobs_that_ended_last_and_why_an_ended_job_waits_for_nothing(self):
        self.assertIn("no job has ended yet", self.d.ok("results"))
        ids = self.d.submit([{"name": f"r{i}", "shell": f"echo '{{\"type\": \"result\", \"n\": {i}}}' >> $GPUQ_EVENTS"}
                             for i in range(3)])["ids"]
        self.d.wait(ids)
        self.assertEqual([j["id"] for j in self.d.json("results")["jobs"]], ids)
        table = self.d.ok("results")
        for i in range(3):
            self.assertIn(f"r{i}", table)
        why = self.d.ok("why", str(ids[0]))
        self.assertIn("it waits for nothing: it has ended", why)
        self.assertNotIn("ended succeeded", why)
