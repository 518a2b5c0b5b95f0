// The `train` section: defaults, strictness with full field paths, and train jobs in a batch.
#include <doctest/doctest.h>

#include "common/spec.hpp"
#include "common/train_spec.hpp"

using gpuq::common::json;

namespace {
std::string train_error(const std::string& text) {
  auto r = gpuq::common::parse_train(json::parse(text));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}
bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
}  // namespace

TEST_SUITE_BEGIN("train_spec");

TEST_CASE("a minimal train spec gets documented defaults") {
  auto r = gpuq::common::parse_train(json::parse(R"({"dataset": {"kind": "fashion-mnist"}})"));
  REQUIRE(r.ok());
  CHECK(r->dataset.path == "/usr/share/datasets/fashion-mnist");
  CHECK(r->model.hidden == std::vector<int>{256, 128});
  CHECK(r->optimizer.kind == "adam");
  CHECK(r->loss == "cross_entropy");
  CHECK(r->batch_size == 64);
  CHECK(r->accumulate == 1);
  CHECK(r->optimizer.foreach);
}

TEST_CASE("regression data defaults to mse and rejects class-based options") {
  auto r = gpuq::common::parse_train(json::parse(R"({"dataset": {"kind": "synthetic", "task": "regression"}})"));
  REQUIRE(r.ok());
  CHECK(r->loss == "mse");
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic", "task": "regression"}, "sampler": "weighted"})"),
            "weighted sampling needs class labels"));
}

TEST_CASE("nested typos and bad values name the full field path") {
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "optimizer": {"kind": "sgd", "lr": -1}})"),
            "field `train.optimizer.lr` must be between"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "optimizer": {"foreach": "yes"}})"),
            "field `train.optimizer.foreach` must be true or false, got a string"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "optimiser": {}})"),
            "unknown field `train.optimiser` (did you mean `train.optimizer`?)"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic", "featurs": 3}})"),
            "unknown field `train.dataset.featurs` (did you mean `train.dataset.features`?)"));
  CHECK(has(train_error(R"({"dataset": {"kind": "imagenet"}})"), "field `train.dataset.kind` must be one of"));
  CHECK(has(train_error(R"({"model": {"hidden": [0]}})"), "field `train.dataset` is required"));
  CHECK(has(train_error(R"({"dataset": {"kind": "csv"}})"), "`train.dataset.path` is needed"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "batch_size": 10, "accumulate": 4})"),
            "must be a multiple of `train.accumulate`"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic", "classes": 3, "class_weights": [1, 2]}})"),
            "one weight per class (3)"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "optimizer": {"kind": "adam", "momentum": 0.9}})"),
            "applies to sgd only"));
}

TEST_CASE("cnn, torchscript and schedule options are checked against the model they apply to") {
  auto cnn = gpuq::common::parse_train(json::parse(R"({"dataset": {"kind": "fashion-mnist"}, "model": {"kind": "cnn"}})"));
  REQUIRE(cnn.ok());
  CHECK(cnn->model.hidden == std::vector<int>{128});
  CHECK(cnn->model.channels == std::vector<int>{32, 64});
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "model": {"kind": "cnn"}})"), "a cnn needs image data"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "model": {"batch_norm": true}})"),
            "`train.model.batch_norm` applies to cnn models only"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "model": {"kind": "torchscript"}})"),
            "`train.model.path` is needed"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "model": {"kind": "torchscript", "path": "m.pt", "hidden": [3]}})"),
            "does not apply to a torchscript model"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "schedule": {"kind": "cosine", "gamma": 0.5}})"),
            "apply to the step schedule only"));
  auto step = gpuq::common::parse_train(
      json::parse(R"({"dataset": {"kind": "synthetic"}, "schedule": {"kind": "step", "step_size": 3, "gamma": 0.5}})"));
  REQUIRE(step.ok());
  auto again = gpuq::common::parse_train(gpuq::common::to_json(*step));
  REQUIRE(again.ok());
  CHECK(gpuq::common::to_json(*again) == gpuq::common::to_json(*step));
}

