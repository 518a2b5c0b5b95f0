// The LibTorch training loop (see trainer.hpp): data placement and prefetch, mixed precision,
// the step (micro-batches, DDP gradient averaging, clipping, loss scaling), evaluation,
// checkpoints and events. Models live in model.cpp, process groups and the reducer in
// parallel.cpp: three LibTorch TUs that build in parallel.
#include "worker/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <torch/torch.h>
#include <torch/version.h>
#include <ATen/autocast_mode.h>
#ifdef GPUQ_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "worker/data.hpp"
#include "worker/loss_scale.hpp"
#include "worker/model.hpp"
#include "worker/optim.hpp"
#include "worker/parallel.hpp"
#include "worker/sampler.hpp"
#include "worker/step_graph.hpp"

namespace gpuq::worker {

using json = nlohmann::json;

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
  void emit(const json& event) {
    if (!m_out) return;
    m_out << event.dump() << "\n";
    m_out.flush();
  }

 private:
  std::ofstream m_out;
};

// Feeds the training micro-batches of an epoch in the sampler's order, from one of two places:
// - device: the dataset is held on the device and rows are gathered there (index_select), no
//   host work or copy per batch;
// - host: the dataset stays in host memory (page-locked when the device is a GPU); a thread
//   gathers the next batches ahead into fresh pinned tensors, and each is copied to the device
//   asynchronously (non_blocking), so gathering overlaps training. Only batches are pinned, not
//   the dataset; the caching host allocator keeps a pinned block from reuse until its copy is done.
// Both yield the same values: training is identical either way.
class Loader {
 public:
  Loader(torch::Tensor x, torch::Tensor y, const torch::Device& device, bool on_device)
      : m_device(device), m_on_device(on_device) {
    m_x = on_device ? x.to(device) : x;
    m_y = on_device ? y.to(device) : y;
  }
  ~Loader() { stop(); }
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  bool on_device() const { return m_on_device; }
  const torch::Tensor& x() const { return m_x; }
  const torch::Tensor& y() const { return m_y; }

  // Starts an epoch of `count` micro-batches of `micro` rows, taken from `order` in sequence.
  void start(const std::vector<std::int64_t>& order, std::int64_t micro, std::int64_t count) {
    stop();
    m_micro = micro;
    m_next = 0;
    m_order = torch::tensor(order, torch::kInt64);
    if (m_on_device) {
      m_order = m_order.to(m_device);
      return;
    }
    m_stopping = false;
    m_error = nullptr;
    m_thread = std::thread([this, count] { produce(count); });
  }

  std::pair<torch::Tensor, torch::Tensor> next() {
    if (m_on_device) {
      auto rows = m_order.narrow(0, m_next++ * m_micro, m_micro);
      return {m_x.index_select(0, rows), m_y.index_select(0, rows)};
    }
    auto [xb, yb] = pop_gathered();
    return {xb.to(m_device, /*non_blocking=*/true), yb.to(m_device, /*non_blocking=*/true)};
  }

  // The next micro-batch, written into `x` and `y` on the device (a CUDA graph's static inputs).
  void next_into(torch::Tensor& x, torch::Tensor& y) {
    if (m_on_device) {
      auto rows = m_order.narrow(0, m_next++ * m_micro, m_micro);
      torch::index_select_out(x, m_x, 0, rows);
      torch::index_select_out(y, m_y, 0, rows);
      return;
    }
    auto [xb, yb] = pop_gathered();
    x.copy_(xb, /*non_blocking=*/true);
    y.copy_(yb, /*non_blocking=*/true);
  }

  void stop() {
    if (!m_thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_stopping = true;
    }
    m_space.notify_all();
    m_thread.join();
    m_queue.clear();
  }

 private:
  static constexpr std::size_t k_depth = 4;  // batches gathered ahead

