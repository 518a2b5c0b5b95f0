"""Scheduling through the real daemon: exclusivity, packing, dependencies, retries, timeouts,
results, waits and logs."""
import fcntl
import glob
import itertools
import json
import os
import pathlib
import pty
import struct
import subprocess
import tempfile
import termios
import time
import unittest

from harness import BIN, FAKE_NVML_DIR, Daemon, DaemonTest, event_line, pids_matching, wait_until

# A job that reports its GPU and when it ran (wall clock), as a result event.
TIMED = ('t0=$(date +%s.%N); sleep {sleep}; t1=$(date +%s.%N); '
         'echo "{{\\"type\\":\\"result\\",\\"gpu\\":\\"$CUDA_VISIBLE_DEVICES\\",\\"t0\\":$t0,\\"t1\\":$t1}}" >> "$GPUQ_EVENTS"')


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


def max_overlap(intervals):
    points = sorted([(t0, 1) for t0, _ in intervals] + [(t1, -1) for _, t1 in intervals])
    return max(itertools.accumulate(d for _, d in points))


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
        self.assertEqual(by_name["train-0.3-1"]["labels"], {"lr": "0.3", "seed": "1"})
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
        everything = self.d.json("status")  # --json: every queued job unless asked otherwise
        self.assertEqual((len(everything["jobs"]), everything["queued_total"]), (32, 31))
        few = self.d.json("status", "--queued", "0")
        self.assertEqual([j["name"] for j in few["jobs"]], ["busy"])
        self.assertEqual(few["queued_total"], 31)
        bad = self.d.request({"cmd": "status", "queued": -5})
        self.assertFalse(bad["ok"])
        self.assertIn("queued", bad["error"]["message"])
        open(go, "w").close()
        self.d.wait(ids + [urgent])


# Reports the rank's CPU affinity and thread settings as a result event, then waits for `go`.
PINNED = ('cpus=$(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status); '
          'echo "{{\\"type\\":\\"result\\",\\"allowed\\":\\"$cpus\\",\\"omp\\":\\"$OMP_NUM_THREADS\\",'
          '\\"gpuq_cpus\\":\\"${{GPUQ_CPUS-unset}}\\",\\"gpu\\":\\"$CUDA_VISIBLE_DEVICES\\"}}" >> "$GPUQ_EVENTS"; '
          'while [ ! -e {go} ]; do sleep 0.05; done')


def cpu_list(text):
    """Parses the kernel's "0-3,6" core lists."""
    out = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


# Writes the rank's cores, then the memory policies its mappings show (set_mempolicy's, inherited
# across fork and exec), one per line, to {out}/<job name>.
MEMPOLICY = ('sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status > {out}/$GPUQ_JOB_NAME; '
             "awk '{{print $2}}' /proc/self/numa_maps | sort -u >> {out}/$GPUQ_JOB_NAME")


def numa_node_of(core, sys="/sys"):
    for path in glob.glob(f"{sys}/devices/system/node/node*/cpulist"):
        if core in cpu_list(pathlib.Path(path).read_text().strip()):
            return int(pathlib.Path(path).parent.name[4:])
    return None