TEST_CASE("model-parallel stages must split the model's blocks exactly") {
  auto ok = gpuq::common::parse_train(
      json::parse(R"({"dataset": {"kind": "fashion-mnist"}, "model": {"kind": "cnn", "channels": [8, 8], "hidden": [16]},
                     "stages": [2, 2]})"));
  REQUIRE(ok.ok());
  CHECK(gpuq::common::model_blocks(ok->model) == 4);
  auto again = gpuq::common::parse_train(gpuq::common::to_json(*ok));  // the stored form parses back
  REQUIRE(again.ok());
  CHECK(again->stages == std::vector<int>{2, 2});
  auto unsplit = gpuq::common::parse_train(gpuq::common::to_json(*gpuq::common::parse_train(json::parse(R"({"dataset": {"kind": "synthetic"}})"))));
  REQUIRE(unsplit.ok());
  CHECK(unsplit->stages.empty());
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "model": {"hidden": [8]}, "stages": [1, 2]})"),
            "must split the model's 2 blocks (conv blocks, hidden layers, output layer), but adds up to 3"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "model": {"kind": "torchscript", "path": "m.pt"}, "stages": [1]})"),
            "a torchscript model runs on one device"));
}

TEST_CASE("a ddp job of model-parallel replicas gets one rank per group of stage GPUs") {
  auto hybrid = gpuq::common::parse_batch(json::parse(R"({"name": "h", "mode": "ddp", "gpus": 4,
      "train": {"dataset": {"kind": "synthetic"}, "model": {"hidden": [8]}, "stages": [1, 1]}})"), "/");
  REQUIRE(hybrid.ok());
  CHECK(hybrid->at(0).ranks == 2);
  CHECK(hybrid->at(0).gpus == 4);
  auto odd = gpuq::common::parse_batch(json::parse(R"({"name": "h", "mode": "ddp", "gpus": 3,
      "train": {"dataset": {"kind": "synthetic"}, "model": {"hidden": [8]}, "stages": [1, 1]}})"), "/");
  REQUIRE_FALSE(odd.ok());
  CHECK(has(odd.error().message, "field `gpus` (3) must be a multiple of the 2 `train.stages`"));
  auto wrong_ranks = gpuq::common::parse_batch(json::parse(R"({"name": "h", "mode": "ddp", "gpus": 4, "ranks": 4,
      "train": {"dataset": {"kind": "synthetic"}, "model": {"hidden": [8]}, "stages": [1, 1]}})"), "/");
  REQUIRE_FALSE(wrong_ranks.ok());
  CHECK(has(wrong_ranks.error().message, "field `ranks` (4) must equal `gpus` (4) / 2 stages"));
  auto cpu = gpuq::common::parse_batch(json::parse(R"({"name": "h", "mode": "ddp", "ranks": 2,
      "train": {"dataset": {"kind": "synthetic"}, "model": {"hidden": [8]}, "stages": [1, 1]}})"), "/");
  REQUIRE(cpu.ok());
  CHECK(cpu->at(0).ranks == 2);
}

TEST_CASE("precision, data placement and bucket size are checked and kept") {
  auto r = gpuq::common::parse_train(json::parse(
      R"({"dataset": {"kind": "synthetic"}, "precision": "bf16", "data_on": "host", "bucket_mb": 0.5})"));
  REQUIRE(r.ok());
  auto again = gpuq::common::parse_train(gpuq::common::to_json(*r));
  REQUIRE(again.ok());
  CHECK(again->precision == "bf16");
  CHECK(again->data_on == "host");
  CHECK(again->bucket_mb == doctest::Approx(0.5));
  auto defaults = gpuq::common::parse_train(json::parse(R"({"dataset": {"kind": "synthetic"}})"));
  REQUIRE(defaults.ok());
  CHECK(defaults->precision == "fp32");
  CHECK(defaults->data_on == "auto");
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "precision": "fp8"})"), "train.precision"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "precision": "fp16", "device": "cpu"})"),
            "fp16 needs CUDA; on the CPU use \"bf16\""));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "bucket_mb": 0})"), "train.bucket_mb"));
}