  // The next batch the thread gathered (host data), waiting for it if need be.
  std::pair<torch::Tensor, torch::Tensor> pop_gathered() {
    std::unique_lock<std::mutex> lock(m_mutex);
    m_ready.wait(lock, [this] { return !m_queue.empty() || m_error; });
    if (m_queue.empty()) std::rethrow_exception(m_error);
    auto batch = std::move(m_queue.front());
    m_queue.pop_front();
    m_space.notify_one();
    return batch;
  }

  void produce(std::int64_t count) {
    try {
      const bool pin = m_device.is_cuda();
      for (std::int64_t k = 0; k < count; ++k) {
        auto rows = m_order.narrow(0, k * m_micro, m_micro);
        auto xb = torch::empty({m_micro, m_x.size(1)}, m_x.options().pinned_memory(pin));
        auto yb = torch::empty({m_micro}, m_y.options().pinned_memory(pin));
        torch::index_select_out(xb, m_x, 0, rows);
        torch::index_select_out(yb, m_y, 0, rows);
        std::unique_lock<std::mutex> lock(m_mutex);
        m_space.wait(lock, [this] { return m_queue.size() < k_depth || m_stopping; });
        if (m_stopping) return;
        m_queue.emplace_back(std::move(xb), std::move(yb));
        m_ready.notify_one();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_error = std::current_exception();
      m_ready.notify_one();
    }
  }

  torch::Device m_device;
  bool m_on_device;
  torch::Tensor m_x, m_y, m_order;
  std::int64_t m_micro = 1, m_next = 0;
  std::thread m_thread;
  std::mutex m_mutex;
  std::condition_variable m_ready, m_space;
  std::deque<std::pair<torch::Tensor, torch::Tensor>> m_queue;
  bool m_stopping = false;
  std::exception_ptr m_error;
};

// The autocast switches of one device type, through LibTorch ≥ 2.4's per-device API or 1.x's
// CUDA/CPU pairs.
struct AutocastState {
  bool enabled = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

AutocastState get_autocast(c10::DeviceType type) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return {at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)};
#else
  if (type == c10::DeviceType::CUDA) return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
  return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
#endif
}

void set_autocast(c10::DeviceType type, AutocastState state) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_dtype(type, state.dtype);
  at::autocast::set_autocast_enabled(type, state.enabled);
#else
  if (type == c10::DeviceType::CUDA) at::autocast::set_autocast_gpu_dtype(state.dtype), at::autocast::set_enabled(state.enabled);
  else at::autocast::set_autocast_cpu_dtype(state.dtype), at::autocast::set_cpu_enabled(state.enabled);
#endif
}

// Autocast over a forward pass, as `with torch.autocast(device_type, dtype)` in Python: eligible
// ops (matmul, conv) run in `dtype`, the rest in fp32; parameters and gradients stay fp32.
class Autocast {
 public:
  Autocast(c10::DeviceType type, c10::ScalarType dtype, bool on) : m_type(type), m_on(on) {
    if (!m_on) return;
    m_before = get_autocast(type);
    set_autocast(type, {true, dtype});
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!m_on) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();  // the cast weights
    set_autocast(m_type, m_before);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType m_type;
  bool m_on;
  AutocastState m_before;
};

// Memory for progress events: what tensors hold on the rank's devices (CUDA caching allocator:
// current and peak), and the process's resident host memory.
json memory_fields(const std::vector<torch::Device>& devices) {
  auto mib = [](double bytes) { return std::round(bytes / (1024.0 * 1024.0) * 10) / 10; };  // 0.1 MiB
  json out;
#ifdef GPUQ_HAVE_CUDA
  double current = 0, peak = 0, reserved = 0;
  bool any = false;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (!devices[i].is_cuda() || (i > 0 && devices[i] == devices[0])) continue;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(devices[i].index());
    current += static_cast<double>(stats.allocated_bytes[0].current);  // [0]: all pools
    peak += static_cast<double>(stats.allocated_bytes[0].peak);
    reserved += static_cast<double>(stats.reserved_bytes[0].current);
    any = true;
  }
  if (any) {
    out["device_memory_mib"] = mib(current);
    out["device_memory_peak_mib"] = mib(peak);
    out["device_memory_reserved_mib"] = mib(reserved);
  }