class CpuPinning(DaemonTest):
    def two_cores(self):
        """The first two cores of the test's (and so gpuqd's) affinity mask, or a skip."""
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            self.skipTest("needs at least 2 cores")
        return cores[0], cores[1]

    def test_cpus_jobs_are_pinned_to_disjoint_cores_and_wait_for_the_pool_even_across_a_restart(self):
        cores = sorted(os.sched_getaffinity(0))  # gpuqd's pool: one slot per core it may use
        if len(cores) < 2:
            self.skipTest("needs at least 2 cores")
        go = self.tmp_path("go")
        rest = len(cores) - 1
        sub = self.d.submit([
            {"name": "one", "cpus": 1, "shell": PINNED.format(go=go)},
            {"name": "gpu-rest", "gpus": 1, "cpus": rest, "shell": PINNED.format(go=go)},
            {"name": "all", "cpus": len(cores), "shell": PINNED.format(go=go)},
            {"name": "gpu-plain", "gpus": 1, "shell": PINNED.format(go=go)},
        ])
        one, gpu_rest, all_, gpu_plain = sub["ids"]
        results = lambda: {j["id"]: j["result"] for j in self.d.json("results", *map(str, sub["ids"]))["jobs"]}
        wait_until(lambda: all(results().get(i) for i in (one, gpu_rest, gpu_plain)), what="three jobs running")
        r = results()
        got_one, got_rest = cpu_list(r[one]["allowed"]), cpu_list(r[gpu_rest]["allowed"])
        self.assertEqual(len(got_one), 1, r)
        self.assertEqual(len(got_rest), rest, r)
        self.assertFalse(got_one & got_rest, "two jobs were pinned to the same core")
        self.assertEqual(got_one | got_rest, set(cores))
        self.assertEqual((r[one]["omp"], r[gpu_rest]["omp"]), ("1", str(rest)))
        self.assertEqual(cpu_list(r[gpu_rest]["gpuq_cpus"]), got_rest)
        self.assertNotEqual(r[gpu_rest]["gpu"], "")
        # A GPU job without `cpus` takes no slot and is not pinned.
        self.assertEqual(cpu_list(r[gpu_plain]["allowed"]), set(cores))
        self.assertEqual(r[gpu_plain]["gpuq_cpus"], "unset")
        show = self.d.show(gpu_rest)
        self.assertEqual(set(show["job"]["cpus"]), got_rest)
        self.assertIn(f"cpus:      {rest} per rank, pinned to ", self.d.ok("show", str(gpu_rest)))
        pool = self.d.json("gpus")
        self.assertEqual((pool["cpu_slots"], pool["cpu_slots_used"]), (len(cores), len(cores)))
        self.assertEqual(cpu_list(pool["cores"]), set(cores))
        self.assertIn(f"CPU slots {len(cores)} of {len(cores)} in use", self.d.ok("gpus"))

        waiting = f"waiting for {len(cores)} CPU slots (0 of {len(cores)} free)"
        self.assertEqual(self.d.show(all_)["job"]["reason"], waiting)
        # The slots are in the store: a restarted gpuqd neither starts the wide job nor reuses a core.
        self.d.kill9()
        self.d.start()
        # The restarted gpuqd's first pass has looked at the job once it gives the reason again.
        wait_until(lambda: self.d.show(all_)["job"]["reason"] == waiting, what="a scheduling pass")
        self.assertEqual(self.d.show(all_)["job"]["state"], "queued")

        open(go, "w").close()
        done = self.d.wait(sub["ids"])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"}, done)
        wide = results()[all_]
        self.assertEqual(cpu_list(wide["allowed"]), set(cores))
        self.assertEqual(wide["omp"], str(len(cores)))


    def test_a_gpu_jobs_cores_are_on_its_gpus_numa_node_and_each_ddp_rank_near_its_own_gpu(self):
        low, high = self.two_cores()
        # A two-socket machine in miniature: node 0 has core `low` (slot 0), node 1 core `high`
        # (slot 1); GPU 0 sits on node 1 and GPU 1 on node 0.
        sysfs = self.tmp_path("sys")
        for node, core in ((0, low), (1, high)):
            os.makedirs(f"{sysfs}/devices/system/node/node{node}")
            with open(f"{sysfs}/devices/system/node/node{node}/cpulist", "w") as f:
                f.write(f"{core}\n")
        self.d.stop()
        self.d.gpus = "fake:2:1000:1,0"
        self.d.extra = ["--sysfs-root", sysfs]
        self.d.start(cpus={low, high})
        gpus = self.d.json("gpus")
        self.assertEqual([g["numa_node"] for g in gpus["gpus"]], [1, 0])
        self.assertEqual(self.d.ok("gpus").splitlines()[1].split()[:3], ["GPU", "NAME", "NUMA"])

        # One GPU and one core: GPU 0, and node 1's core, not slot 0's.
        go = self.tmp_path("go")
        one = self.d.submit({"name": "one", "gpus": 1, "cpus": 1, "shell": PINNED.format(go=go)})["ids"][0]
        wait_until(lambda: self.d.show(one)["job"].get("result"), what="the job running")
        result = self.d.show(one)["job"]["result"]
        self.assertEqual((result["gpu"], cpu_list(result["allowed"])), ("0", {high}))
        self.assertEqual(self.d.show(one)["job"]["cpus"], [high])
        open(go, "w").close()
        self.assertEqual(self.d.wait([one])[one]["state"], "succeeded")

        # A DDP pair: rank 0 drives GPU 0 (node 1), rank 1 GPU 1 (node 0); each is pinned near it.
        ranks = self.tmp_path("ranks")
        os.makedirs(ranks)
        gang = self.d.submit({"name": "gang", "mode": "ddp", "gpus": 2, "cpus": 1, "shell":
                              f'sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status > {ranks}/$RANK'})
        gang = gang["ids"][0]
        self.assertEqual(self.d.wait([gang])[gang]["state"], "succeeded")
        allowed = {r: cpu_list(pathlib.Path(ranks, r).read_text().strip()) for r in ("0", "1")}
        self.assertEqual(allowed, {"0": {high}, "1": {low}})

    def policies(self, out, name):
        """The core a job ran on, and the memory policies its mappings showed."""
        lines = pathlib.Path(out, name).read_text().split()
        (core,) = cpu_list(lines[0])
        return core, set(lines[1:])

    def test_mem_bind_binds_each_ranks_memory_to_the_numa_node_of_its_cores(self):
        if not os.path.exists("/proc/self/numa_maps") or numa_node_of(min(os.sched_getaffinity(0))) is None:
            self.skipTest("needs a kernel with NUMA (/proc/self/numa_maps, /sys/devices/system/node)")
        out = self.tmp_path("policies")
        os.makedirs(out)
        sub = self.d.submit([
            {"name": "local", "cpus": 1, "mem_bind": "local", "shell": MEMPOLICY.format(out=out)},
            {"name": "prefer", "cpus": 1, "mem_bind": "prefer", "shell": MEMPOLICY.format(out=out)},
            {"name": "plain", "cpus": 1, "shell": MEMPOLICY.format(out=out)},
        ])
        done = self.d.wait(sub["ids"])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"}, done)
        local, prefer, plain = sub["ids"]
        core, seen = self.policies(out, "local")
        node = numa_node_of(core)
        self.assertEqual(seen, {f"bind:{node}"})
        job = self.d.show(local)["job"]
        self.assertEqual((job["mem_bind"], job["mem_nodes"]), ("local", [node]))
        self.assertIn(f"memory:    local: bound to NUMA node {node}\n", self.d.ok("show", str(local)))
        core, seen = self.policies(out, "prefer")
        self.assertEqual(seen, {f"prefer:{numa_node_of(core)}"})
        self.assertIn(f"memory:    prefer: prefers NUMA node {numa_node_of(core)}\n", self.d.ok("show", str(prefer)))
        # Without mem_bind the kernel's default (first touch) stands, and show says nothing.
        self.assertEqual(self.policies(out, "plain")[1], {"default"})
        self.assertEqual(self.d.show(plain)["job"]["mem_bind"], "none")
        self.assertNotIn("memory:", self.d.ok("show", str(plain)))

    def test_mem_bind_where_a_node_is_unknown_or_cannot_be_bound_says_so_and_runs_unbound(self):
        low, high = self.two_cores()
        # Core `high` is on node 63, which no real machine here has: binding to it fails. Core
        # `low` is in no node's list: its node is unknown.
        sysfs = self.tmp_path("sys")
        os.makedirs(f"{sysfs}/devices/system/node/node63")
        pathlib.Path(f"{sysfs}/devices/system/node/node63/cpulist").write_text(f"{high}\n")
        self.d.stop()
        self.d.extra = ["--sysfs-root", sysfs]
        self.d.start(cpus={low, high})
        out = self.tmp_path("policies")
        os.makedirs(out)
        sub = self.d.submit([{"name": f"j{i}", "cpus": 1, "mem_bind": "local", "shell": MEMPOLICY.format(out=out)}
                             for i in range(2)])
        done = self.d.wait(sub["ids"])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"}, done)
        for i, job_id in enumerate(sub["ids"]):
            core, seen = self.policies(out, f"j{i}")
            self.assertNotIn("bind:63", seen)
            log, show = self.d.ok("logs", str(job_id)), self.d.ok("show", str(job_id))
            if core == high:
                self.assertIn("gpuq: cannot set this rank's memory policy (mem_bind local, NUMA node(s) 63); "
                              "its memory is not bound", log)
                self.assertIn("memory:    local: bound to NUMA node 63\n", show)
            else:
                self.assertEqual(core, low)
                self.assertIn("gpuq: mem_bind: the NUMA nodes of this rank's cores are unknown; "
                              "its memory is not bound", log)
                self.assertIn("memory:    local: not bound, its cores' NUMA nodes are unknown\n", show)
        self.assertEqual({self.policies(out, f"j{i}")[0] for i in range(2)}, {low, high})

    def test_a_gpuqd_restarted_under_another_cpu_mask_keeps_a_running_jobs_real_cores_to_it(self):
        low, high = self.two_cores()
        go = self.tmp_path("go")
        # Launched by a gpuqd that may use only `high`: the job's one slot, slot 0, is that core.
        self.d.stop()
        self.d.start(cpus={high})
        first = self.d.submit({"name": "first", "cpus": 1, "shell": PINNED.format(go=go)})["ids"][0]
        wait_until(lambda: self.d.show(first)["job"].get("result"), what="the first job running")
        self.assertEqual(cpu_list(self.d.show(first)["job"]["result"]["allowed"]), {high})
        # Restarted under both cores: slot 0 is now `low`, but the job still runs on `high`.
        self.d.kill9()
        self.d.start(cpus={low, high})
        self.assertEqual(self.d.show(first)["job"]["cpus"], [high])
        second = self.d.submit({"name": "second", "cpus": 1, "shell": PINNED.format(go=go)})["ids"][0]
        wait_until(lambda: self.d.show(second)["job"].get("result"), what="the second job running")
        self.assertEqual(cpu_list(self.d.show(second)["job"]["result"]["allowed"]), {low},
                         "the second job was pinned onto the first job's core")
        self.assertEqual(self.d.show(second)["job"]["cpus"], [low])
        with open(self.tmp_path("gpuqd.log")) as log:
            self.assertIn(f"job {first} runs on cores {high}, launched under another CPU mask", log.read())
        # Two cores, two jobs of one: the pool is full, and a third waits.
        third = self.d.submit({"name": "third", "cpus": 1, "shell": PINNED.format(go=go)})["ids"][0]
        wait_until(lambda: "CPU slot" in self.d.show(third)["job"]["reason"], what="a pass to look at the job")
        self.assertEqual(self.d.show(third)["job"]["state"], "queued")
        open(go, "w").close()
        done = self.d.wait([first, second, third])
        self.assertEqual({j["state"] for j in done.values()}, {"succeeded"}, done)


