// The LibTorch training loop (see trainer.hpp). DDP is done by hand on c10d process groups:
// parameters are broadcast from rank 0, gradients are averaged with bucketed allreduces after
// each optimiser step's backward passes, so every rank applies the same update. The dataset is
// held on the device and batches are gathered there with index_select: no host round trip per
// batch, so the input pipeline cannot starve the GPU for datasets that fit.
#include "worker/trainer.hpp"

#include <torch/script.h>
#include <torch/torch.h>

#ifdef GPUQ_HAVE_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef GPUQ_HAVE_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#if defined(GPUQ_HAVE_GLOO) || defined(GPUQ_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include <nlohmann/json.hpp>

#include "worker/data.hpp"
#include "worker/sampler.hpp"

namespace gpuq::worker {

using json = nlohmann::json;

std::string available_backends() {
  std::string b;
#ifdef GPUQ_HAVE_GLOO
  b += "gloo";
#endif
#ifdef GPUQ_HAVE_NCCL
  b += b.empty() ? "nccl" : ",nccl";
#endif
  return b.empty() ? "none" : b;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Appends gpuq event lines; a no-op without an events file.
class Events {
 public:
  explicit Events(const std::string& path) {
    if (!path.empty()) m_out.open(path, std::ios::app);
  }
  void emit(json event) {
    if (!m_out) return;
    m_out << event.dump() << "\n";
    m_out.flush();
  }

 private:
  std::ofstream m_out;
};

// The collectives a rank needs, independent of the backend class (ProcessGroup in LibTorch 1.x,
// Backend in 2.x).
struct Collectives {
  std::function<void(std::vector<torch::Tensor>&)> allreduce_sum;
  std::function<void(std::vector<torch::Tensor>&)> broadcast_from_0;
  std::string backend = "none";
};

Collectives connect(const RunOptions& o, const torch::Device& device) {
  Collectives c;
  if (o.world == 1) {
    c.allreduce_sum = [](std::vector<torch::Tensor>&) {};
    c.broadcast_from_0 = [](std::vector<torch::Tensor>&) {};
    return c;
  }
#if defined(GPUQ_HAVE_GLOO) || defined(GPUQ_HAVE_NCCL)
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(o.master_port);
  store_options.isServer = o.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(o.world);
  store_options.timeout = std::chrono::minutes(5);
  auto store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
  auto bind = [&c](auto pg) {
    c.allreduce_sum = [pg](std::vector<torch::Tensor>& t) {
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      pg->allreduce(t, opts)->wait();
    };
    c.broadcast_from_0 = [pg](std::vector<torch::Tensor>& t) {
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      pg->broadcast(t, opts)->wait();
    };
  };
  if (device.is_cuda()) {
#ifdef GPUQ_HAVE_NCCL
    bind(c10::make_intrusive<c10d::ProcessGroupNCCL>(store, o.rank, o.world));
    c.backend = "nccl";
    return c;
#else
    throw std::runtime_error("DDP on CUDA needs NCCL, which this build of gpuq-worker lacks (backends: " +
                             available_backends() + ")");
#endif
  }
#ifdef GPUQ_HAVE_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.master_addr));
  bind(c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world, options));
  c.backend = "gloo";
  return c;
#else
  throw std::runtime_error("DDP on the CPU needs Gloo, which this build of gpuq-worker lacks (backends: " +
                           available_backends() + ")");
#endif
#else
  (void)device;
  throw std::runtime_error("this build of gpuq-worker has no c10d backend; it cannot run DDP ranks");
#endif
}

// The model being trained: a torch::nn stack (mlp, cnn) or a TorchScript module, behind one
// interface so the loop, DDP and checkpoints do not care which.
class Model {
 public:
  virtual ~Model() = default;
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  virtual std::vector<torch::Tensor> parameters() = 0;
  virtual std::vector<torch::Tensor> buffers() = 0;
  virtual void train(bool on) = 0;
  virtual void to(const torch::Device& device) = 0;
};

// A torch::nn model as consecutive stages, each on its own device (model parallelism); an
// ordinary model is one stage. Activations move to the next stage's device between stages.
class NnModel : public Model {
 public:
  NnModel(std::vector<torch::nn::Sequential> stages, std::vector<torch::Device> devices, std::vector<std::int64_t> input_shape)
      : m_stages(std::move(stages)), m_devices(std::move(devices)), m_shape(std::move(input_shape)) {}
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
  // A single-stage model moves to `device`; stages of a split model stay on their own devices.
  void to(const torch::Device& device) override {
    if (m_stages.size() == 1) m_devices[0] = device;
    for (std::size_t i = 0; i < m_stages.size(); ++i) m_stages[i]->to(m_devices[i]);
  }