#else
  (void)devices;
#endif
  long pages = 0, resident = 0;
  if (std::ifstream statm("/proc/self/statm"); statm >> pages >> resident)
    out["host_memory_mib"] = mib(static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)));
  return out;
}

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

torch::Tensor to_tensor(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  return torch::from_blob(const_cast<float*>(v.data()), {rows, cols}, torch::kFloat32).clone();
}

torch::Tensor loss_of(const torch::Tensor& out, const torch::Tensor& y, bool classification) {
  // The output lives on the last stage's device (model parallelism): bring the labels there. The
  // loss is computed in fp32 whatever precision the forward pass ran in.
  auto target = y.to(out.device());
  auto o = out.to(torch::kFloat32);
  return classification ? torch::nn::functional::cross_entropy(o, target) : torch::mse_loss(o.squeeze(1), target);
}

// The devices of this rank's stages: GPU `local_rank × stages + i` for stage i (every rank sees
// the gang's GPUs in rank order), or the CPU for all.
std::vector<torch::Device> stage_devices(const common::TrainSpec& spec, int local_rank, bool cuda) {
  const int stages = spec.stages.empty() ? 1 : static_cast<int>(spec.stages.size());
  const int gpus = cuda ? static_cast<int>(torch::cuda::device_count()) : 0;
  std::vector<torch::Device> out;
  for (int i = 0; i < stages; ++i)
    out.push_back(cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>((local_rank * stages + i) % gpus))
                       : torch::Device(torch::kCPU));
  return out;
}

// Where the dataset lives (`data_on`). "auto" holds it on the GPU when it takes at most half the
// job's GPU memory budget ($GPUQ_GPU_MEMORY_MB, set by gpuqd for jobs that declare
// gpu_memory_mb) and the copy succeeds; otherwise it stays on the host with prefetching.
bool data_on_device(const std::string& data_on, const torch::Device& device, std::int64_t bytes) {
  if (data_on != "auto" || !device.is_cuda()) return data_on != "host";
  if (const char* budget = std::getenv("GPUQ_GPU_MEMORY_MB"); budget && *budget)
    return bytes <= std::atoll(budget) * (1LL << 20) / 2;
  return true;
}

// A micro-batch (inputs, targets) by its index within the step.
using BatchOf = std::function<std::pair<torch::Tensor, torch::Tensor>(int)>;
// The forward and backward passes of one step's micro-batches; returns the step's loss.
using ForwardBackward = std::function<torch::Tensor(const BatchOf&)>;

// The step's forward and backward passes through a StepGraph: k_warmup eager steps on the graph's
// stream, then one capture that reads static batch buffers, then a replay per step after the
// buffers are refilled. Gradients are not cleared between replays: each replay writes them into
// the tensors the captured backward gave the parameters. The optimiser step stays eager (its step
// counts and learning rate change on the host), as in PyTorch's partial-network capture.
class GraphedStep {
 public:
  static constexpr int k_warmup = 3;

  // The capture failed: nothing was captured, and the static buffers hold the step's batches.
  // Errors of the warm-up steps, of loading data and of replays are not this.
  struct CaptureFailed : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  GraphedStep(std::unique_ptr<StepGraph> graph, const Loader& data, const torch::Device& device, int micro,
              int accumulate)
      : m_graph(std::move(graph)) {
    const auto x_options = data.x().options().device(device).pinned_memory(false);
    const auto y_options = data.y().options().device(device).pinned_memory(false);
    for (int m = 0; m < accumulate; ++m)
      m_inputs.emplace_back(torch::empty({micro, data.x().size(1)}, x_options), torch::empty({micro}, y_options));
  }

  bool captured() const { return m_captured; }
  // The static batch buffers: after a failed capture they hold that step's micro-batches.
  const std::vector<std::pair<torch::Tensor, torch::Tensor>>& inputs() const { return m_inputs; }