class Packing(DaemonTest):
    GPUS = "fake:1:1000"

    def test_shared_jobs_pack_by_memory(self):
        jobs = [{"name": f"s{i}", "gpus": 1, "shared": True, "gpu_memory_mb": 400, "shell": TIMED.format(sleep=1)}
                for i in range(3)]
        sub = self.d.submit(jobs)
        done = self.d.wait(sub["ids"])
        self.assertTrue(all(j["state"] == "succeeded" for j in done.values()))
        runs = [(r["result"]["t0"], r["result"]["t1"]) for r in self.d.json("results", *map(str, sub["ids"]))["jobs"]]
        # 2 x 400 MiB fit in 1000 MiB, a third does not.
        self.assertEqual(max_overlap(runs), 2)

    def test_gpus_shows_the_shared_allocation(self):
        sub = self.d.submit({"name": "holder", "gpus": 1, "shared": True, "gpu_memory_mb": 300, "shell": "sleep 30"})
        wait_until(lambda: self.d.json("gpus")["gpus"][0]["jobs"] == sub["ids"], what="the job on GPU 0")
        gpu = self.d.json("gpus")["gpus"][0]
        self.assertEqual(gpu["allocated_mb"], 300)
        self.assertFalse(gpu["exclusive"])
        self.d.ok("cancel", str(sub["ids"][0]))


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

    def test_bad_event_lines_are_counted_not_fatal(self):
        sub = self.d.submit({"name": "noisy", "shell": "echo garbage >> $GPUQ_EVENTS; echo '{\"x\":1}' >> $GPUQ_EVENTS; " +
                             event_line(type="result", ok=1)})
        job = self.d.wait(sub["ids"])[sub["ids"][0]]
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["bad_event_lines"], 2)
        self.assertEqual(job["result"], {"ok": 1})

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
        time.sleep(0.5)
        open(f"{self.tmp}/more", "w").close()
        out, _ = follower.communicate(timeout=30)
        # Attempt 1 is skipped; the partial last line is printed once the job has ended.
        self.assertEqual(out.split(), ["100003", "last", "partial"])

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
                                                    "succeeded, failed, cancelled, timed_out")
        self.d.ok("cancel", str(busy), str(held))
        self.d.wait([busy, held])