 private:
  std::vector<torch::nn::Sequential> m_stages;
  std::vector<torch::Device> m_devices;
  std::vector<std::int64_t> m_shape;  // {-1, ...sample shape}
};

class ScriptModel : public Model {
 public:
  explicit ScriptModel(torch::jit::Module module) : m_module(std::move(module)) {}
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
  void to(const torch::Device& device) override { m_module.to(device); }

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

// `stages` (blocks per stage) places consecutive blocks on the job's devices: stage i on GPU i,
// or every stage on the one device there is (the same code path, for CPU tests).
std::unique_ptr<Model> build_model(const common::TrainSpec& spec, const std::vector<int>& shape, int features, int out,
                                   const torch::Device& device) {
  const auto& m = spec.model;
  if (m.kind == "torchscript") {
    if (!std::filesystem::exists(m.path)) throw std::runtime_error("the TorchScript model " + m.path + " does not exist");
    try {
      return std::make_unique<ScriptModel>(torch::jit::load(m.path));
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
  std::vector<int> stages = spec.stages.empty() ? std::vector<int>{static_cast<int>(blocks.size())} : spec.stages;
  const int gpus = device.is_cuda() ? static_cast<int>(torch::cuda::device_count()) : 1;
  std::vector<torch::nn::Sequential> stage_modules;
  std::vector<torch::Device> devices;
  std::size_t next = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    torch::nn::Sequential stage;
    for (int k = 0; k < stages[i]; ++k) stage->push_back(blocks.at(next++));
    stage_modules.push_back(stage);
    devices.push_back(device.is_cuda() ? torch::Device(torch::kCUDA, static_cast<int>(i) % gpus) : device);
  }
  return std::make_unique<NnModel>(stage_modules, devices, input_shape);
}

// Checkpoints: <dir>/epoch-<n>/{model.pt, optimizer.pt, state.json}, then <dir>/latest names the
// newest complete one (written last, atomically), so a crash mid-save leaves the previous
// checkpoint in force. The two newest are kept.
class Checkpoints {
 public:
  explicit Checkpoints(std::string dir) : m_dir(std::move(dir)) {}
  bool enabled() const { return !m_dir.empty(); }

  void save(Model& model, torch::optim::Optimizer& opt, const json& state, int epoch) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(m_dir) / ("epoch-" + std::to_string(epoch));
    fs::create_directories(dir);
    std::vector<torch::Tensor> tensors;
    for (auto& t : model.parameters()) tensors.push_back(t.detach().cpu());
    for (auto& t : model.buffers()) tensors.push_back(t.detach().cpu());
    torch::save(tensors, (dir / "model.pt").string());
    torch::save(opt, (dir / "optimizer.pt").string());
    std::ofstream(dir / "state.json") << state.dump();
    const fs::path tmp = fs::path(m_dir) / "latest.tmp";
    std::ofstream(tmp) << dir.filename().string();
    fs::rename(tmp, fs::path(m_dir) / "latest");
    const fs::path old = fs::path(m_dir) / ("epoch-" + std::to_string(epoch - 2));
    std::error_code ec;
    fs::remove_all(old, ec);
  }

  // Restores the newest checkpoint into `model` and `opt`; returns its state, or null.
  json load(Model& model, torch::optim::Optimizer& opt, const torch::Device& device) {
    namespace fs = std::filesystem;
    std::ifstream latest(fs::path(m_dir) / "latest");
    std::string name;
    if (!enabled() || !std::getline(latest, name)) return nullptr;
    const fs::path dir = fs::path(m_dir) / name;
    std::vector<torch::Tensor> tensors;
    torch::load(tensors, (dir / "model.pt").string());
    auto params = model.parameters();
    auto buffers = model.buffers();
    if (tensors.size() != params.size() + buffers.size())
      throw std::runtime_error("checkpoint " + dir.string() + " does not match this model (" +
                               std::to_string(tensors.size()) + " tensors, the model has " +
                               std::to_string(params.size() + buffers.size()) + ")");
    {
      torch::NoGradGuard no_grad;
      std::size_t i = 0;
      for (auto& p : params) p.copy_(tensors[i++]);
      for (auto& b : buffers) b.copy_(tensors[i++]);
    }
    torch::load(opt, (dir / "optimizer.pt").string(), device);
    std::ifstream in(dir / "state.json");
    return json::parse(in);
  }

  std::string path() const { return m_dir; }

 private:
  std::string m_dir;
};

double learning_rate(const common::TrainSpec& spec, int epoch, std::int64_t step, std::int64_t total_steps) {
  const double base = spec.optimizer.lr;
  if (spec.schedule.kind == "step") return base * std::pow(spec.schedule.gamma, (epoch - 1) / spec.schedule.step_size);
  if (spec.schedule.kind == "cosine" && total_steps > 0)
    return base * 0.5 * (1 + std::cos(M_PI * static_cast<double>(step) / static_cast<double>(total_steps)));
  return base;
}

void set_learning_rate(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) group.options().set_lr(lr);
}

std::unique_ptr<torch::optim::Optimizer> build_optimizer(const common::OptimizerSpec& o,
                                                         std::vector<torch::Tensor> params) {
  if (o.kind == "sgd")
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  if (o.kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr).weight_decay(o.weight_decay));
}