  // Runs one step's forward and backward passes and returns its loss (during replays, the same
  // tensor every step, rewritten). A failed capture throws CaptureFailed.
  torch::Tensor run(Loader& data, const std::vector<torch::Tensor>& params, const ForwardBackward& forward_backward) {
    if (m_eager_steps < k_warmup) {
      ++m_eager_steps;
      clear_gradients(params);
      return forward_backward([&](int) { return data.next(); });
    }
    for (auto& [x, y] : m_inputs) data.next_into(x, y);
    if (!m_captured) {
      clear_gradients(params);  // so the captured backward assigns gradients rather than adding to them
      try {
        m_graph->capture([&] { m_loss = forward_backward([this](int m) { return m_inputs[m]; }); });
      } catch (const c10::Error& e) {
        throw CaptureFailed(std::string("CUDA graph capture failed: ") + e.what_without_backtrace());
      } catch (const std::exception& e) {
        throw CaptureFailed(std::string("CUDA graph capture failed: ") + e.what());
      }
      m_captured = true;
    }
    m_graph->replay();
    return m_loss;
  }

 private:
  std::unique_ptr<StepGraph> m_graph;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> m_inputs;  // one (x, y) per micro-batch
  torch::Tensor m_loss;
  int m_eager_steps = 0;
  bool m_captured = false;
};

