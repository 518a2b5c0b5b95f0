// Model construction (mlp, cnn, TorchScript) and checkpoints; see model.hpp.
#include "worker/model.hpp"

#include <torch/script.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "common/paths.hpp"
#include "worker/optim.hpp"

// From torch/csrc/jit/codegen/fuser/interface.h, which not every LibTorch package ships (Debian's
// does not); exported by libtorch_cpu since 1.x.
namespace torch::jit {
TORCH_API void overrideCanFuseOnCPU(bool value);
}

namespace gpuq::worker {

using json = nlohmann::json;

namespace {

void write_or_throw(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw std::runtime_error("checkpoint: cannot write " + path + ": " + std::strerror(errno));
}

// A torch::nn model as consecutive stages, each on its own device (model parallelism); an
// ordinary model is one stage. Activations move to the next stage's device between stages.
class NnModel : public Model {
 public:
  NnModel(std::vector<torch::nn::Sequential> stages, std::vector<torch::Device> devices, std::vector<std::int64_t> input_shape)
      : m_stages(std::move(stages)), m_devices(std::move(devices)), m_shape(std::move(input_shape)) {
    for (std::size_t i = 0; i < m_stages.size(); ++i) m_stages[i]->to(m_devices[i]);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor h = x.view(m_shape);
    for (std::size_t i = 0; i < m_stages.size(); ++i) h = m_stages[i]->forward(h.to(m_devices[i]));
    return h;
  }
  std::vector<torch::Tensor> parameters() override {
    std::vector<torch::Tensor> out;
    for (auto& s : m_stages)
      for (auto& p : s->parameters()) out.push_back(p);
    return out;
  }
  std::vector<torch::Tensor> buffers() override {
    std::vector<torch::Tensor> out;
    for (auto& s : m_stages)
      for (auto& b : s->buffers()) out.push_back(b);
    return out;
  }
  void train(bool on) override {
    for (auto& s : m_stages) s->train(on);
  }

 private:
  std::vector<torch::nn::Sequential> m_stages;
  std::vector<torch::Device> m_devices;
  std::vector<std::int64_t> m_shape;  // {-1, ...sample shape}
};

class ScriptModel : public Model {
 public:
  ScriptModel(torch::jit::Module module, const torch::Device& device) : m_module(std::move(module)) {
    m_module.to(device);
  }
  torch::Tensor forward(const torch::Tensor& x) override { return m_module.forward({x}).toTensor(); }
  std::vector<torch::Tensor> parameters() override {
    std::vector<torch::Tensor> out;
    for (const auto& p : m_module.parameters()) out.push_back(p);
    return out;
  }
  std::vector<torch::Tensor> buffers() override {
    std::vector<torch::Tensor> out;
    for (const auto& b : m_module.buffers()) out.push_back(b);
    return out;
  }
  void train(bool on) override { m_module.train(on); }

 private:
  torch::jit::Module m_module;
};

// One block of layers. A Sequential cannot hold a Sequential (its forward is a template), so
// blocks are a Sequential with a concrete forward, as LibTorch's documentation suggests.
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(x); }
};
TORCH_MODULE(Block);

void add_activation(Block& seq, const std::string& kind) {
  if (kind == "gelu") seq->push_back(torch::nn::GELU());
  else if (kind == "tanh") seq->push_back(torch::nn::Tanh());
  else seq->push_back(torch::nn::ReLU());
}

// Dense blocks: one per hidden layer (linear, activation, dropout), then the output layer.
void add_dense(std::vector<Block>& blocks, const common::ModelSpec& m, int in, int out, bool flatten) {
  for (int h : m.hidden) {
    Block b;
    if (flatten) b->push_back(torch::nn::Flatten()), flatten = false;
    b->push_back(torch::nn::Linear(in, h));
    add_activation(b, m.activation);
    if (m.dropout > 0) b->push_back(torch::nn::Dropout(m.dropout));
    blocks.push_back(b);
    in = h;
  }
  Block last;
  if (flatten) last->push_back(torch::nn::Flatten());
  last->push_back(torch::nn::Linear(in, out));
  blocks.push_back(last);
}

}  // namespace

