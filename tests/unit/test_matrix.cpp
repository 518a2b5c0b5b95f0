// Job matrices: the cartesian product, typed and spliced placeholders, names, labels, `after`,
// and errors that name the job and the key.
#include <doctest/doctest.h>

#include "common/spec.hpp"

using gpuq::common::json;
using gpuq::common::parse_batch;

namespace {
std::vector<gpuq::common::JobSpec> jobs_of(const std::string& text) {
  auto r = parse_batch(json::parse(text), "/w");
  if (!r.ok()) FAIL(r.error().message);
  return *r;
}
std::string error_of(const std::string& text) {
  auto r = parse_batch(json::parse(text), "/w");
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}
bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
}  // namespace

TEST_SUITE_BEGIN("matrix");

TEST_CASE("a matrix makes one job per combination, the last key varying fastest") {
  const auto jobs = jobs_of(R"({"name": "sweep", "matrix": {"lr": [0.1, 0.3], "seed": [1, 2, 3]},
                                "command": ["python3", "train.py", "--lr={lr}", "--seed", "{seed}"]})");
  REQUIRE(jobs.size() == 6);
  CHECK(jobs[0].command == std::vector<std::string>{"python3", "train.py", "--lr=0.1", "--seed", "1"});
  CHECK(jobs[1].command[4] == "2");
  CHECK(jobs[5].command == std::vector<std::string>{"python3", "train.py", "--lr=0.3", "--seed", "3"});
  // Names get the values appended; each job is labelled with its values.
  CHECK(jobs[0].name == "sweep-0.1-1");
  CHECK(jobs[5].name == "sweep-0.3-3");
  CHECK(jobs[4].labels == std::map<std::string, json>{{"lr", 0.3}, {"seed", 2}});  // as typed
}

TEST_CASE("a string that is only a placeholder takes the value's type, so train sections get numbers") {
  const auto jobs = jobs_of(R"({"name": "mlp-h{hidden}", "matrix": {"hidden": [64, 128], "lr": [0.05]},
      "labels": {"lr": "mine"},
      "env": {"LR": "{lr}", "HOME": "${HOME}/{hidden}"},
      "train": {"dataset": {"kind": "synthetic"}, "model": {"kind": "mlp", "hidden": ["{hidden}"]},
                "optimizer": {"kind": "sgd", "lr": "{lr}"}, "epochs": 1}})");
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[1].name == "mlp-h128");  // the name had a placeholder: nothing appended
  CHECK(jobs[1].train["model"]["hidden"] == json::array({128}));
  CHECK(jobs[1].train["optimizer"]["lr"] == 0.05);
  CHECK(jobs[1].env.at("LR") == "0.05");  // env values are strings: the text
  CHECK(jobs[1].env.at("HOME") == "${HOME}/128");  // ${...} is the shell's
  CHECK(jobs[0].labels.at("lr") == "mine");  // the spec's own label wins
  CHECK(jobs[0].labels.at("hidden") == 64);
}

TEST_CASE("a value may be a list: whole where the placeholder is a whole string, its JSON elsewhere") {
  const auto jobs = jobs_of(R"({"name": "mlp", "matrix": {"hidden": [[64], [256, 128]]}, "env": {"H": "{hidden}"},
      "train": {"dataset": {"kind": "synthetic"}, "model": {"kind": "mlp", "hidden": "{hidden}"}, "epochs": 1}})");
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[1].train["model"]["hidden"] == json::array({256, 128}));
  CHECK(jobs[1].name == "mlp-256x128");
  CHECK(jobs[1].labels.at("hidden") == "[256,128]");
  CHECK(jobs[1].env.at("H") == "[256,128]");
}

