"""Where jobs run, through the real daemon: CPU pinning and NUMA placement, packing shared GPUs,
drained GPUs, and GPUs from NVML (a stand-in libnvidia-ml) with their health checks."""
import glob
import json
import os
import pathlib
import tempfile
import time
import unittest

import subprocess

from harness import FAKE_NVML_DIR, TIMED, Daemon, DaemonTest, event_line, wait_until


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

    def test_a_job_without_cpus_runs_on_the_cores_gpuqd_may_use_and_not_beyond(self):
        # A cpuset joined resets a process's affinity to the cpuset's: an unpinned job's must be
        # gpuqd's cores, as it was when the job inherited gpuqd's mask.
        low, high = self.two_cores()
        go = self.tmp_path("go")
        open(go, "w").close()
        self.d.stop()
        self.d.start(cpus={high})
        job = self.d.submit({"name": "unpinned", "shell": PINNED.format(go=go)})["ids"][0]
        self.assertEqual(self.d.wait([job])[job]["state"], "succeeded")
        self.assertEqual(cpu_list(self.d.show(job)["job"]["result"]["allowed"]), {high})


class ThreadShare(DaemonTest):
    GPUS = "fake:2:80000"

    def test_jobs_without_cpus_get_their_share_of_the_cores_as_omp_num_threads(self):
        cores = len(os.sched_getaffinity(0))
        show = "echo $OMP_NUM_THREADS"
        saved = os.environ.pop("OMP_NUM_THREADS", None)  # the submitter's own would be kept
        if saved is not None:
            self.addCleanup(os.environ.__setitem__, "OMP_NUM_THREADS", saved)
        jobs = [{"name": "one-gpu", "gpus": 1, "shell": show},
                {"name": "two-gpus", "gpus": 2, "shell": show},
                {"name": "half-a-gpu", "gpus": 1, "shared": True, "gpu_memory_mb": 40000, "shell": show},
                {"name": "cpu", "shell": show},
                {"name": "own", "gpus": 1, "env": {"OMP_NUM_THREADS": "5"}, "shell": show}]
        r = self.d.run("submit", "-", "--json", input=json.dumps(jobs))
        ids = json.loads(r.stdout)["ids"]
        self.d.wait(ids)
        got = {self.d.show(i)["job"]["name"]: self.d.ok("logs", str(i)).strip() for i in ids}
        self.assertEqual(got, {"one-gpu": str(max(1, cores // 2)), "two-gpus": str(cores),
                               "half-a-gpu": str(max(1, cores // 4)), "cpu": "1", "own": "5"})


class Packing(DaemonTest):
    GPUS = "fake:1:1000"

    def test_shared_jobs_pack_by_memory(self):
        release = self.tmp_path("release")
        jobs = [{"name": f"s{i}", "gpus": 1, "shared": True, "gpu_memory_mb": 400,
                 "shell": f'while [ ! -e "{release}" ]; do sleep 0.05; done'} for i in range(3)]
        sub = self.d.submit(jobs)

        # 2 x 400 MiB fit in 1000 MiB, a third does not: it waits while the two run, however long.
        def states():
            return [j["state"] for j in self.d.json("status", "--all")["jobs"] if j["id"] in sub["ids"]]
        wait_until(lambda: sorted(states()) == ["queued", "running", "running"], what="two of three to run")
        self.assertEqual(self.d.json("gpus")["gpus"][0]["allocated_mb"], 800)
        open(release, "w").close()
        done = self.d.wait(sub["ids"])
        self.assertTrue(all(j["state"] == "succeeded" for j in done.values()))

    def test_spread_is_chosen_per_job_and_by_gpuqds_placement_and_pack_stays_the_default(self):
        release = self.tmp_path("release")
        hold = f'while [ ! -e "{release}" ]; do sleep 0.05; done'

        def run(jobs):
            ids = self.d.submit(jobs)["ids"]
            wait_until(lambda: all(self.d.show(i)["job"]["state"] == "running" for i in ids), what="the jobs to run")
            gpus = [self.d.show(i)["job"]["gpus"] for i in ids]
            open(release, "w").close()
            self.d.wait(ids)
            os.remove(release)
            return gpus

        self.d.stop()
        self.d.gpus = "fake:3:1000"
        self.d.start()
        shared = {"gpus": 1, "shared": True, "gpu_memory_mb": 100, "shell": hold}
        self.assertEqual(run([dict(shared, name=f"p{i}") for i in range(3)]), [[0], [0], [0]])  # pack: one GPU
        self.assertEqual(run([dict(shared, name=f"s{i}", placement="spread") for i in range(3)]), [[0], [1], [2]])
        self.d.stop()
        self.d.extra = ["--placement", "spread"]
        self.d.start()
        self.assertEqual(run([dict(shared, name=f"d{i}") for i in range(3)]), [[0], [1], [2]])
        self.assertEqual(run([dict(shared, name=f"k{i}", placement="pack") for i in range(3)]), [[0], [0], [0]])
        r = self.d.run("submit", "-", input=json.dumps(dict(shared, placement="sideways")))
        self.assertIn('field `placement` must be "pack" or "spread", got "sideways"', r.stderr)

    def test_gpus_shows_the_shared_allocation(self):
        sub = self.d.submit({"name": "holder", "gpus": 1, "shared": True, "gpu_memory_mb": 300, "shell": "sleep 30"})
        wait_until(lambda: self.d.json("gpus")["gpus"][0]["jobs"] == sub["ids"], what="the job on GPU 0")
        gpu = self.d.json("gpus")["gpus"][0]
        self.assertEqual(gpu["allocated_mb"], 300)
        self.assertFalse(gpu["exclusive"])
        self.d.ok("cancel", str(sub["ids"][0]))


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
    lines of a file the test rewrites: UUID NAME TOTAL USED UTIL BUS ECC REMAP_FAILED LOST, then
    XIDS and the processes on the GPU (PID:MIB,...)."""
    GPUS = ["GPU-11111111-aaaa H100-SXM 81559 1200 37 1a 0 0 0",
            "GPU-22222222-bbbb H100-SXM 81559 0 0 3b 0 0 0",
            "GPU-33333333-cccc A100-PCIE 40960 0 0 5c -1 0 0"]  # no ECC counter

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-it-", dir="/tmp")
        self.devices = self.tmp_path("nvml-devices")
        self.set_gpus(self.GPUS)
        self.env = dict(os.environ, LD_LIBRARY_PATH=FAKE_NVML_DIR, GPUQ_FAKE_NVML=self.devices)
        self.d = Daemon(self.tmp, "nvml", extra=["--health-interval", "0.1", "--gpu-process-interval", "0.1"],
                        env=self.env).start()

    def outsider(self):
        """A process gpuq did not start (a notebook, say), for the stand-in NVML to put on a GPU."""
        p = subprocess.Popen(["sleep", "7403"])
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        return p.pid

    def job_pid(self, path):
        wait_until(lambda: os.path.exists(path) and pathlib.Path(path).read_text().strip(), what="the job's pid")
        return int(pathlib.Path(path).read_text())

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
        self.d.wait_for_counter("health_checks", more=5)  # five health checks, however long they take
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
        self.d.wait_for_counter("health_checks", more=5)
        self.assertFalse(self.gpu(1)["drained"])
        self.set_gpus([self.GPUS[0] + " 13,43", self.GPUS[1] + " 79,48", self.GPUS[2] + " x"])
        wait_until(lambda: self.gpu(1)["drained"], what="GPU 1 drained again")
        self.assertEqual(self.gpu(1)["drain_reason"], "health check: Xid 48: double-bit ECC error")


    def test_memory_held_outside_gpuq_is_named_and_not_given_to_shared_jobs(self):
        # A process gpuq did not start holds 30000 MiB of GPU 2 (40960 MiB) from before gpuqd starts.
        outsider = self.outsider()
        self.set_gpus(self.GPUS[:2] + [self.GPUS[2] + f" - {outsider}:30000"])
        self.d.stop()
        self.d.start()
        go = self.tmp_path("go")
        pid_file = self.tmp_path("pid")
        hold = f"echo $$ > {pid_file}; while [ ! -e {go} ]; do sleep 0.05; done"
        # GPUs 0 and 1 held whole; a shared job of 20000 MiB could only go on GPU 2, which has 10960 free.
        first = self.d.submit({"name": "whole-0", "gpus": 1, "shell": hold})["ids"][0]
        job_pid = self.job_pid(pid_file)
        second = self.d.submit({"name": "whole-1", "gpus": 1, "shell": f"while [ ! -e {go} ]; do sleep 0.05; done"})
        second = second["ids"][0]
        shared = self.d.submit({"name": "packed", "gpus": 1, "shared": True, "gpu_memory_mb": 20000,
                                "shell": 'echo "$CUDA_VISIBLE_DEVICES" > ' + self.tmp_path("packed")})["ids"][0]
        wait_until(lambda: "held outside gpuq: 30000 MiB on GPU 2" in self.d.show(shared)["job"]["reason"],
                   what="the shared job waiting, its reason naming the memory outside gpuq")
        self.assertEqual(self.d.show(shared)["job"]["state"], "queued")

        # gpus names every process on the GPUs: the job's own (not counted twice) and the outsider.
        self.set_gpus([self.GPUS[0] + f" - {job_pid}:12000", self.GPUS[1], self.GPUS[2] + f" - {outsider}:30000"])
        wait_until(lambda: self.gpu(0)["processes"], what="the job's process listed")
        zero, two = self.gpu(0), self.gpu(2)
        self.assertEqual([(p["pid"], p["used_mb"], p["job"], p["user"], p["command"]) for p in zero["processes"]],
                         [(job_pid, 12000, first, "root", "sh")])
        self.assertEqual(zero["foreign_mb"], 0)
        self.assertEqual([(p["pid"], p["used_mb"], p["job"], p["user"], p["command"]) for p in two["processes"]],
                         [(outsider, 30000, None, "root", "sleep")])
        self.assertEqual(two["foreign_mb"], 30000)
        self.assertEqual(self.gpu(1)["processes"], [])  # listed, and empty
        text = self.d.ok("gpus")
        self.assertIn("processes on the GPUs (30000 MiB held outside gpuq, counted as used):", text)
        self.assertRegex(text, rf"\n2 +{outsider} +root +sleep +30000 MiB +outside gpuq\n")
        self.assertRegex(text, rf"\n0 +{job_pid} +root +sh +12000 MiB +{first}\n")
        wait_until(lambda: self.d.show(first)["job"].get("gpu_memory_peak_mb") == 12000, what="the job's peak")
        self.assertIn("peak 12000 MiB on a GPU so far", self.d.ok("show", str(first)))

        # The outsider lets go of most of it: the shared job fits on GPU 2 now.
        self.set_gpus([self.GPUS[0] + f" - {job_pid}:12000", self.GPUS[1], self.GPUS[2] + f" - {outsider}:5000"])
        self.assertEqual(self.d.wait([shared])[shared]["state"], "succeeded")
        self.assertEqual(pathlib.Path(self.tmp_path("packed")).read_text().strip(), "2")
        open(go, "w").close()
        self.d.wait([first, second])

    def test_a_job_out_of_gpu_memory_names_its_peak_the_outsider_that_grew_and_the_xid(self):
        outsider = self.outsider()
        self.set_gpus([self.GPUS[0], self.GPUS[1] + f" - {outsider}:1000", self.GPUS[2]])
        self.d.stop()
        self.d.start()
        go, pid_file = self.tmp_path("go"), self.tmp_path("pid")
        oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
               "capacity of 79.65 GiB of which 1.2 GiB is free.")
        # Best fit for 50000 MiB: GPU 1, whose outsider leaves it the fullest GPU with room.
        job = self.d.submit({"name": "oom", "gpus": 1, "shared": True, "gpu_memory_mb": 50000,
                             "shell": f"echo $$ > {pid_file}; while [ ! -e {go} ]; do sleep 0.05; done; "
                                      f"echo 'Traceback (most recent call last):' >&2; echo '{oom}' >&2; "
                                      "echo 'frame #0: c10::Error' >&2; exit 1"})["ids"][0]
        job_pid = self.job_pid(pid_file)
        self.assertEqual(self.d.show(job)["job"]["gpus"], [1])
        self.set_gpus([self.GPUS[0], self.GPUS[1] + f" - {job_pid}:45000,{outsider}:1000", self.GPUS[2]])
        wait_until(lambda: self.d.show(job)["job"].get("gpu_memory_peak_mb") == 45000, what="the job's peak seen")
        # The outsider grows and the GPU reports an Xid; the job's memory is gone as it fails.
        self.set_gpus([self.GPUS[0], self.GPUS[1] + f" 31 {outsider}:30000", self.GPUS[2]])
        open(go, "w").close()
        ended = self.d.wait([job])[job]
        self.assertEqual(ended["state"], "failed")
        self.assertEqual(ended["reason"],
                         "rank 0 exited with code 1: CUDA out of memory (its processes held up to 45000 MiB of "
                         f"GPU 1's 81559 MiB; pid {outsider} of root outside gpuq grew from 1000 to 30000 MiB on "
                         "GPU 1; GPU 1 reported Xid 31 (GPU memory page fault: often an illegal address in the "
                         f"application)): {oom}")
        self.assertEqual(self.d.show(job)["first_failure"]["class"], "cuda_oom")
        self.assertEqual(self.d.show(job)["first_failure"]["message"], "frame #0: c10::Error")
        self.assertFalse(self.gpu(1)["drained"])  # the application's Xid: the GPU stays in service

    def test_a_silent_job_on_a_busy_gpu_is_not_hung_and_on_an_idle_one_is(self):
        self.d.stop()
        self.d = Daemon(self.tmp, "nvml", extra=["--hang-after", "1s"], env=self.env).start()
        go = self.tmp_path("go")
        wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
        # GPU 0 is 37% busy, GPU 1 idle. The busy one reports progress first, so it is the longer silent.
        busy = self.d.submit({"name": "busy", "gpus": 1, "shell": event_line(type="progress", step=1) + "; " + wait})
        busy = busy["ids"][0]
        wait_until(lambda: self.d.show(busy)["job"]["progress"], what="the busy job's progress")
        idle = self.d.submit({"name": "idle", "gpus": 1, "shell": event_line(type="progress", step=1) + "; " + wait})
        idle = idle["ids"][0]
        self.assertEqual((self.d.show(busy)["job"]["gpus"], self.d.show(idle)["job"]["gpus"]), ([0], [1]))
        wait_until(lambda: self.d.show(idle)["job"].get("hung"), timeout=30, what="the job on the idle GPU flagged")
        self.assertFalse(self.d.show(busy)["job"].get("hung"))  # the same check found its GPU working
        self.set_gpus([self.GPUS[0].replace(" 1200 37 ", " 1200 0 ")] + self.GPUS[1:])
        wait_until(lambda: self.d.show(busy)["job"].get("hung"), timeout=30, what="the job flagged once its GPU idles")
        open(go, "w").close()
        self.assertEqual({j["state"] for j in self.d.wait([busy, idle]).values()}, {"succeeded"})


if __name__ == "__main__":
    unittest.main()