std::unique_ptr<Model> build_model(const common::TrainSpec& spec, const std::vector<int>& shape, int features, int out,
                                   const std::vector<torch::Device>& devices) {
  const auto& m = spec.model;
  if (m.kind == "torchscript") {
    if (!common::path_exists(m.path)) throw std::runtime_error("the TorchScript model " + m.path + " does not exist");
    // TorchScript fuses CPU ops only where LibTorch was built with LLVM (PyTorch's wheels are
    // not; Debian's is), and with Debian 13's LibTorch 2.6 that LLVM code generation never
    // finishes: CPU graphs run unfused, as under PyTorch's own builds. CUDA fusion is untouched.
    torch::jit::overrideCanFuseOnCPU(false);
    try {
      return std::make_unique<ScriptModel>(torch::jit::load(m.path), devices.at(0));
    } catch (const c10::Error& e) {
      throw std::runtime_error("cannot load the TorchScript model " + m.path + ": " + e.what_without_backtrace());
    }
  }
  std::vector<Block> blocks;
  std::vector<std::int64_t> input_shape{-1, features};
  if (m.kind == "cnn") {
    if (shape.size() != 3) throw std::runtime_error("a cnn needs image data (C×H×W samples)");
    int c = shape[0], h = shape[1], w = shape[2];
    for (int ch : m.channels) {
      // conv 3x3 (same size) -> [batch norm] -> activation -> 2x2 max-pool (halves H and W)
      Block b;
      b->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(c, ch, 3).padding(1)));
      if (m.batch_norm) b->push_back(torch::nn::BatchNorm2d(ch));
      add_activation(b, m.activation);
      b->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
      blocks.push_back(b);
      c = ch, h /= 2, w /= 2;
    }
    if (h < 1 || w < 1) throw std::runtime_error("too many conv blocks for " + std::to_string(shape[1]) + "x" +
                                                 std::to_string(shape[2]) + " images");
    add_dense(blocks, m, c * h * w, out, true);
    input_shape = {-1, shape[0], shape[1], shape[2]};
  } else {
    add_dense(blocks, m, features, out, false);
  }
  const std::vector<int> stages = spec.stages.empty() ? std::vector<int>{static_cast<int>(blocks.size())} : spec.stages;
  if (devices.size() != stages.size())
    throw std::logic_error("build_model: " + std::to_string(devices.size()) + " devices for " +
                           std::to_string(stages.size()) + " stages");
  std::vector<torch::nn::Sequential> stage_modules;
  std::size_t next = 0;
  for (int blocks_in_stage : stages) {
    torch::nn::Sequential stage;
    for (int k = 0; k < blocks_in_stage; ++k) stage->push_back(blocks.at(next++));
    stage_modules.push_back(stage);
  }
  return std::make_unique<NnModel>(stage_modules, devices, input_shape);
}

void Checkpoints::save(Model& model, torch::optim::Optimizer& opt, json state, int epoch) {
  write(model, opt, std::move(state), "epoch-" + std::to_string(epoch), {}, "epoch-" + std::to_string(epoch - 2));
  if (!m_step_dir.empty()) {  // an epoch's checkpoint supersedes a step's
    std::string error;
    common::remove_tree(m_dir + "/" + m_step_dir, error);
    m_step_dir.clear();
  }
}

void Checkpoints::save_step(Model& model, torch::optim::Optimizer& opt, json state, std::int64_t step,
                            const std::vector<torch::Tensor>& rng) {
  const std::string name = "step-" + std::to_string(step);
  write(model, opt, std::move(state), name, rng, m_step_dir == name ? "" : m_step_dir);
  m_step_dir = name;
}