TEST_CASE("`after` naming a matrix job waits for all of its jobs; placeholders pair jobs up") {
  const auto jobs = jobs_of(R"([
      {"name": "train", "matrix": {"lr": [1, 2]}, "shell": "train {lr}"},
      {"name": "eval-{lr}", "matrix": {"lr": [1, 2]}, "after": ["train-{lr}"], "shell": "eval {lr}"},
      {"name": "report", "after": ["train"], "shell": "report"}])");
  REQUIRE(jobs.size() == 5);
  CHECK(jobs[2].name == "eval-1");
  REQUIRE(jobs[2].after.size() == 1);
  CHECK(jobs[2].after[0].name == "train-1");
  REQUIRE(jobs[4].after.size() == 2);
  CHECK(jobs[4].after[0].name == "train-1");
  CHECK(jobs[4].after[1].name == "train-2");
  CHECK(jobs[0].shell == "train 1");
}

TEST_CASE("matrix mistakes are errors that name the job and the key") {
  CHECK(contains(error_of(R"({"name": "s", "matrix": {"lr": [0.1], "seed": [1, 2]}, "shell": "run {lr}"})"),
                 "job[0] (s): field `matrix.seed` is used nowhere: put {seed} in a string of the spec"));
  CHECK(contains(error_of(R"({"matrix": {"lr": []}, "shell": "{lr}"})"), "field `matrix.lr` must be a list of 1-10000 values, got 0 values"));
  CHECK(contains(error_of(R"({"matrix": {"lr": 0.1}, "shell": "{lr}"})"), "field `matrix.lr` must be a list"));
  CHECK(contains(error_of(R"({"matrix": {"lr": [{"a": 1}]}, "shell": "{lr}"})"),
                 "values must be strings, numbers, booleans or lists of them, got an object"));
  CHECK(contains(error_of(R"({"matrix": {"1x": [1]}, "shell": "{1x}"})"), "a matrix key is 1-64 letters"));
  CHECK(contains(error_of(R"({"matrix": [1, 2], "shell": "x"})"), "field `matrix` must be an object of value lists"));
  CHECK(contains(error_of(R"({"matrix": {"a": [1,2,3,4,5,6,7,8,9,10], "b": [1,2,3,4,5,6,7,8,9,10], "c": [1,2,3,4,5,6,7,8,9,10],
                                          "d": [1,2,3,4,5,6,7,8,9,10], "e": [1,2,3,4,5,6,7,8,9,10], "f": [1,2]},
                              "shell": "{a}{b}{c}{d}{e}{f}"})"),
                 "field `matrix` makes more than 100000 jobs"));
  const std::string big(1000, 'x');
  CHECK(contains(error_of(R"({"matrix": {"a": [1,2,3,4,5,6,7,8,9,10], "b": [1,2,3,4,5,6,7,8,9,10], "c": [1,2,3,4,5,6,7,8,9,10],
                                          "d": [1,2,3,4,5,6,7,8,9,10], "e": [1,2,3,4,5,6,7,8,9,10]},
                              "shell": "{a}{b}{c}{d}{e})" + big + R"("})"),
                 "field `matrix` makes 100000 jobs of 1027 bytes each, over 16 MiB of specs in all"));
  // Expanded jobs are checked like any other: a value that makes a bad field is reported.
  CHECK(contains(error_of(R"({"name": "g", "matrix": {"n": [1, -1]}, "gpus": "{n}", "shell": "x"})"),
                 "field `gpus` must be between 0 and 1024, got -1"));
  CHECK(contains(error_of(R"({"name": "dup", "matrix": {"x": ["a b", "a_b"]}, "shell": "{x}"})"),
                 "name also used by"));
  // A stored job never has one.
  CHECK(contains(gpuq::common::parse_job(json::parse(R"({"shell": "x", "matrix": {"a": [1]}})"), "/").error().message,
                 "field `matrix` is expanded when a batch is submitted"));
}

TEST_CASE("jobs without a matrix pass through unchanged") {
  const auto jobs = jobs_of(R"([{"name": "a", "shell": "echo {not_a_key}"}, {"name": "b", "matrix": {"k": ["x"]}, "shell": "echo {k}"}])");
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[0].shell == "echo {not_a_key}");
  CHECK(jobs[0].labels.empty());
  CHECK(jobs[1].shell == "echo x");
  CHECK(jobs[1].name == "b-x");
}

TEST_SUITE_END();
