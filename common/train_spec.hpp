// The `train` section of a job spec: what gpuq-worker trains (docs/job-spec.md, "train jobs").
// Parsed here, without LibTorch, so gpuqd rejects a bad train spec at submit with the same strict,
// field-naming messages as the rest of the job spec.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace gpuq::common {

struct DatasetSpec {
  std::string kind = "synthetic";  // fashion-mnist | mnist | idx | csv | synthetic
  std::string path;                // idx kinds: directory of the four IDX files; csv: the training file
  std::string test_path;           // csv: the test file; without it a test_fraction is split off
  double test_fraction = 0.2;      // csv without test_path, synthetic
  std::string label_column = "label";  // csv
  std::string task = "classification";  // synthetic: or regression
  std::int64_t samples = 10000;         // synthetic: training + test
  int features = 32;                    // synthetic
  int classes = 10;                     // synthetic classification
  std::vector<double> class_weights;    // synthetic: class proportions (imbalanced data)
  std::int64_t limit = 0;               // use at most this many training samples (0 = all)
};

struct ModelSpec {
  std::string kind = "mlp";           // mlp | cnn | torchscript
  std::vector<int> hidden{256, 128};  // dense layers (cnn: after the conv blocks; default [128])
  std::string activation = "relu";    // relu | gelu | tanh
  double dropout = 0;
  std::vector<int> channels{32, 64};  // cnn: one 3x3 conv block per entry, each halving H and W
  bool batch_norm = false;            // cnn: batch norm after each conv
  std::string path;                   // torchscript: a module saved with torch.jit.save
};

struct ScheduleSpec {
  std::string kind = "none";  // none | step | cosine
  int step_size = 1;          // step: epochs between decays
  double gamma = 0.1;         // step: decay factor
};

struct OptimizerSpec {
  std::string kind = "adam";  // sgd | adam | adamw
  double lr = 1e-3;
  double momentum = 0;  // sgd
  double weight_decay = 0;
  bool foreach = true;  // update all parameters with multi-tensor kernels (false: one at a time)
};

struct TrainSpec {
  DatasetSpec dataset;
  ModelSpec model;
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  std::string loss = "auto";  // cross_entropy | mse | auto (from the dataset's task)
  int epochs = 1;
  int batch_size = 64;  // per rank, per optimiser step (split into `accumulate` micro-batches)
  int accumulate = 1;
  double clip_grad_norm = 0;  // 0 = off
  std::string sampler = "shuffle";  // shuffle | sequential | weighted (inverse class frequency)
  std::uint64_t seed = 0;
  int log_every = 50;  // optimiser steps between progress events
  std::string device = "auto";  // auto (CUDA when the job has a GPU) | cpu | cuda
  int checkpoint_every = 1;     // epochs between checkpoints (when a checkpoint dir is known); 0 = off
  std::vector<int> stages;      // model parallel: blocks per stage, stage i on the job's i-th GPU
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (autocast; fp16 with dynamic loss scaling, CUDA only)
  std::string data_on = "auto";    // auto | device | host (pinned, prefetched by a thread)
  double bucket_mb = 25;           // ddp: gradient allreduce bucket size
  // off | auto | on: replay each step's forward and backward passes from a CUDA graph (auto: when
  // the step can be captured, else eager steps; on: a step that cannot be captured is an error)
  std::string cuda_graph = "off";
  std::string on_nonfinite = "fail";  // a NaN or infinite loss at an epoch's end: "fail" the job, or "continue"
};

// Why the training step of `spec` cannot be replayed from a CUDA graph, or "" where nothing in the
// spec stops it. The worker adds what only the run tells: a GPU, a single process, one device.
std::string cuda_graph_obstacle(const TrainSpec& spec);

// Blocks of an mlp or cnn model, the units `stages` splits: one per conv block, one per hidden
// dense layer, and the output layer.
int model_blocks(const ModelSpec& model);

// `who` prefixes messages ("job[0] (mnist)"); problems are appended to `errors`.
TrainSpec parse_train(const nlohmann::json& obj, const std::string& who, std::vector<std::string>& errors);
Result<TrainSpec> parse_train(const nlohmann::json& obj);
nlohmann::json to_json(const TrainSpec& spec);

}  // namespace gpuq::common