// Why this run's step cannot be replayed from a CUDA graph, or "": the spec's reasons, then the
// run's.
std::string cuda_graph_obstacle(const RunOptions& o, bool cuda, bool distributed,
                                const std::vector<torch::Device>& devices) {
  if (auto why = common::cuda_graph_obstacle(o.spec); !why.empty()) return why;
  if (!cuda && !o.emulate_cuda_graph) return "no CUDA device";
  if (distributed) return "a ddp rank averages its gradients by collectives outside the graph";
  for (const auto& d : devices)
    if (d != devices.front()) return "the stages span several GPUs";
  return "";
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

  // Pick the devices: the rank's GPUs when the job has GPUs, else the CPU
  const bool cuda = spec.device == "cuda" || (spec.device == "auto" && torch::cuda::is_available());
  if (spec.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "gpuq-worker: train.device is \"cuda\" but no CUDA device is visible\n";
    return 2;
  }
  if (spec.precision == "fp16" && !cuda) {
    std::cerr << "gpuq-worker: train.precision \"fp16\" needs CUDA; on the CPU use \"bf16\"\n";
    return 2;
  }
  const auto devices = stage_devices(spec, o.local_rank, cuda);
  const torch::Device device = devices.front();  // where batches enter the model

  // Load the data; hold it on the device when it fits, else prefetch it from the host
  auto data = load_dataset(spec.dataset, spec.seed);
  if (!data) {
    std::cerr << "gpuq-worker: " << data.error().message << "\n";
    return 2;
  }
  const bool classification = data->classes > 0;
  const int outputs = classification ? data->classes : 1;
  auto labels_of = [&](const Split& s) {
    return classification ? torch::tensor(s.labels, torch::kInt64) : torch::tensor(s.targets);
  };
  const std::int64_t bytes = (data->train.n + data->test.n) * (data->features * 4 + 8);
  std::unique_ptr<Loader> train_data, test_data;
  auto place = [&](bool on_device) {
    train_data = std::make_unique<Loader>(to_tensor(data->train.x, data->train.n, data->features), labels_of(data->train),
                                          device, on_device);
    test_data = std::make_unique<Loader>(to_tensor(data->test.x, data->test.n, data->features), labels_of(data->test),
                                         device, on_device);
  };
  const bool want_device = data_on_device(spec.data_on, device, bytes);
  try {
    place(want_device);
  } catch (const c10::Error& e) {
    const bool oom = std::string(e.what_without_backtrace()).find("out of memory") != std::string::npos;
    if (!want_device || spec.data_on != "auto" || !oom) throw;
    train_data.reset(), test_data.reset();
#ifdef GPUQ_HAVE_CUDA
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    place(false);
  }
  const std::string data_place = train_data->on_device() ? "device" : "host";
  std::cout << "rank " << o.rank << "/" << o.world << " on " << device.str() << ": " << data->description << " (held on the "
            << data_place << ", " << bytes / (1 << 20) << " MiB)" << std::endl;

  // Build the model and join the process group(s)
  torch::manual_seed(spec.seed);
  auto model = build_model(spec, data->shape, data->features, outputs, devices);
  auto params = model->parameters();
  Collectives comm;
  try {
    comm = Collectives::connect(o, devices);
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::cerr << "gpuq-worker: rank " << o.rank << ": cannot join the process group: "
              << (c10_error ? c10_error->what_without_backtrace() : e.what()) << "\n";
    return 3;
  }
  broadcast_from_0(params, comm);  // identical start on every rank
  broadcast_from_0(model->buffers(), comm);
  std::optional<GradientReducer> reducer;
  if (comm.distributed()) {
    reducer.emplace(params, comm, spec.bucket_mb);
    std::cout << "rank " << o.rank << ": " << comm.backend() << " process group(s) joined; gradients averaged in "
              << reducer->buckets() << " bucket(s) of up to " << spec.bucket_mb << " MiB" << std::endl;
  }
  auto optimizer = build_optimizer(spec.optimizer, params);
  Events events(o.rank == 0 ? o.events : "");

  // Resume from the newest checkpoint, if a previous attempt left one (every rank reads it)
  Checkpoints checkpoints(spec.checkpoint_every > 0 ? o.checkpoint_dir : "");
  std::int64_t step = 0, samples = 0, skipped = 0;
  double train_seconds = 0, test_loss = 0, test_accuracy = 0, last_loss = 0;
  int first_epoch = 1;
  if (auto resumed = checkpoints.load(*model, *optimizer, devices)) {
    const json& state = resumed->state;
    first_epoch = state.value("epoch", 0) + 1;
    step = state.value("step", std::int64_t{0});
    samples = state.value("samples", std::int64_t{0});
    train_seconds = state.value("train_seconds", 0.0);
    last_loss = state.value("loss", 0.0);
    std::cout << "rank " << o.rank << ": resumed from the checkpoint of epoch " << first_epoch - 1 << " in "
              << checkpoints.path() << std::endl;
    if (!resumed->optimizer_dropped.empty())
      std::cerr << "gpuq-worker: rank " << o.rank << ": the checkpoint's optimiser state does not fit this model ("
                << resumed->optimizer_dropped << "): training goes on from the checkpoint's weights with fresh "
                << "optimiser state\n";
  }

  // Train
  const bool autocast = spec.precision != "fp32";
  const auto low = spec.precision == "fp16" ? torch::kFloat16 : torch::kBFloat16;
  std::optional<LossScale> loss_scale;
  if (spec.precision == "fp16") loss_scale.emplace();
  const std::vector<double> weights =
      spec.sampler == "weighted" ? inverse_class_frequency(data->train.labels, data->classes) : std::vector<double>{};
  const int micro = spec.batch_size / spec.accumulate;
  const std::int64_t steps_per_epoch = (data->train.n + o.world - 1) / o.world / spec.batch_size;
  const ForwardBackward forward_backward = [&](const BatchOf& batch_of) {
    torch::Tensor total;
    for (int m = 0; m < spec.accumulate; ++m) {
      auto [x, y] = batch_of(m);
      torch::Tensor loss;
      {
        Autocast scope(device.type(), low, autocast);
        loss = loss_of(model->forward(x), y, classification);
        if (spec.accumulate > 1) loss = loss / spec.accumulate;
      }
      if (reducer && m == spec.accumulate - 1) reducer->arm();
      (loss_scale ? loss * loss_scale->scale() : loss).backward();
      const auto part = loss.detach().to(device);
      total = m == 0 ? part : total + part;  // no zero tensor to fill on the hot path
    }
    return total;
  };

  // The test split's loss and accuracy of the model as it is now
  const auto evaluate = [&] {
    model->train(false);
    torch::NoGradGuard no_grad;
    // Sums stay on the device until the end: one wait for the device per evaluation, not two
    // per batch.
    auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
    for (std::int64_t i = 0; i < data->test.n; i += 4096) {
      const std::int64_t n = std::min<std::int64_t>(4096, data->test.n - i);
      auto x = test_data->x().narrow(0, i, n).to(device);
      auto y = test_data->y().narrow(0, i, n).to(device);
      torch::Tensor out;
      {
        Autocast scope(device.type(), low, autocast);
        out = model->forward(x);
      }
      loss_sum += loss_of(out, y, classification).to(device, torch::kFloat64) * static_cast<double>(n);
      if (classification) correct += out.argmax(1).eq(y.to(out.device())).sum().to(device);
    }
    test_loss = loss_sum.item<double>() / static_cast<double>(data->test.n);
    test_accuracy = static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(data->test.n);
  };

  // Replay the step from a CUDA graph where the spec asks and the step can be captured
  std::unique_ptr<GraphedStep> graphed;
  const std::string obstacle = spec.cuda_graph == "off" ? "train.cuda_graph is \"off\""
                                                        : cuda_graph_obstacle(o, cuda, comm.distributed(), devices);
  if (!obstacle.empty() && spec.cuda_graph == "on") {
    std::cerr << "gpuq-worker: rank " << o.rank << ": train.cuda_graph is \"on\" but this step cannot be captured: "
              << obstacle << "\n";
    return 2;
  }
  if (!obstacle.empty() && o.fail_capture) {
    std::cerr << "gpuq-worker: --fail-capture: this run captures no CUDA graph: " << obstacle << "\n";
    return 2;
  }
  if (obstacle.empty()) {
    auto graph = o.emulate_cuda_graph ? make_emulated_step_graph([&] { clear_gradients(params); }, o.fail_capture)
                                      : make_cuda_step_graph(device.index(), o.fail_capture);
    graphed = std::make_unique<GraphedStep>(std::move(graph), *train_data, device, micro, spec.accumulate);
  } else if (spec.cuda_graph == "auto") {
    std::cout << "rank " << o.rank << ": eager steps, no CUDA graph: " << obstacle << std::endl;
  }
  bool graph_announced = false;
  for (int epoch = first_epoch; epoch <= spec.epochs; ++epoch) {
    torch::manual_seed(spec.seed + static_cast<std::uint64_t>(epoch));  // dropout: same masks after a resume
    auto order = spec.sampler == "weighted"
                     ? weighted_indices(weights, data->train.n, o.rank, o.world, spec.seed, epoch)
                     : shard_indices(data->train.n, o.rank, o.world, spec.seed, epoch, spec.sampler == "shuffle");
    const std::int64_t steps = static_cast<std::int64_t>(order.size()) / spec.batch_size;  // drop the last partial batch
    train_data->start(order, micro, steps * spec.accumulate);
    const auto t_epoch = std::chrono::steady_clock::now();
    model->train(true);
    // Losses stay on the device between progress events: reading one every step would make the
    // host wait for the GPU every step.
    torch::Tensor step_loss;
    for (std::int64_t s = 0; s < steps; ++s) {
      set_learning_rate(*optimizer, learning_rate(spec, epoch, step, steps_per_epoch * spec.epochs));
      if (!graphed) {
        clear_gradients(params);
        step_loss = forward_backward([&](int) { return train_data->next(); });
      } else {
        try {
          step_loss = graphed->run(*train_data, params, forward_backward);
        } catch (const GraphedStep::CaptureFailed& e) {
          if (spec.cuda_graph == "on") throw;
          // "auto": this step and the rest run eagerly, from the batches already taken
          std::cerr << "gpuq-worker: rank " << o.rank << ": " << e.what() << "; eager steps from here\n";
          const auto inputs = graphed->inputs();
          graphed.reset();
          clear_gradients(params);
          step_loss = forward_backward([&](int m) { return inputs[static_cast<std::size_t>(m)]; });
        }
        if (graphed && graphed->captured() && !graph_announced) {
          graph_announced = true;
          std::cout << "rank " << o.rank << ": step " << step + 1 << " captured into a CUDA graph"
                    << (o.emulate_cuda_graph ? " (emulated)" : "") << "; every later step replays it" << std::endl;
        }
      }
      if (reducer) reducer->finish();
      bool apply = true;
      if (loss_scale) {  // unscale; skip the step if fp16 overflowed (every rank sees the same sums)
        apply = loss_scale->update(unscale_gradients(params, loss_scale->scale()));
        if (!apply) ++skipped;
      }
      if (apply && spec.clip_grad_norm > 0) clip_gradients(params, spec.clip_grad_norm, spec.optimizer.foreach);
      if (apply) optimizer->step();
      ++step;
      samples += spec.batch_size;
      if (step % spec.log_every == 0) {
        json progress = {{"type", "progress"}, {"epoch", epoch}, {"epochs", spec.epochs}, {"step", step},
                         {"total_steps", steps_per_epoch * spec.epochs}, {"loss", step_loss.item<double>()},
                         {"samples_per_s", samples * o.world / (train_seconds + seconds_since(t_epoch))}};
        progress.update(memory_fields(devices));
        events.emit(progress);
      }
    }
    if (step_loss.defined()) last_loss = step_loss.item<double>();  // also waits for the device
    train_seconds += seconds_since(t_epoch);
    broadcast_from_0(model->buffers(), comm);  // batch-norm statistics: rank 0's, everywhere

    evaluate();
    json progress = {{"type", "progress"}, {"epoch", epoch},          {"epochs", spec.epochs},
                     {"step", step},         {"total_steps", steps_per_epoch * spec.epochs},
                     {"loss", last_loss},    {"test_loss", test_loss}};
    if (classification) progress["test_accuracy"] = test_accuracy;
    progress.update(memory_fields(devices));
    events.emit(progress);
    std::cout << "rank " << o.rank << " epoch " << epoch << ": loss " << last_loss << ", test_loss " << test_loss
              << (classification ? ", test_accuracy " + std::to_string(test_accuracy) : std::string()) << std::endl;

    if (o.rank == 0 && checkpoints.enabled() && (epoch % spec.checkpoint_every == 0 || epoch == spec.epochs))
      checkpoints.save(*model, *optimizer,
                       {{"epoch", epoch}, {"step", step}, {"samples", samples}, {"train_seconds", train_seconds},
                        {"loss", last_loss}},
                       epoch);
  }
  // A resume from the last epoch's checkpoint (a job that ended after saving it, or restarted
  // after it succeeded) trains nothing: it reports what that model scores.
  if (first_epoch > spec.epochs) evaluate();
  train_data->stop();
  const bool graph_used = graphed && graphed->captured();
  graphed.reset();  // waits for the graph's stream; later work goes to the default stream again

  // Every rank's throughput, gathered by an allreduce of one-hot slots
  const double rank_rate = train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0;
  auto rates = torch::zeros({o.world}, torch::kFloat64).to(device);
  rates[o.rank] = rank_rate;
  comm.allreduce_sum(rates)();
  auto per_rank = rates.cpu();

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
                   {"device", device.str()}, {"backend", comm.backend()}, {"train_seconds", train_seconds},
                   {"wall_seconds", seconds_since(t_start)}, {"samples_per_s", per_rank.sum().item<double>()},
                   {"precision", spec.precision}, {"data_on", data_place}, {"cuda_graph", graph_used}};
    if (classification) result["test_accuracy"] = test_accuracy;
    if (checkpoints.enabled()) result["checkpoint"] = checkpoints.path();
    if (first_epoch > 1) result["resumed_from_epoch"] = first_epoch - 1;
    if (loss_scale) result["skipped_steps"] = skipped;
    json ranks = json::array();
    for (int r = 0; r < o.world; ++r) ranks.push_back(per_rank[r].item<double>());
    result["rank_samples_per_s"] = ranks;
    result.update(memory_fields(devices));
    result["type"] = "result";
    events.emit(result);
  }
  return 0;
}

}  // namespace gpuq::worker