// Applies a collective to `tensors` in buckets of about 25 MiB, each flattened into one tensor (as
// DDP's reducer does): a model of many small layers costs few collectives, and c10d takes one
// tensor per device per call.
void bucketed(const std::vector<torch::Tensor>& tensors, const std::function<void(torch::Tensor&)>& collective) {
  constexpr std::int64_t k_bucket_bytes = 25 << 20;
  std::vector<torch::Tensor> bucket;
  std::int64_t bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    std::vector<torch::Tensor> views;
    for (auto& t : bucket) views.push_back(t.reshape(-1));
    auto flat = torch::cat(views);
    collective(flat);
    std::int64_t offset = 0;
    for (auto& t : bucket) {
      t.view(-1).copy_(flat.narrow(0, offset, t.numel()));
      offset += t.numel();
    }
    bucket.clear();
    bytes = 0;
  };
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    bucket.push_back(t);
    bytes += t.numel() * static_cast<std::int64_t>(t.element_size());
    if (bytes >= k_bucket_bytes) flush();
  }
  flush();
}

void average_gradients(const std::vector<torch::Tensor>& params, Collectives& comm, int world) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  bucketed(grads, [&](torch::Tensor& flat) {
    std::vector<torch::Tensor> one{flat};
    comm.allreduce_sum(one);
    flat.div_(world);
  });
}

void broadcast_parameters(const std::vector<torch::Tensor>& tensors, Collectives& comm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> floats;  // one dtype per flattened bucket; integer counters agree anyway
  for (const auto& t : tensors)
    if (t.is_floating_point()) floats.push_back(t);
  bucketed(floats, [&](torch::Tensor& flat) {
    std::vector<torch::Tensor> one{flat};
    comm.broadcast_from_0(one);
  });
}

torch::Tensor to_tensor(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  return torch::from_blob(const_cast<float*>(v.data()), {rows, cols}, torch::kFloat32).clone();
}

torch::Tensor loss_of(const torch::Tensor& out, const torch::Tensor& y, bool classification) {
  // The output lives on the last stage's device (model parallelism): bring the labels there.
  auto target = y.to(out.device());
  return classification ? torch::nn::functional::cross_entropy(out, target) : torch::mse_loss(out.squeeze(1), target);
}

}  // namespace

int train_or_throw(const RunOptions& o);

int train(const RunOptions& o) {
  try {
    return train_or_throw(o);
  } catch (const c10::Error& e) {  // its what() carries a C++ backtrace: not for a job log
    std::cerr << "gpuq-worker: rank " << o.rank << ": " << e.what_without_backtrace() << "\n";
    return 1;
  }
}