class Restart(DaemonTest):
    def test_a_failed_job_restarts_under_its_id_with_fresh_retries_and_brings_back_what_failed_waiting_for_it(self):
        jobs = [
            # Fails attempts 1 and 2 (its retry); after the restart fails attempt 3 and succeeds on
            # attempt 4, which only a retry budget counted from the restart allows.
            {"name": "prep", "retries": 1, "shell": 'echo "prep $GPUQ_ATTEMPT"; [ "$GPUQ_ATTEMPT" -ge 4 ]'},
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
        self.assertEqual((done[prep]["attempt"], done[prep]["attempt_base"], done[prep]["restarts"]), (4, 2, 1))
        self.assertEqual((done[train]["attempt"], done[train]["restarts"]), (1, 1))
        self.assertEqual(done[aside]["restarts"], 0)
        self.assertGreaterEqual(done[train]["started_at"], done[prep]["ended_at"])

        show = self.d.show(prep)
        # The kill may land between marking attempt 3 running and its start; the new gpuqd then
        # requeues it as the same attempt (a running/queued pair that the rest does not depend on).
        history = show["history"]
        for i in reversed(range(1, len(history))):
            if history[i]["reason"] == "requeued: gpuqd stopped before the job started":
                del history[i - 1:i + 1]
        states = [(h["attempt"], h["state"]) for h in history]
        self.assertEqual(states, [(0, "queued"), (1, "running"), (1, "failed"), (1, "queued"), (2, "running"),
                                  (2, "failed"), (2, "queued"), (3, "running"), (3, "failed"), (3, "queued"),
                                  (4, "running"), (4, "succeeded")])
        self.assertEqual(history[6]["reason"], "restarted (it had ended failed)")
        self.assertEqual(self.d.show(train)["history"][-3]["reason"], f"restarted with job {prep}")
        self.assertEqual(sorted({log["attempt"] for log in show["logs"]}), [1, 2, 3, 4])  # every attempt's log kept
        self.assertEqual(self.d.ok("logs", str(prep), "--attempt", "1").split(), ["prep", "1"])
        text = self.d.ok("show", str(prep))
        self.assertIn("attempt:   2 of 2 since restart 1 (attempt 4 in all)", text)

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
        time.sleep(0.5)
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
        self.assertIn("`retries`", r.stderr)
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


class Drain(DaemonTest):
    GPUS = "fake:2"

    def test_a_drained_gpu_is_given_to_no_job_across_a_restart_and_the_job_on_it_runs_on(self):
        go = self.tmp_path("go")
        on_one = self.d.submit({"name": "on-one", "gpus": 2, "shell": f"while [ ! -e {go} ]; do sleep 0.05; done"})["ids"][0]
        wait_until(lambda: self.d.show(on_one)["job"]["state"] == "running", what="the 2-GPU job")
        gpus = self.d.json("drain", "1", "--reason", "ECC errors")["gpus"]
        self.assertEqual([(g["drained"], g["drain_reason"]) for g in gpus], [(False, ""), (True, "ECC errors")])
        self.assertIn("drained, exclusive: ECC errors", self.d.ok("gpus"))
        self.d.stop()
        self.d.start()  # kept in the store
        self.assertEqual(self.d.show(on_one)["job"]["state"], "running")  # drain stops nothing
        singles = self.d.submit([{"name": f"one{i}", "gpus": 1, "shell": TIMED.format(sleep=0.2)} for i in range(3)])["ids"]
        pair = self.d.submit({"name": "pair", "gpus": 2, "command": ["true"]})["ids"][0]
        open(go, "w").close()
        done = self.d.wait(singles)
        self.assertEqual({done[i]["result"]["gpu"] for i in singles}, {"0"})
        wait_until(lambda: "in service" in self.d.show(pair)["job"]["reason"], what="the pair's reason")
        self.assertEqual(self.d.show(pair)["job"]["reason"], "needs 2 GPUs; this machine has 1 in service (GPU 1 drained)")
        self.d.ok("undrain", "1")
        self.assertEqual(self.d.wait([pair])[pair]["state"], "succeeded")
        self.assertFalse(any(g["drained"] for g in self.d.json("gpus")["gpus"]))

    def test_draining_a_gpu_that_does_not_exist_says_which_do(self):
        r = self.d.run("drain", "5")
        self.assertEqual(r.returncode, 4)
        self.assertIn("no GPU 5; this machine has GPUs 0, 1", r.stderr)
        self.assertEqual(self.d.run("drain").returncode, 2)
        r = self.d.run("drain", "first")
        self.assertEqual(r.returncode, 2)
        self.assertIn("first is neither a GPU index nor a UUID", r.stderr)
        r = self.d.run("drain", "GPU-fake", "-r", "x")
        self.assertEqual(r.returncode, 4)
        self.assertIn("UUID prefix GPU-fake names GPUs 0 and 1; give more of it", r.stderr)
        r = self.d.run("drain", "GPU-0000")
        self.assertEqual((r.returncode, "no GPU with UUID GPU-0000" in r.stderr), (4, True))
        self.assertFalse(any(g["drained"] for g in self.d.json("gpus")["gpus"]))


class NvmlGpus(DaemonTest):
    """gpuqd --gpus nvml over the stand-in libnvidia-ml.so.1 (tests/fake_nvml), whose GPUs are
    lines of a file the test rewrites: UUID NAME TOTAL USED UTIL BUS ECC REMAP_FAILED LOST."""
    GPUS = ["GPU-11111111-aaaa H100-SXM 81559 1200 37 1a 0 0 0",
            "GPU-22222222-bbbb H100-SXM 81559 0 0 3b 0 0 0",
            "GPU-33333333-cccc A100-PCIE 40960 0 0 5c -1 0 0"]  # no ECC counter

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.devices = self.tmp_path("nvml-devices")
        self.set_gpus(self.GPUS)
        env = dict(os.environ, LD_LIBRARY_PATH=FAKE_NVML_DIR, GPUQ_FAKE_NVML=self.devices)
        self.d = Daemon(self.tmp, "nvml", extra=["--health-interval", "0.1"], env=env).start()

    def set_gpus(self, lines):
        with open(self.devices + ".new", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(self.devices + ".new", self.devices)

    def gpu(self, index):
        return self.d.json("gpus")["gpus"][index]

    def test_gpus_come_from_nvml_with_their_readings_and_jobs_get_their_uuids(self):
        gpus = self.d.json("gpus")["gpus"]
        self.assertEqual([(g["index"], g["uuid"], g["name"], g["memory_total_mb"]) for g in gpus],
                         [(0, "GPU-11111111-aaaa", "H100-SXM", 81559), (1, "GPU-22222222-bbbb", "H100-SXM", 81559),
                          (2, "GPU-33333333-cccc", "A100-PCIE", 40960)])
        self.assertEqual((gpus[0]["memory_used_mb"], gpus[0]["utilization"]), (1200, 37))
        self.assertIn("3 GPU(s) from nvml", self.d.ok("gpus"))
        # Readings are live: what NVML says now.
        self.set_gpus([self.GPUS[0].replace(" 1200 37 ", " 70000 99 ")] + self.GPUS[1:])
        self.assertEqual((self.gpu(0)["memory_used_mb"], self.gpu(0)["utilization"]), (70000, 99))
        out = self.tmp_path("out")
        job = self.d.submit({"name": "two", "gpus": 2, "gpu_memory_mb": 50000,
                             "shell": f'echo "$CUDA_VISIBLE_DEVICES $GPUQ_GPU_UUIDS" > {out}'})["ids"][0]
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
        self.assertEqual(pathlib.Path(out).read_text().split(), ["0,1", "GPU-11111111-aaaa,GPU-22222222-bbbb"])
        r = self.d.run("submit", "-", input=json.dumps({"gpus": 1, "gpu_memory_mb": 90000, "command": ["true"]}))
        self.assertEqual(r.returncode, 4)
        self.assertIn("the largest GPU here has 81559 MiB", r.stderr)

    def test_an_unhealthy_gpu_is_drained_while_the_job_on_it_runs_on(self):
        go = self.tmp_path("go")
        on_zero = self.d.submit({"name": "on-zero", "gpus": 1, "shell": f"while [ ! -e {go} ]; do sleep 0.05; done"})
        on_zero = on_zero["ids"][0]
        wait_until(lambda: self.d.show(on_zero)["job"]["gpus"] == [0], what="the job on GPU 0")
        self.set_gpus([self.GPUS[0].replace(" 0 0 0", " 2 0 0")] + self.GPUS[1:])
        wait_until(lambda: self.gpu(0)["drained"], what="GPU 0 drained")
        self.assertEqual(self.gpu(0)["drain_reason"], "health check: 2 new uncorrectable ECC errors")
        self.assertEqual(self.d.show(on_zero)["job"]["state"], "running")
        self.assertIn("drained, exclusive: health check: 2 new uncorrectable ECC errors", self.d.ok("gpus"))

        # A GPU that falls off the bus, and one whose row remapping failed.
        self.set_gpus([self.GPUS[0].replace(" 0 0 0", " 2 0 0"), self.GPUS[1].replace(" 0 0 0", " 0 1 0"),
                       self.GPUS[2][:-1] + "1"])
        wait_until(lambda: self.gpu(1)["drained"] and self.gpu(2)["drained"], what="GPUs 1 and 2 drained")
        self.assertEqual(self.gpu(1)["drain_reason"], "health check: memory row remapping failed")
        self.assertEqual(self.gpu(2)["drain_reason"],
                         "health check: the GPU is lost (fell off the bus; NVML_ERROR_GPU_IS_LOST)")
        waiting = self.d.submit({"name": "waiting", "gpus": 1, "command": ["true"]})["ids"][0]
        wait_until(lambda: "in service" in self.d.show(waiting)["job"]["reason"], what="the job's reason")

        # Back in service after a reset: the errors counted so far are forgiven, new ones are not.
        # GPUs by UUID (or a unique prefix), which stay theirs when indices change.
        self.set_gpus([self.GPUS[0].replace(" 0 0 0", " 2 0 0")] + self.GPUS[1:])
        self.d.ok("undrain", "GPU-11111111-aaaa", "GPU-2222", "2")
        self.assertEqual(self.d.wait([waiting])[waiting]["state"], "succeeded")
        time.sleep(0.5)  # five health checks
        self.assertFalse(any(g["drained"] for g in self.d.json("gpus")["gpus"]))
        self.set_gpus([self.GPUS[0].replace(" 0 0 0", " 3 0 0")] + self.GPUS[1:])
        wait_until(lambda: self.gpu(0)["drained"], what="GPU 0 drained again")
        self.assertEqual(self.gpu(0)["drain_reason"], "health check: 1 new uncorrectable ECC error")
        # A drain is kept across a restart like any other.
        self.d.kill9()
        self.d.start()
        self.assertEqual(self.gpu(0)["drain_reason"], "health check: 1 new uncorrectable ECC error")
        open(go, "w").close()
        self.assertEqual(self.d.wait([on_zero])[on_zero]["state"], "succeeded")


    def test_an_xid_that_needs_a_reset_drains_its_gpu_and_one_from_the_application_does_not(self):
        # GPU 2's driver cannot report Xid events: said once at start, its other checks go on.
        self.set_gpus(self.GPUS[:2] + [self.GPUS[2] + " x"])
        self.d.stop()
        self.d.start()
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            self.assertIn("gpuqd: 2 of 3 GPU(s) report critical Xid events to the health checks", f.read())
        # Read in one health check: the application's Xids on GPU 0 (an illegal address, a channel
        # torn down) and GPU 1 falling off the bus.
        self.set_gpus([self.GPUS[0] + " 13,43", self.GPUS[1] + " 79", self.GPUS[2] + " x"])
        wait_until(lambda: self.gpu(1)["drained"], what="GPU 1 drained")
        self.assertEqual(self.gpu(1)["drain_reason"], "health check: Xid 79: the GPU fell off the bus")
        self.assertFalse(self.gpu(0)["drained"])
        # Each event counts once: put back after a reset, GPU 1 stays in service until a new one.
        self.d.ok("undrain", "1")
        job = self.d.submit({"name": "after-reset", "gpus": 3, "command": ["true"]})["ids"][0]
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
        time.sleep(0.5)  # five health checks
        self.assertFalse(self.gpu(1)["drained"])
        self.set_gpus([self.GPUS[0] + " 13,43", self.GPUS[1] + " 79,48", self.GPUS[2] + " x"])
        wait_until(lambda: self.gpu(1)["drained"], what="GPU 1 drained again")
        self.assertEqual(self.gpu(1)["drain_reason"], "health check: Xid 48: double-bit ECC error")


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
