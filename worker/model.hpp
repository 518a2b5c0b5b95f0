// The models gpuq-worker trains (built-in mlp/cnn as stages of blocks, or a TorchScript module)
// and their checkpoints. An internal header of the worker's LibTorch TUs: it includes LibTorch.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/train_spec.hpp"

namespace gpuq::worker {

// The model being trained, behind one interface so the loop, DDP and checkpoints do not care
// which kind it is.
class Model {
 public:
  virtual ~Model() = default;
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  virtual std::vector<torch::Tensor> parameters() = 0;
  virtual std::vector<torch::Tensor> buffers() = 0;
  virtual void train(bool on) = 0;
};

// Builds the model of `spec` for samples of `shape` (C×H×W images, or {features}). `devices` has
// one entry per stage (`spec.stages`, one stage when unsplit): stage i's blocks live on
// devices[i] and activations move between them (model parallelism).
std::unique_ptr<Model> build_model(const common::TrainSpec& spec, const std::vector<int>& shape, int features,
                                   int outputs, const std::vector<torch::Device>& devices);

// Checkpoints: <dir>/epoch-<n>/{model.pt, optimizer-state.pt, state.json}, then <dir>/latest
// names the newest complete one (written last, atomically), so a crash mid-save leaves the
// previous checkpoint in force. The two newest are kept. Weights and optimiser state are plain
// tensor lists (state.json describes the optimiser's, see PortableOptimizerState), which every
// LibTorch version reads alike. Checkpoints of earlier gpuq versions hold LibTorch's optimiser
// archive (optimizer.pt) instead and are still read.
class Checkpoints {
 public:
  explicit Checkpoints(std::string dir) : m_dir(std::move(dir)) {}
  bool enabled() const { return !m_dir.empty(); }
  const std::string& path() const { return m_dir; }

  void save(Model& model, torch::optim::Optimizer& opt, nlohmann::json state, int epoch);
  // A checkpoint in the middle of an epoch (a stop signal's): as save(), named `step-N`, with the
  // random generators' states (`rng`: CPU first, then each CUDA device's) beside it.
  void save_step(Model& model, torch::optim::Optimizer& opt, nlohmann::json state, std::int64_t step,
                 const std::vector<torch::Tensor>& rng);

  struct Resumed {
    nlohmann::json state;           // what save() was given
    std::vector<torch::Tensor> rng;  // save_step()'s generator states; empty for an epoch's checkpoint
    std::string optimizer_dropped;  // why the optimiser state did not fit and was dropped, or ""
  };
  // Restores the newest checkpoint into `model` and `opt` (each optimiser tensor on its
  // parameter's device); nothing when there is none. Optimiser state that does not belong to
  // `opt` is dropped, not fatal: training goes on from the weights.
  std::optional<Resumed> load(Model& model, torch::optim::Optimizer& opt, const std::vector<torch::Device>& devices);

 private:
  // Writes the checkpoint into m_dir/name and points `latest` at it; removes `stale` (if any).
  void write(Model& model, torch::optim::Optimizer& opt, nlohmann::json state, const std::string& name,
             const std::vector<torch::Tensor>& rng, const std::string& stale);
  std::string m_dir;
  std::string m_step_dir;  // the last step checkpoint written by this run, removed by the next one
};

}  // namespace gpuq::worker