int train_or_throw(const RunOptions& o) {
  const auto& spec = o.spec;
  const auto t_start = std::chrono::steady_clock::now();

  // Pick the device: the rank's GPU when the job has GPUs (every rank sees the gang's GPUs in
  // rank order, so LOCAL_RANK indexes its own), else the CPU.
  const bool cuda = spec.device == "cuda" || (spec.device == "auto" && torch::cuda::is_available());
  if (spec.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "gpuq-worker: train.device is \"cuda\" but no CUDA device is visible\n";
    return 2;
  }
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, o.local_rank) : torch::Device(torch::kCPU);

  // Load the data and hold it on the device
  auto data = load_dataset(spec.dataset, spec.seed);
  if (!data) {
    std::cerr << "gpuq-worker: " << data.error().message << "\n";
    return 2;
  }
  const bool classification = data->classes > 0;
  const int outputs = classification ? data->classes : 1;
  auto x_train = to_tensor(data->train.x, data->train.n, data->features).to(device);
  auto x_test = to_tensor(data->test.x, data->test.n, data->features).to(device);
  auto y_of = [&](const Split& s) {
    return classification ? torch::tensor(s.labels, torch::kInt64).to(device) : torch::tensor(s.targets).to(device);
  };
  auto y_train = y_of(data->train), y_test = y_of(data->test);
  std::cout << "rank " << o.rank << "/" << o.world << " on " << device.str() << ": " << data->description << std::endl;

  // Build the model and join the process group
  torch::manual_seed(spec.seed);
  auto model = build_model(spec, data->shape, data->features, outputs, device);
  model->to(device);
  auto params = model->parameters();
  Collectives comm;
  try {
    comm = connect(o, device);
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::cerr << "gpuq-worker: rank " << o.rank << ": cannot join the process group: "
              << (c10_error ? c10_error->what_without_backtrace() : e.what()) << "\n";
    return 3;
  }
  broadcast_parameters(params, comm);  // identical start on every rank
  broadcast_parameters(model->buffers(), comm);
  auto optimizer = build_optimizer(spec.optimizer, params);
  Events events(o.rank == 0 ? o.events : "");

  // Resume from the newest checkpoint, if a previous attempt left one (every rank reads it)
  Checkpoints checkpoints(spec.checkpoint_every > 0 ? o.checkpoint_dir : "");
  std::int64_t step = 0, samples = 0;
  double train_seconds = 0, test_loss = 0, test_accuracy = 0, last_loss = 0;
  int first_epoch = 1;
  if (json state = checkpoints.load(*model, *optimizer, device); !state.is_null()) {
    first_epoch = state.value("epoch", 0) + 1;
    step = state.value("step", std::int64_t{0});
    samples = state.value("samples", std::int64_t{0});
    train_seconds = state.value("train_seconds", 0.0);
    std::cout << "rank " << o.rank << ": resumed from the checkpoint of epoch " << first_epoch - 1 << " in "
              << checkpoints.path() << std::endl;
  }

  // Train
  const std::vector<double> weights =
      spec.sampler == "weighted" ? inverse_class_frequency(data->train.labels, data->classes) : std::vector<double>{};
  const int micro = spec.batch_size / spec.accumulate;
  const std::int64_t steps_per_epoch = (data->train.n + o.world - 1) / o.world / spec.batch_size;
  for (int epoch = first_epoch; epoch <= spec.epochs; ++epoch) {
    torch::manual_seed(spec.seed + static_cast<std::uint64_t>(epoch));  // dropout: same masks after a resume
    auto order = spec.sampler == "weighted"
                     ? weighted_indices(weights, data->train.n, o.rank, o.world, spec.seed, epoch)
                     : shard_indices(data->train.n, o.rank, o.world, spec.seed, epoch, spec.sampler == "shuffle");
    auto idx = torch::tensor(order, torch::kInt64).to(device);
    const std::int64_t steps = static_cast<std::int64_t>(order.size()) / spec.batch_size;  // drop the last partial batch
    const auto t_epoch = std::chrono::steady_clock::now();
    model->train(true);
    for (std::int64_t s = 0; s < steps; ++s) {
      set_learning_rate(*optimizer, learning_rate(spec, epoch, step, steps_per_epoch * spec.epochs));
      optimizer->zero_grad();
      double step_loss = 0;
      for (int m = 0; m < spec.accumulate; ++m) {
        auto rows = idx.narrow(0, s * spec.batch_size + m * micro, micro);
        auto loss = loss_of(model->forward(x_train.index_select(0, rows)), y_train.index_select(0, rows), classification) /
                    spec.accumulate;
        loss.backward();
        step_loss += loss.item<double>();
      }
      if (o.world > 1) average_gradients(params, comm, o.world);
      if (spec.clip_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, spec.clip_grad_norm);
      optimizer->step();
      ++step;
      samples += spec.batch_size;
      last_loss = step_loss;
      if (step % spec.log_every == 0)
        events.emit({{"type", "progress"}, {"epoch", epoch}, {"step", step}, {"loss", step_loss},
                     {"samples_per_s", samples * o.world / (train_seconds + seconds_since(t_epoch))}});
    }
    train_seconds += seconds_since(t_epoch);
    broadcast_parameters(model->buffers(), comm);  // batch-norm statistics: rank 0's, everywhere

    // Evaluate on the test split
    model->train(false);
    {
      torch::NoGradGuard no_grad;
      double loss_sum = 0, correct = 0;
      for (std::int64_t i = 0; i < data->test.n; i += 4096) {
        const std::int64_t n = std::min<std::int64_t>(4096, data->test.n - i);
        auto out = model->forward(x_test.narrow(0, i, n));
        auto y = y_test.narrow(0, i, n);
        loss_sum += loss_of(out, y, classification).item<double>() * static_cast<double>(n);
        if (classification) correct += out.argmax(1).eq(y.to(out.device())).sum().item<double>();
      }
      test_loss = loss_sum / static_cast<double>(data->test.n);
      test_accuracy = correct / static_cast<double>(data->test.n);
    }
    json progress = {{"type", "progress"}, {"epoch", epoch}, {"step", step}, {"loss", last_loss}, {"test_loss", test_loss}};
    if (classification) progress["test_accuracy"] = test_accuracy;
    events.emit(progress);
    std::cout << "rank " << o.rank << " epoch " << epoch << ": loss " << last_loss << ", test_loss " << test_loss
              << (classification ? ", test_accuracy " + std::to_string(test_accuracy) : std::string()) << std::endl;

    if (o.rank == 0 && checkpoints.enabled() && (epoch % spec.checkpoint_every == 0 || epoch == spec.epochs))
      checkpoints.save(*model, *optimizer,
                       {{"epoch", epoch}, {"step", step}, {"samples", samples}, {"train_seconds", train_seconds}}, epoch);
  }

  // Every rank's throughput, gathered by an allreduce of one-hot slots
  const double rank_rate = train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0;
  std::vector<torch::Tensor> rates{torch::zeros({o.world}, torch::kFloat64).to(device)};
  rates[0][o.rank] = rank_rate;
  comm.allreduce_sum(rates);
  auto per_rank = rates[0].cpu();

  if (!o.dump_params.empty()) {
    json flat = json::array();
    for (const auto& p : params) {
      auto c = p.detach().cpu().contiguous().view(-1);
      for (std::int64_t i = 0; i < c.numel(); ++i) flat.push_back(c[i].item<float>());
    }
    std::ofstream(o.dump_params) << flat.dump();
  }
  if (o.rank == 0) {
    json result = {{"test_loss", test_loss}, {"epochs", spec.epochs}, {"steps", step}, {"world_size", o.world},
                   {"device", device.str()}, {"backend", comm.backend}, {"train_seconds", train_seconds},
                   {"wall_seconds", seconds_since(t_start)}, {"samples_per_s", per_rank.sum().item<double>()}};
    if (classification) result["test_accuracy"] = test_accuracy;
    if (checkpoints.enabled()) result["checkpoint"] = checkpoints.path();
    if (first_epoch > 1) result["resumed_from_epoch"] = first_epoch - 1;
    json ranks = json::array();
    for (int r = 0; r < o.world; ++r) ranks.push_back(per_rank[r].item<double>());
    result["rank_samples_per_s"] = ranks;
    result["type"] = "result";
    events.emit(result);
  }
  return 0;
}

}  // namespace gpuq::worker
