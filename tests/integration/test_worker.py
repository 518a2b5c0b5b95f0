"""gpuq-worker, the LibTorch trainer: DDP correctness on Gloo, gradient accumulation, and
Fashion-MNIST training through the real daemon."""
import json
import os
import shutil
import signal
import subprocess
import unittest

from harness import BIN, DaemonTest, pids_matching, wait_until

WORKER = os.path.join(BIN, "gpuq-worker")
HAVE_WORKER = os.path.exists(WORKER)
FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
TORCH_PYTHON = os.environ.get("GPUQ_TEST_PYTHON", "/usr/bin/python3")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))

# Long enough per epoch (about a second) to stop a run between two checkpoints.
# Epochs of 250 steps: the first checkpoint comes within a minute on a loaded 2-core box (PyPI's
# LibTorch, a CPU hog and the other test modules beside it ran 300 samples/s).
RESUMABLE = {"dataset": {"kind": "synthetic", "samples": 10000, "features": 64},
             "model": {"hidden": [128, 128], "dropout": 0.2}, "optimizer": {"kind": "adam"},
             "schedule": {"kind": "cosine"}, "epochs": 3, "batch_size": 32}

# Plain SGD on a small synthetic problem: deterministic, so results compare to 1e-5.
SYNTHETIC = {"dataset": {"kind": "synthetic", "samples": 2000, "features": 16, "classes": 4},
             "model": {"hidden": [32, 16]}, "optimizer": {"kind": "sgd", "lr": 0.05}, "epochs": 2, "seed": 3}


def load(path):
    with open(path) as f:
        return json.load(f)