TEST_CASE("cuda_graph is off by default, kept, and \"on\" is refused where the spec rules capture out") {
  const auto parse = [](const std::string& text) { return gpuq::common::parse_train(json::parse(text)); };
  auto defaults = parse(R"({"dataset": {"kind": "synthetic"}})");
  REQUIRE(defaults.ok());
  CHECK(defaults->cuda_graph == "off");
  CHECK(gpuq::common::cuda_graph_obstacle(*defaults).empty());
  auto on = parse(R"({"dataset": {"kind": "synthetic"}, "cuda_graph": "on", "accumulate": 2, "precision": "bf16"})");
  REQUIRE(on.ok());
  auto again = gpuq::common::parse_train(gpuq::common::to_json(*on));
  REQUIRE(again.ok());
  CHECK(again->cuda_graph == "on");
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "cuda_graph": true})"), "train.cuda_graph"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "cuda_graph": "on", "device": "cpu"})"),
            "field `train.cuda_graph`: \"on\" cannot capture this step: train.device is \"cpu\""));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "cuda_graph": "on", "precision": "fp16"})"),
            "fp16's loss scale changes between steps"));
  CHECK(has(train_error(R"({"dataset": {"kind": "synthetic"}, "cuda_graph": "on",
                           "model": {"kind": "torchscript", "path": "m.pt"}})"),
            "torchscript"));
  // "auto" takes the same specs and leaves the choice to the worker.
  auto fallback = parse(R"({"dataset": {"kind": "synthetic"}, "cuda_graph": "auto", "precision": "fp16"})");
  REQUIRE(fallback.ok());
  CHECK(gpuq::common::cuda_graph_obstacle(*fallback) == "fp16's loss scale changes between steps");
}

TEST_CASE("a train job in a batch runs the worker with its normalised spec") {
  auto r = gpuq::common::parse_batch(
      json::parse(R"({"name": "t", "train": {"dataset": {"kind": "synthetic"}, "epochs": 3}, "gpus": 1})"), "/w");
  REQUIRE(r.ok());
  const auto& s = r->at(0);
  CHECK(s.train["epochs"] == 3);
  REQUIRE(s.command.size() == 3);
  CHECK(s.command[0] == gpuq::common::k_worker_placeholder);
  CHECK(json::parse(s.command[2]) == s.train);
  // The stored form keeps `train`, and parses back to the same job.
  auto stored = gpuq::common::to_json(s);
  CHECK(stored.contains("train"));
  CHECK_FALSE(stored.contains("command"));
  auto again = gpuq::common::parse_job(stored, "/");
  REQUIRE(again.ok());
  CHECK(again->command == s.command);
}

TEST_CASE("train errors in a batch carry the job's name") {
  auto r = gpuq::common::parse_batch(json::parse(R"({"name": "t", "train": {"dataset": {"kind": "synthetic"}, "epochs": 0}})"), "/");
  REQUIRE_FALSE(r.ok());
  CHECK(has(r.error().message, "job[0] (t): field `train.epochs` must be between 1 and"));
}

TEST_SUITE_END();

#include <filesystem>
#include <fstream>

TEST_SUITE_BEGIN("train_spec");

TEST_CASE("every bundled example job spec is valid") {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(GPUQ_SOURCE_DIR "/jobs")) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path().string());
    std::ifstream in(entry.path());
    auto parsed = gpuq::common::parse_batch(json::parse(in), "/");
    CHECK_MESSAGE(parsed.ok(), (parsed.ok() ? "" : parsed.error().message));
    ++files;
  }
  CHECK(files >= 4);
}

TEST_SUITE_END();