void Checkpoints::write(Model& model, torch::optim::Optimizer& opt, json state, const std::string& name,
                        const std::vector<torch::Tensor>& rng, const std::string& stale) {
  // POSIX calls, not std::filesystem: PyTorch's wheels export a copy of std::filesystem from
  // libtorch.so that the dynamic linker binds this program's calls to, and its remove_all jumped
  // to address 0 (LibTorch 2.11, cu130), killing every train job at its third checkpoint.
  const std::string dir = m_dir + "/" + name;
  if (auto made = common::make_dirs(dir); !made) throw std::runtime_error("checkpoint: " + made.error().message);
  std::vector<torch::Tensor> tensors;
  for (auto& t : model.parameters()) tensors.push_back(t.detach().cpu());
  for (auto& t : model.buffers()) tensors.push_back(t.detach().cpu());
  torch::save(tensors, dir + "/model.pt");
  auto optimizer = export_optimizer_state(opt);
  torch::save(optimizer.tensors, dir + "/optimizer-state.pt");
  state["optimizer"] = std::move(optimizer.meta);
  if (!rng.empty()) {
    torch::save(rng, dir + "/rng.pt");
    state["rng"] = rng.size();
  }
  write_or_throw(dir + "/state.json", state.dump());
  const std::string tmp = m_dir + "/latest.tmp";
  write_or_throw(tmp, name);
  if (::rename(tmp.c_str(), (m_dir + "/latest").c_str()) != 0)
    throw std::runtime_error("checkpoint: cannot rename " + tmp + ": " + std::strerror(errno));
  std::string error;  // an old checkpoint left behind costs disk, not correctness
  if (!stale.empty()) common::remove_tree(m_dir + "/" + stale, error);
  if (!error.empty()) std::cerr << "gpuq-worker: checkpoint: " << error << "\n";
}

std::optional<Checkpoints::Resumed> Checkpoints::load(Model& model, torch::optim::Optimizer& opt,
                                                     const std::vector<torch::Device>& devices) {
  std::ifstream latest(m_dir + "/latest");
  std::string name;
  if (!enabled() || !std::getline(latest, name)) return std::nullopt;
  const std::string dir = m_dir + "/" + name;
  std::vector<torch::Tensor> tensors;
  torch::load(tensors, dir + "/model.pt");
  auto params = model.parameters();
  auto buffers = model.buffers();
  if (tensors.size() != params.size() + buffers.size())
    throw std::runtime_error("checkpoint " + dir + " does not match this model (" +
                             std::to_string(tensors.size()) + " tensors, the model has " +
                             std::to_string(params.size() + buffers.size()) + ")");
  {
    torch::NoGradGuard no_grad;
    std::size_t i = 0;
    for (auto& p : params) p.copy_(tensors[i++]);
    for (auto& b : buffers) b.copy_(tensors[i++]);
  }
  Resumed out;
  std::ifstream in(dir + "/state.json");
  out.state = json::parse(in);
  if (out.state.value("rng", 0) > 0) torch::load(out.rng, dir + "/rng.pt");
  if (name.rfind("step-", 0) == 0) m_step_dir = name;  // removed once a later checkpoint is written
  if (out.state.contains("optimizer")) {
    PortableOptimizerState saved;
    torch::load(saved.tensors, dir + "/optimizer-state.pt");
    saved.meta = out.state["optimizer"];
    out.optimizer_dropped = import_optimizer_state(opt, saved);
  } else {
    // gpuq's checkpoints before the portable format: LibTorch's optimiser archive.
    bool one_device = true;
    for (const auto& d : devices) one_device = one_device && d == devices.at(0);
    if (one_device) torch::load(opt, dir + "/optimizer.pt", devices.at(0));
    else torch::load(opt, dir + "/optimizer.pt");
    if (!optimizer_state_fits(opt)) {
      opt.state().clear();
      out.optimizer_dropped = "it is a LibTorch optimiser archive that this LibTorch version misreads";
    }
  }
  return out;
}

}  // namespace gpuq::worker