def read_text(path):
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def max_diff(a, b):
    assert len(a) == len(b) and a, (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


@unittest.skipUnless(HAVE_WORKER, "gpuq-worker not built (GPUQ_WITH_TORCH=OFF or no LibTorch)")
class Worker(DaemonTest):
    def run_worker(self, train, dump, env=None):
        r = subprocess.run([WORKER, "--train", json.dumps(train), "--dump-params", dump], capture_output=True,
                           text=True, env=dict(os.environ, **(env or {})), timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return load(dump)

    def run_worker_with_events(self, train, name, env=None):
        """Runs the worker by hand; returns (final parameters, its events)."""
        events = self.tmp_path(name + ".jsonl")
        params = self.run_worker(train, self.tmp_path(name + ".json"), env=dict(env or {}, GPUQ_EVENTS=events))
        return params, [json.loads(line) for line in read_text(events).splitlines()]

    def run_gang(self, name, train, ranks=2):
        """Runs `train` as a ddp gang through the daemon; returns each rank's final parameters and the result."""
        # The rank picks its own dump file through $RANK, so the job runs through a shell.
        shell = f"exec {WORKER} --train '{json.dumps(train)}' --dump-params {self.tmp_path(name)}-$RANK.json"
        job_id = self.d.submit({"name": name, "mode": "ddp", "ranks": ranks, "shell": shell})["ids"][0]
        done = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(done["state"], "succeeded", self.d.ok("logs", str(job_id)))
        return [load(self.tmp_path(f"{name}-{r}.json")) for r in range(ranks)], done

    def test_ddp_on_gloo_gives_identical_ranks_equal_to_single_process_training(self):
        # Two ranks with batch 16 each see, step by step, the samples one process sees with batch 32.
        (r0, r1), job = self.run_gang("ddp", dict(SYNTHETIC, batch_size=16))
        result = job["result"]
        self.assertEqual(result["world_size"], 2)
        self.assertEqual(result["backend"], "gloo")
        self.assertEqual(len(result["rank_samples_per_s"]), 2)
        self.assertEqual(max_diff(r0, r1), 0.0, "ranks ended with different parameters")
        single = self.run_worker(dict(SYNTHETIC, batch_size=32), self.tmp_path("single.json"))
        self.assertLess(max_diff(r0, single), 1e-5)
        # A one-rank gang still runs as a rank of a process group (torchrun --nproc 1).
        job_id = self.d.submit({"name": "one", "mode": "ddp", "ranks": 1, "train": SYNTHETIC})["ids"][0]
        one = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(one["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.assertEqual((one["result"]["backend"], one["result"]["world_size"]), ("gloo", 1))

    def test_ddp_of_model_parallel_replicas_with_many_small_buckets_equals_single_process_training(self):
        # Stages [1, 2, 1] per rank (hybrid) and ~100-byte buckets: 5 allreduces per step, most
        # started from the gradient hooks while backward runs.
        model = {"hidden": [32, 16, 8]}
        hybrid = dict(SYNTHETIC, batch_size=16, model=model, stages=[1, 2, 1], bucket_mb=0.0001, checkpoint_every=0)
        (r0, r1), job = self.run_gang("hybrid", hybrid)
        self.assertIn("gradients averaged in 5 bucket(s)", self.d.ok("logs", str(job["id"])))
        self.assertEqual(max_diff(r0, r1), 0.0, "ranks ended with different parameters")
        single = self.run_worker(dict(SYNTHETIC, batch_size=32, model=model), self.tmp_path("single.json"))
        self.assertLess(max_diff(r0, single), 1e-5)
        # The same as a train job: the spec accepts ddp + stages and gives one rank per replica.
        job_id = self.d.submit({"name": "hybrid-job", "mode": "ddp", "ranks": 2, "train": hybrid})["ids"][0]
        job = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.assertEqual(job["result"]["world_size"], 2)

    def test_host_held_data_with_prefetch_trains_exactly_like_device_held_data(self):
        spec = dict(SYNTHETIC, accumulate=2, batch_size=32, checkpoint_every=0)
        device, device_events = self.run_worker_with_events(dict(spec, data_on="device"), "device")
        host, host_events = self.run_worker_with_events(dict(spec, data_on="host"), "host")
        self.assertEqual(max_diff(device, host), 0.0)
        self.assertEqual(device_events[-1]["data_on"], "device")
        self.assertEqual(host_events[-1]["data_on"], "host")

    def test_bf16_autocast_trains_on_the_cpu_and_really_changes_the_arithmetic(self):
        spec = dict(SYNTHETIC, epochs=3, log_every=10, checkpoint_every=0)
        fp32, fp32_events = self.run_worker_with_events(spec, "fp32")
        bf16, bf16_events = self.run_worker_with_events(dict(spec, precision="bf16"), "bf16")
        result = bf16_events[-1]
        self.assertEqual(result["type"], "result")
        self.assertEqual(result["precision"], "bf16")
        self.assertGreater(max_diff(fp32, bf16), 1e-4, "bf16 gave fp32's exact parameters: autocast did not run")
        self.assertGreater(result["test_accuracy"], fp32_events[-1]["test_accuracy"] - 0.05)
        # Progress events carry memory (host memory on the CPU; device memory on CUDA).
        progress = [e for e in bf16_events if e["type"] == "progress"]
        self.assertTrue(progress and all(e["host_memory_mib"] > 1 for e in progress), progress[:2])

    def test_gradient_accumulation_equals_one_big_batch(self):
        k4 = self.run_worker(dict(SYNTHETIC, batch_size=32, accumulate=4), self.tmp_path("k4.json"))
        k1 = self.run_worker(dict(SYNTHETIC, batch_size=32, accumulate=1), self.tmp_path("k1.json"))
        self.assertLess(max_diff(k4, k1), 1e-5)
        other = self.run_worker(dict(SYNTHETIC, batch_size=8), self.tmp_path("b8.json"))
        self.assertGreater(max_diff(other, k1), 1e-3, "the comparison cannot tell batches apart")

    def test_multi_tensor_optimisers_compute_what_libtorchs_per_parameter_ones_do(self):
        for optimizer in ({"kind": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
                          {"kind": "adam", "weight_decay": 1e-2}, {"kind": "adamw", "lr": 3e-3, "weight_decay": 0.1}):
            with self.subTest(optimizer["kind"]):
                runs = {foreach: self.run_worker(dict(SYNTHETIC, epochs=3, optimizer=dict(optimizer, foreach=foreach)),
                                                 self.tmp_path(f"{optimizer['kind']}-{foreach}.json"))
                        for foreach in (True, False)}
                self.assertLess(max_diff(runs[True], runs[False]), 1e-6)
                # Weight decay is part of what is compared: without it the parameters differ.
                plain = self.run_worker(dict(SYNTHETIC, epochs=3, optimizer=dict(optimizer, weight_decay=0)),
                                        self.tmp_path(f"{optimizer['kind']}-plain.json"))
                self.assertGreater(max_diff(plain, runs[True]), 1e-4)

    def test_multi_tensor_gradient_clipping_computes_what_libtorchs_does(self):
        # A max norm well below the gradients' so that every step is clipped.
        spec = dict(SYNTHETIC, epochs=3, optimizer={"kind": "sgd", "lr": 0.5, "momentum": 0.9})
        runs = {foreach: self.run_worker(dict(spec, clip_grad_norm=0.05, optimizer=dict(spec["optimizer"], foreach=foreach)),
                                         self.tmp_path(f"clip-{foreach}.json"))
                for foreach in (True, False)}
        self.assertLess(max_diff(runs[True], runs[False]), 1e-6)
        unclipped = self.run_worker(spec, self.tmp_path("unclipped.json"))
        self.assertGreater(max_diff(unclipped, runs[True]), 1e-3)

    def test_a_checkpoint_of_the_multi_tensor_optimiser_resumes_with_libtorchs_and_back(self):
        # Adam's moments and SGD's momentum must survive the round trip: a resume without them
        # lands elsewhere.
        for optimizer in ({"kind": "adam", "lr": 3e-3}, {"kind": "adamw", "lr": 3e-3, "weight_decay": 0.05},
                          {"kind": "sgd", "lr": 0.05, "momentum": 0.9}):
            spec = dict(SYNTHETIC, epochs=3, checkpoint_every=1, optimizer=optimizer)
            full = self.run_worker(spec, self.tmp_path("full.json"))
            for first, then in ((True, False), (False, True)):
                with self.subTest(optimizer=optimizer["kind"], first=first, then=then):
                    ck = self.tmp_path(f"ck-{optimizer['kind']}-{first}")
                    self.run_worker(dict(spec, epochs=2, optimizer=dict(optimizer, foreach=first)),
                                    self.tmp_path("two.json"), env={"GPUQ_CHECKPOINT_DIR": ck})
                    resumed, events = self.run_worker_with_events(
                        dict(spec, optimizer=dict(optimizer, foreach=then)), f"resumed-{first}",
                        env={"GPUQ_CHECKPOINT_DIR": ck})
                    self.assertEqual(events[-1]["resumed_from_epoch"], 2)
                    self.assertLess(max_diff(full, resumed), 1e-6)

    @unittest.skipUnless(os.path.exists(FASHION), "needs dataset-fashion-mnist")
    def test_fashion_mnist_mlp_through_the_daemon_reaches_0_80(self):
        spec = {"name": "fmnist", "gpus": 1,
                "train": {"dataset": {"kind": "fashion-mnist", "limit": 20000}, "model": {"hidden": [128]},
                          "epochs": 2, "batch_size": 64, "log_every": 100}}
        job_id = self.d.submit(spec)["ids"][0]
        job = self.d.wait([job_id], timeout=600)[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.assertGreaterEqual(job["result"]["test_accuracy"], 0.80)
        self.assertEqual(job["result"]["epochs"], 2)
        self.assertEqual(job["progress"]["epoch"], 2)  # per-epoch progress events arrived
        self.assertIn("fashion-mnist: 20000 train, 10000 test, 784 features, 10 classes", self.d.ok("logs", str(job_id)))

    def test_a_train_job_whose_csv_lacks_its_label_column_fails_saying_so_in_its_reason(self):
        data = self.tmp_path("points.csv")
        with open(data, "w") as f:
            f.write("x,y,target\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)))
        job_id = self.d.submit({"name": "nolabel", "train": {"dataset": {"kind": "csv", "path": data}}})["ids"][0]
        job = self.d.wait([job_id], timeout=120)[job_id]
        self.assertEqual(job["state"], "failed")
        # The worker's own message, not only "rank 0 exited with code 1", in status, show and wait.
        self.assertRegex(job["reason"], r'^rank 0 exited with code \d+: gpuq-worker: .*has no column "label"')
        self.assertIn('has no column \\"label\\"', self.d.ok("status", "--json"))
        self.assertIn('has no column "label"', self.d.show(job_id)["first_failure"]["message"])

    def test_training_that_diverges_fails_as_diverged_unless_the_spec_trains_on(self):
        diverging = {"dataset": {"kind": "synthetic", "task": "regression", "samples": 2000, "features": 16},
                     "model": {"hidden": [32]}, "optimizer": {"kind": "sgd", "lr": 10}, "epochs": 2, "seed": 3}
        job_id = self.d.submit({"name": "diverges", "train": diverging})["ids"][0]
        job = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(job["state"], "failed")  # it ended `succeeded` with a NaN loss
        self.assertIn("training diverged (the loss is not finite)", job["reason"])
        self.assertIn("training diverged at epoch 1", job["reason"])
        self.assertEqual(self.d.show(job_id)["first_failure"]["class"], "diverged")
        on = self.d.submit({"name": "trains-on", "train": dict(diverging, on_nonfinite="continue")})["ids"][0]
        self.assertEqual(self.d.wait([on], timeout=300)[on]["state"], "succeeded")

    def test_optimiser_state_that_does_not_fit_the_model_is_dropped_with_a_warning_not_a_crash(self):
        # The optimiser state of a model with the same number of tensors but other shapes.
        spec = dict(SYNTHETIC, epochs=1, checkpoint_every=1, optimizer={"kind": "adam", "lr": 3e-3})
        ck, other = self.tmp_path("ck"), self.tmp_path("ck-other")
        self.run_worker(spec, self.tmp_path("one.json"), env={"GPUQ_CHECKPOINT_DIR": ck})
        self.run_worker(dict(spec, model={"hidden": [16, 32]}), self.tmp_path("other.json"),
                        env={"GPUQ_CHECKPOINT_DIR": other})
        shutil.copy(os.path.join(other, "epoch-1", "optimizer-state.pt"),
                    os.path.join(ck, "epoch-1", "optimizer-state.pt"))
        r = subprocess.run([WORKER, "--train", json.dumps(dict(spec, epochs=2)), "--checkpoint-dir", ck],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("resumed from the checkpoint of epoch 1", r.stdout)
        self.assertIn("the checkpoint's optimiser state does not fit this model (parameter 0's exp_avg has "
                      "another shape than the parameter)", r.stderr)
        self.assertIn("epoch 2: loss", r.stdout)

    def test_a_checkpoint_of_an_earlier_gpuq_with_libtorchs_optimiser_archive_still_resumes(self):
        # tests/fixtures/checkpoint-libtorch-1.13: epoch 1 of `spec`, written by gpuq-worker before
        # the portable optimiser format, on LibTorch 1.13. Its Adam moments must come back (a
        # resume without them ends ~0.07 away); a LibTorch 2.x misreads the archive and drops it.
        spec = dict(SYNTHETIC, epochs=2, checkpoint_every=1, optimizer={"kind": "adam", "lr": 3e-3})
        full = self.run_worker(spec, self.tmp_path("full.json"))
        ck = self.tmp_path("ck")
        shutil.copytree(os.path.join(REPO, "tests/fixtures/checkpoint-libtorch-1.13"), ck)
        r = subprocess.run([WORKER, "--train", json.dumps(spec), "--checkpoint-dir", ck,
                            "--dump-params", self.tmp_path("resumed.json")], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("resumed from the checkpoint of epoch 1", r.stdout)
        if r.stderr.find("LibTorch optimiser archive that this LibTorch version misreads") >= 0:
            version = subprocess.run([WORKER, "--version"], capture_output=True, text=True).stdout
            self.assertNotIn("LibTorch 1.", version, "LibTorch 1.x must read its own archive")
        else:
            self.assertNotIn("does not fit", r.stderr)
            self.assertLess(max_diff(full, load(self.tmp_path("resumed.json"))), 1e-4)
        # The next checkpoint is in the portable format.
        self.assertTrue(os.path.exists(os.path.join(ck, "epoch-2", "optimizer-state.pt")))
        self.assertEqual(load(os.path.join(ck, "epoch-2", "state.json"))["optimizer"]["kind"], "adam")

    def test_checkpoints_older_than_the_two_newest_are_deleted_and_a_nested_dir_is_made(self):
        # The pruning that killed every GPU train job at its third checkpoint (see the next test).
        ck = self.tmp_path("ck-prune/a/b")
        self.run_worker(dict(SYNTHETIC, epochs=4, checkpoint_every=1), self.tmp_path("four.json"),
                        env={"GPUQ_CHECKPOINT_DIR": ck})
        self.assertEqual(sorted(os.listdir(ck)), ["epoch-3", "epoch-4", "latest"])
        self.assertEqual(read_text(os.path.join(ck, "latest")), "epoch-4")
        self.assertEqual(sorted(os.listdir(os.path.join(ck, "epoch-4"))),
                         ["model.pt", "optimizer-state.pt", "state.json"])

    def test_gpuq_worker_calls_no_std_filesystem_function(self):
        # PyTorch's wheels export a copy of std::filesystem from libtorch.so, and the dynamic
        # linker binds the worker's calls to it: with LibTorch 2.11 (cu130) its remove_all jumped
        # to address 0 at every train job's third checkpoint. The worker uses POSIX calls instead.
        r = subprocess.run(["nm", "-D", "--undefined-only", WORKER], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("_ZN", r.stdout, "nm listed no C++ symbol at all: the check would see nothing")
        imported = [line.split()[-1] for line in r.stdout.splitlines() if "St10filesystem" in line]
        self.assertEqual(imported, [])

    def test_resuming_after_a_kill_gives_the_same_parameters_as_an_uninterrupted_run(self):
        spec = dict(RESUMABLE, seed=4241)
        full = self.run_worker(spec, self.tmp_path("full.json"), env={"GPUQ_CHECKPOINT_DIR": self.tmp_path("ck-full")})
        ck = self.tmp_path("ck-cut")
        proc = subprocess.Popen([WORKER, "--train", json.dumps(spec), "--checkpoint-dir", ck], stdout=subprocess.DEVNULL)
        latest = os.path.join(ck, "latest")
        # Killed at the first checkpoint seen, whichever epoch a loaded machine let the test see:
        # what is compared is the resumed run's parameters, from wherever it resumed.
        wait_until(lambda: read_text(latest).startswith("epoch-"), timeout=600, interval=0.02,
                   what="a first checkpoint")
        proc.kill()
        proc.wait()
        self.assertLess(int(read_text(latest).split("-")[1]), spec["epochs"],
                        "the run finished before it could be interrupted")
        resumed = self.run_worker(spec, self.tmp_path("resumed.json"), env={"GPUQ_CHECKPOINT_DIR": ck})
        self.assertLess(max_diff(full, resumed), 1e-5)

    def test_a_retried_train_job_resumes_from_its_checkpoint(self):
        # Six epochs: on a loaded machine the test may first see the checkpoint of a later epoch
        # than the first; the job is killed then, and must resume from that one.
        spec = {"name": "resumable", "retries": 1, "train": dict(RESUMABLE, seed=4242, epochs=6)}
        job_id = self.d.submit(spec)["ids"][0]
        latest = os.path.join(self.d.state, "jobs", str(job_id), "checkpoints", "latest")
        wait_until(lambda: read_text(latest).startswith("epoch-"), timeout=600, interval=0.02,
                   what="a first checkpoint")
        pids = pids_matching('"seed":4242')
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

        def dead(pid):  # gone, or a zombie: it makes no more system calls
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True
        wait_until(lambda: all(dead(p) for p in pids), what="the killed rank to be dead")
        epoch = int(read_text(latest).split("-")[1])  # the last written before the kill
        self.assertTrue(pids and epoch < 6, "the job finished before it could be killed")
        job = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.assertEqual(job["attempt"], 2)
        self.assertEqual(job["result"]["resumed_from_epoch"], epoch)
        self.assertIn(f"resumed from the checkpoint of epoch {epoch}", self.d.ok("logs", str(job_id)))
        self.assertIn("was killed by signal 9", self.d.show(job_id)["history"][2]["reason"])

    def test_a_restarted_train_job_resumes_from_its_last_checkpoint_and_reports_that_models_scores(self):
        job_id = self.d.submit({"name": "done", "train": SYNTHETIC})["ids"][0]
        first = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(first["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.d.ok("restart", str(job_id))
        again = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(again["state"], "succeeded", self.d.ok("logs", str(job_id)))
        # Nothing left to train: the checkpoint's model is evaluated, not reported as zeros.
        self.assertEqual(again["result"]["resumed_from_epoch"], SYNTHETIC["epochs"])
        self.assertEqual(again["result"]["steps"], first["result"]["steps"])
        self.assertAlmostEqual(again["result"]["test_accuracy"], first["result"]["test_accuracy"], places=6)
        self.assertAlmostEqual(again["result"]["test_loss"], first["result"]["test_loss"], places=5)
        self.d.ok("restart", "--fresh", str(job_id))
        fresh = self.d.wait([job_id], timeout=300)[job_id]
        self.assertNotIn("resumed_from_epoch", fresh["result"])
        self.assertEqual(fresh["attempt"], 3)
        self.assertNotIn("resumed from the checkpoint", self.d.ok("logs", str(job_id)))

    @unittest.skipUnless(subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0,
                         "needs PyTorch for " + TORCH_PYTHON)
    def test_a_torchscript_model_defined_in_python_trains_and_its_loss_falls(self):
        model = self.tmp_path("net.pt")
        subprocess.run([TORCH_PYTHON, os.path.join(REPO, "jobs/examples/script_model.py"), model, "--features", "16"],
                       check=True, capture_output=True)
        job_id = self.d.submit({"name": "scripted", "train": {
            "dataset": {"kind": "synthetic", "samples": 3000, "features": 16}, "model": {"kind": "torchscript", "path": model},
            "epochs": 3, "log_every": 5}})["ids"][0]
        job = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        lines = read_text(os.path.join(job["job_dir"], "attempt-1", "events-0.jsonl")).splitlines()
        events = [json.loads(line) for line in lines]
        losses = [e["loss"] for e in events if e["type"] == "progress" and "test_loss" not in e]
        self.assertGreater(len(losses), 5)
        self.assertLess(losses[-1], 0.5 * losses[0])
        self.assertGreater(job["result"]["test_accuracy"], 0.9)

    @unittest.skipUnless(os.path.exists(FASHION), "needs dataset-fashion-mnist")
    def test_a_cnn_with_batch_norm_trains_on_images(self):
        job_id = self.d.submit({"name": "cnn", "train": {
            "dataset": {"kind": "fashion-mnist", "limit": 3000}, "epochs": 1, "checkpoint_every": 0,
            "model": {"kind": "cnn", "channels": [8, 16], "batch_norm": True, "hidden": [32]}}})["ids"][0]
        job = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.assertGreater(job["result"]["test_accuracy"], 0.6)

    def test_a_model_split_into_stages_trains_exactly_like_the_whole_model(self):
        # On the CPU every stage shares one device: the same code path as stages on several GPUs.
        spec = dict(SYNTHETIC, model={"hidden": [32, 16, 8]}, checkpoint_every=0)
        whole = self.run_worker(spec, self.tmp_path("whole.json"))
        job_id = self.d.submit({"name": "staged", "gpus": 2, "shell":
                                f"exec {WORKER} --train '{json.dumps(dict(spec, stages=[1, 2, 1]))}' "
                                f"--dump-params {self.tmp_path('staged.json')}"})["ids"][0]
        job = self.d.wait([job_id], timeout=300)[job_id]
        self.assertEqual(job["state"], "succeeded", self.d.ok("logs", str(job_id)))
        self.assertEqual(max_diff(whole, load(self.tmp_path("staged.json"))), 0.0)

    def test_a_step_replayed_from_a_cuda_graph_trains_exactly_like_eager_steps(self):
        # Without CUDA the graph is emulated: each replay runs the captured passes again. What this
        # checks is the trainer's data flow around a graph (static batches refilled for every
        # micro-batch, gradients left to the replay, the loss read from the capture's output).
        for extra in ({}, {"accumulate": 2, "data_on": "host"}):
            spec = dict(SYNTHETIC, batch_size=32, model={"hidden": [32, 16], "dropout": 0.2}, optimizer={"kind": "adam"},
                        checkpoint_every=0, log_every=3, **extra)
            eager, eager_events = self.run_worker_with_events(spec, f"eager-{len(extra)}")
            name = f"graph-{len(extra)}"
            events = self.tmp_path(name + ".jsonl")
            r = subprocess.run([WORKER, "--train", json.dumps(dict(spec, cuda_graph="on")), "--emulate-cuda-graph",
                                "--dump-params", self.tmp_path(name + ".json")], capture_output=True, text=True,
                               env=dict(os.environ, GPUQ_EVENTS=events), timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("step 4 captured into a CUDA graph (emulated)", r.stdout)
            graph_events = [json.loads(line) for line in read_text(events).splitlines()]
            self.assertEqual(max_diff(eager, load(self.tmp_path(name + ".json"))), 0.0, extra)
            losses = lambda evs: [e["loss"] for e in evs if e["type"] == "progress"]
            self.assertGreater(len(losses(eager_events)), 10)
            self.assertEqual(losses(graph_events), losses(eager_events), extra)
            self.assertIs(graph_events[-1]["cuda_graph"], True)
            self.assertIs(eager_events[-1]["cuda_graph"], False)

    def test_a_failed_capture_falls_back_to_eager_steps_under_auto_and_fails_the_run_under_on(self):
        spec = dict(SYNTHETIC, batch_size=32, accumulate=2, checkpoint_every=0)
        eager = self.run_worker(spec, self.tmp_path("eager.json"))
        flags = ["--emulate-cuda-graph", "--fail-capture"]
        events = self.tmp_path("auto.jsonl")
        r = subprocess.run([WORKER, "--train", json.dumps(dict(spec, cuda_graph="auto")), *flags,
                            "--dump-params", self.tmp_path("auto.json")], capture_output=True, text=True,
                           env=dict(os.environ, GPUQ_EVENTS=events), timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("CUDA graph capture failed: operation not permitted when stream is capturing (emulated); "
                      "eager steps from here", r.stderr)
        # The step whose capture failed still trains, on its own batches: nothing is lost or repeated.
        self.assertEqual(max_diff(eager, load(self.tmp_path("auto.json"))), 0.0)
        self.assertIs(json.loads(read_text(events).splitlines()[-1])["cuda_graph"], False)
        r = subprocess.run([WORKER, "--train", json.dumps(dict(spec, cuda_graph="on")), *flags], capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("gpuq-worker: rank 0: CUDA graph capture failed: operation not permitted", r.stderr)
        # Where nothing would be captured the test aid is refused, not silently ignored.
        for train, why in ((dict(spec, cuda_graph="auto"), "no CUDA device"), (spec, 'train.cuda_graph is "off"')):
            r = subprocess.run([WORKER, "--train", json.dumps(train), "--fail-capture"], capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"--fail-capture: this run captures no CUDA graph: {why}", r.stderr)

    def test_cuda_graph_on_without_a_gpu_is_an_error_and_auto_trains_eagerly_saying_why(self):
        r = self.d.run("submit", "-", input=json.dumps({"name": "g", "train": dict(SYNTHETIC, device="cpu", cuda_graph="on")}))
        self.assertEqual(r.returncode, 4)
        self.assertIn("field `train.cuda_graph`: \"on\" cannot capture this step: train.device is \"cpu\"", r.stderr)
        on, auto = self.d.submit([{"name": "on", "train": dict(SYNTHETIC, cuda_graph="on")},
                                  {"name": "auto", "train": dict(SYNTHETIC, cuda_graph="auto")}])["ids"]
        jobs = self.d.wait([on, auto], timeout=300)
        self.assertEqual((jobs[on]["state"], jobs[on]["exit_code"]), ("failed", 2))
        self.assertIn('train.cuda_graph is "on" but this step cannot be captured: no CUDA device',
                      self.d.ok("logs", str(on)))
        self.assertEqual(jobs[auto]["state"], "succeeded", self.d.ok("logs", str(auto)))
        self.assertIs(jobs[auto]["result"]["cuda_graph"], False)
        self.assertIn("eager steps, no CUDA graph: no CUDA device", self.d.ok("logs", str(auto)))

    def test_a_bad_train_spec_is_refused_at_submit_with_its_field_path(self):
        r = self.d.run("submit", "-", input=json.dumps({"name": "t", "train": {"dataset": {"kind": "synthetic"},
                                                                             "optimizer": {"lr": "fast"}}}))
        self.assertEqual(r.returncode, 4)
        self.assertIn("job[0] (t): field `train.optimizer.lr` must be a number, got a string", r.stderr)

    def test_a_missing_dataset_fails_the_job_with_a_clear_message(self):
        job_id = self.d.submit({"name": "nodata", "train": {"dataset": {"kind": "idx", "path": self.tmp_path("none")}}})["ids"][0]
        job = self.d.wait([job_id])[job_id]
        self.assertEqual(job["state"], "failed")
        self.assertEqual(job["exit_code"], 2)
        self.assertIn("has no train-images-idx3-ubyte[.gz]", self.d.ok("logs", str(job_id)))


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(HAVE_WORKER, "gpuq-worker not built (GPUQ_WITH_TORCH=OFF or no LibTorch)")
class Preempted(DaemonTest):
    """gpuq-worker under preemption (docs/preemption.md): on the signal it saves a step checkpoint
    (weights, optimiser, sampler position, generators) and resumes from it bit for bit."""
    GPUS = "fake:2"
    # Two epochs of 500 steps a rank with dropout: a preemption lands mid-epoch, and the generators
    # matter to the result.
    SPEC = {"dataset": {"kind": "synthetic", "samples": 32000, "features": 64},
            "model": {"hidden": [128, 128], "dropout": 0.2}, "optimizer": {"kind": "adam"},
            "schedule": {"kind": "cosine"}, "epochs": 2, "batch_size": 32, "seed": 4243, "log_every": 20}

    def gang(self, name, **spec):
        shell = f"exec {WORKER} --train '{json.dumps(self.SPEC)}' --dump-params {self.tmp_path(name)}-$RANK.json"
        return self.d.submit({"name": name, "mode": "ddp", "gpus": 2, "shell": shell, **spec})["ids"][0]

    def test_a_preempted_ddp_train_job_resumes_from_its_step_and_ends_with_the_weights_of_an_uninterrupted_run(self):
        full = self.gang("full")
        self.assertEqual(self.d.wait([full], timeout=600)[full]["state"], "succeeded", self.d.ok("logs", str(full)))
        low = self.gang("low", preemptible=True, preempt_grace_s=120)
        wait_until(lambda: (self.d.show(low)["job"]["progress"] or {}).get("step", 0) >= 20, timeout=600,
                   what="the low job's first progress")
        urgent = self.d.submit({"name": "urgent", "gpus": 1, "priority": 10, "command": ["true"]})["ids"][0]
        done = self.d.wait([low, urgent], timeout=600)
        self.assertEqual(done[urgent]["state"], "succeeded", done[urgent]["reason"])
        self.assertEqual((done[low]["state"], done[low]["attempt"], done[low]["preemptions"]), ("succeeded", 2, 1),
                         self.d.ok("logs", str(low)))
        first = self.d.ok("logs", str(low), "--attempt", "1")
        # Mid-epoch (whichever epoch a loaded machine let it reach): a step checkpoint, resumed.
        self.assertRegex(first, r"rank 0: stop signal: saved the checkpoint of step \d+ \(epoch \d, step [1-9]\d* of it\)")
        self.assertRegex(self.d.ok("logs", str(low)), r"resumed from the checkpoint of step \d+ \(epoch \d")
        self.assertIn(f"preempted by job {urgent} (urgent): attempt 1 was stopped (it had checkpointed)",
                      [h["reason"] for h in self.d.show(low)["history"]])
        for rank in range(2):
            self.assertEqual(load(self.tmp_path(f"low-{rank}.json")), load(self.tmp_path(f"full-{rank}.json")),
                             f"rank {rank}'s weights differ from the uninterrupted run's")
