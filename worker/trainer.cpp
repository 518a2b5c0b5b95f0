// The LibTorch training loop (see trainer.hpp): data placement and prefetch, mixed precision,
// the step (micro-batches, DDP gradient averaging, clipping, loss scaling), evaluation,
// checkpoints and events. Models live in model.cpp, process groups and the reducer in
// parallel.cpp: three LibTorch TUs that build in parallel.
//
// Longer than the ~600 lines a file is held to, on purpose: every file that includes
// <torch/torch.h> costs ~20 s and ~1.2 GB to compile, so the loop's parts (the loader, autocast,
// the graphed step, and the run as a list of named steps over one Run) stay in one.
#include "worker/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>
#ifdef GPUQ_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
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
    m_paused = false;
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

  // Holds the gathering thread still between batches until resume(). A CUDA graph's capture
  // (global mode, PyTorch's default) fails when another thread makes a CUDA call meanwhile, and
  // gathering does: pinned allocations, and the host allocator's event queries. Returns once the
  // thread is between batches.
  void pause() {
    if (!m_thread.joinable()) return;
    std::unique_lock<std::mutex> lock(m_mutex);
    m_paused = true;
    m_idle.wait(lock, [this] { return !m_gathering; });
  }
  void resume() {
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_paused = false;
    }
    m_space.notify_all();
  }

  // Whether no other thread of the loader's may make a CUDA call now: none runs, or it is paused
  // between batches.
  bool quiet() {
    if (!m_thread.joinable()) return true;
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_paused && !m_gathering;
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
        {
          std::unique_lock<std::mutex> lock(m_mutex);
          m_space.wait(lock, [this] { return (m_queue.size() < k_depth && !m_paused) || m_stopping; });
          if (m_stopping) return;
          m_gathering = true;
        }
        auto rows = m_order.narrow(0, k * m_micro, m_micro);
        auto xb = torch::empty({m_micro, m_x.size(1)}, m_x.options().pinned_memory(pin));
        auto yb = torch::empty({m_micro}, m_y.options().pinned_memory(pin));
        torch::index_select_out(xb, m_x, 0, rows);
        torch::index_select_out(yb, m_y, 0, rows);
        std::lock_guard<std::mutex> lock(m_mutex);
        m_gathering = false;
        m_idle.notify_all();
        m_queue.emplace_back(std::move(xb), std::move(yb));
        m_ready.notify_one();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_gathering = false;
      m_idle.notify_all();
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
  std::condition_variable m_ready, m_space, m_idle;
  bool m_paused = false, m_gathering = false;
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
      data.pause();  // no other thread's CUDA calls during the capture
      struct Resume {
        Loader& data;
        ~Resume() { data.resume(); }
      } resume{data};
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

// ---- the run, step by step -------------------------------------------------------------------
// train() is a list of steps (as mold's main is): each a named function over one Run, which holds
// what the steps before it made. A step that ends the run returns its exit code (2 a bad spec for
// this machine, 3 no process group), else 0.

struct Run {
  explicit Run(const RunOptions& options) : o(options), spec(options.spec) {}
  const RunOptions& o;
  const common::TrainSpec& spec;
  const std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();

  // devices: the rank's GPUs when the job has GPUs, else the CPU
  bool cuda = false;
  std::vector<torch::Device> devices;
  torch::Device device = torch::kCPU;  // where batches enter the model
  // data
  std::optional<Dataset> data;
  bool classification = false;
  std::unique_ptr<Loader> train_data, test_data;
  std::string data_place;
  // model, process groups, optimiser, where events and checkpoints go
  std::unique_ptr<Model> model;
  std::vector<torch::Tensor> params;
  Collectives comm;
  std::optional<GradientReducer> reducer;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<Events> events;
  std::optional<Checkpoints> checkpoints;
  // precision
  bool autocast = false;
  c10::ScalarType low = torch::kBFloat16;
  std::optional<LossScale> loss_scale;
  // the step
  int micro = 0;
  std::int64_t steps_per_epoch = 0;
  std::vector<double> weights;  // the weighted sampler's
  std::unique_ptr<GraphedStep> graphed;
  bool graph_announced = false;
  // how far it got (a checkpoint's state)
  int first_epoch = 1;
  std::int64_t first_epoch_step = 0;  // a step checkpoint's: where in first_epoch it resumes
  std::vector<torch::Tensor> rng;     // and the generators' states there
  json resumed;                       // the checkpoint's state, or null
  std::int64_t step_at_start = 0;     // `step` when this process began training
  std::int64_t step = 0, samples = 0, skipped = 0;
  double train_seconds = 0, test_loss = 0, test_accuracy = 0, last_loss = 0;
};

int pick_devices(Run& r) {
  const auto& spec = r.spec;
  r.cuda = spec.device == "cuda" || (spec.device == "auto" && torch::cuda::is_available());
  if (spec.device == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "gpuq-worker: train.device is \"cuda\" but no CUDA device is visible\n";
    return 2;
  }
  if (spec.precision == "fp16" && !r.cuda) {
    std::cerr << "gpuq-worker: train.precision \"fp16\" needs CUDA; on the CPU use \"bf16\"\n";
    return 2;
  }
  r.devices = stage_devices(spec, r.o.local_rank, r.cuda);
  r.device = r.devices.front();
  return 0;
}

// Loads the data, held on the device when it fits, else prefetched from the host.
int load_data(Run& r) {
  auto data = load_dataset(r.spec.dataset, r.spec.seed);
  if (!data) {
    std::cerr << "gpuq-worker: " << data.error().message << "\n";
    return 2;
  }
  r.data = std::move(*data);
  const Dataset& d = *r.data;
  r.classification = d.classes > 0;
  auto labels_of = [&](const Split& s) {
    return r.classification ? torch::tensor(s.labels, torch::kInt64) : torch::tensor(s.targets);
  };
  const std::int64_t bytes = (d.train.n + d.test.n) * (d.features * 4 + 8);
  auto place = [&](bool on_device) {
    r.train_data = std::make_unique<Loader>(to_tensor(d.train.x, d.train.n, d.features), labels_of(d.train), r.device,
                                            on_device);
    r.test_data = std::make_unique<Loader>(to_tensor(d.test.x, d.test.n, d.features), labels_of(d.test), r.device,
                                           on_device);
  };
  const bool want_device = data_on_device(r.spec.data_on, r.device, bytes);
  try {
    place(want_device);
  } catch (const c10::Error& e) {
    const bool oom = std::string(e.what_without_backtrace()).find("out of memory") != std::string::npos;
    if (!want_device || r.spec.data_on != "auto" || !oom) throw;
    r.train_data.reset(), r.test_data.reset();
#ifdef GPUQ_HAVE_CUDA
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    place(false);
  }
  r.data_place = r.train_data->on_device() ? "device" : "host";
  std::cout << "rank " << r.o.rank << "/" << r.o.world << " on " << r.device.str() << ": " << d.description
            << " (held on the " << r.data_place << ", " << bytes / (1 << 20) << " MiB)" << std::endl;
  return 0;
}

// Builds the model, joins the process group(s) and starts every rank from rank 0's weights.
int build_and_join(Run& r) {
  const Dataset& d = *r.data;
  torch::manual_seed(r.spec.seed);
  r.model = build_model(r.spec, d.shape, d.features, r.classification ? d.classes : 1, r.devices);
  r.params = r.model->parameters();
  try {
    r.comm = Collectives::connect(r.o, r.devices);
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    std::cerr << "gpuq-worker: rank " << r.o.rank << ": cannot join the process group: "
              << (c10_error ? c10_error->what_without_backtrace() : e.what()) << "\n";
    return 3;
  }
  broadcast_from_0(r.params, r.comm);  // identical start on every rank
  broadcast_from_0(r.model->buffers(), r.comm);
  if (r.comm.distributed()) {
    r.reducer.emplace(r.params, r.comm, r.spec.bucket_mb);
    std::cout << "rank " << r.o.rank << ": " << r.comm.backend() << " process group(s) joined; gradients averaged in "
              << r.reducer->buckets() << " bucket(s) of up to " << r.spec.bucket_mb << " MiB" << std::endl;
  }
  r.optimizer = build_optimizer(r.spec.optimizer, r.params);
  r.events.emplace(r.o.rank == 0 ? r.o.events : "");
  r.checkpoints.emplace(r.spec.checkpoint_every > 0 ? r.o.checkpoint_dir : "");
  return 0;
}

// Resumes from the newest checkpoint, if a previous attempt left one (every rank reads it).
void resume(Run& r) {
  auto resumed = r.checkpoints->load(*r.model, *r.optimizer, r.devices);
  if (!resumed) return;
  const json& state = resumed->state;
  r.resumed = state;
  r.first_epoch = state.value("epoch", 0) + 1;
  r.first_epoch_step = state.value("epoch_step", std::int64_t{0});
  r.rng = std::move(resumed->rng);
  r.skipped = state.value("skipped", std::int64_t{0});
  r.step = state.value("step", std::int64_t{0});
  r.samples = state.value("samples", std::int64_t{0});
  r.train_seconds = state.value("train_seconds", 0.0);
  r.last_loss = state.value("loss", 0.0);
  if (r.first_epoch_step > 0)
    std::cout << "rank " << r.o.rank << ": resumed from the checkpoint of step " << r.step << " (epoch "
              << r.first_epoch << ", step " << r.first_epoch_step << " of it) in " << r.checkpoints->path()
              << std::endl;
  else
    std::cout << "rank " << r.o.rank << ": resumed from the checkpoint of epoch " << r.first_epoch - 1 << " in "
              << r.checkpoints->path() << std::endl;
  if (!resumed->optimizer_dropped.empty())
    std::cerr << "gpuq-worker: rank " << r.o.rank << ": the checkpoint's optimiser state does not fit this model ("
              << resumed->optimizer_dropped << "): training goes on from the checkpoint's weights with fresh "
              << "optimiser state\n";
}

// Precision, loss scaling, micro-batches and the sampler's weights.
void prepare_steps(Run& r) {
  r.autocast = r.spec.precision != "fp32";
  r.low = r.spec.precision == "fp16" ? torch::kFloat16 : torch::kBFloat16;
  if (r.spec.precision == "fp16") r.loss_scale.emplace();
  if (const json ls = r.resumed.is_object() ? r.resumed.value("loss_scale", json()) : json();
      r.loss_scale && ls.is_array() && ls.size() == 2)
    r.loss_scale->restore(ls[0].get<double>(), ls[1].get<int>());
  if (r.spec.sampler == "weighted") r.weights = inverse_class_frequency(r.data->train.labels, r.data->classes);
  r.micro = r.spec.batch_size / r.spec.accumulate;
  r.steps_per_epoch = (r.data->train.n + r.o.world - 1) / r.o.world / r.spec.batch_size;
}

// One step's forward and backward passes over its micro-batches; the step's loss, on the device.
torch::Tensor forward_backward(Run& r, const BatchOf& batch_of) {
  torch::Tensor total;
  for (int m = 0; m < r.spec.accumulate; ++m) {
    auto [x, y] = batch_of(m);
    torch::Tensor loss;
    {
      Autocast scope(r.device.type(), r.low, r.autocast);
      loss = loss_of(r.model->forward(x), y, r.classification);
      if (r.spec.accumulate > 1) loss = loss / r.spec.accumulate;
    }
    if (r.reducer && m == r.spec.accumulate - 1) r.reducer->arm();
    (r.loss_scale ? loss * r.loss_scale->scale() : loss).backward();
    const auto part = loss.detach().to(r.device);
    total = m == 0 ? part : total + part;  // no zero tensor to fill on the hot path
  }
  return total;
}

// The test split's loss and accuracy of the model as it is now.
void evaluate(Run& r) {
  r.model->train(false);
  torch::NoGradGuard no_grad;
  // Sums stay on the device until the end: one wait for the device per evaluation, not two per
  // batch.
  const auto& test = r.data->test;
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(r.device));
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(r.device));
  for (std::int64_t i = 0; i < test.n; i += 4096) {
    const std::int64_t n = std::min<std::int64_t>(4096, test.n - i);
    auto x = r.test_data->x().narrow(0, i, n).to(r.device);
    auto y = r.test_data->y().narrow(0, i, n).to(r.device);
    torch::Tensor out;
    {
      Autocast scope(r.device.type(), r.low, r.autocast);
      out = r.model->forward(x);
    }
    loss_sum += loss_of(out, y, r.classification).to(r.device, torch::kFloat64) * static_cast<double>(n);
    if (r.classification) correct += out.argmax(1).eq(y.to(out.device())).sum().to(r.device);
  }
  r.test_loss = loss_sum.item<double>() / static_cast<double>(test.n);
  r.test_accuracy = static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(test.n);
}

// Replays the step from a CUDA graph where the spec asks and the step can be captured.
int choose_step_graph(Run& r) {
  const std::string obstacle = r.spec.cuda_graph == "off" ? "train.cuda_graph is \"off\""
                                                          : cuda_graph_obstacle(r.o, r.cuda, r.comm.distributed(), r.devices);
  if (!obstacle.empty() && r.spec.cuda_graph == "on") {
    std::cerr << "gpuq-worker: rank " << r.o.rank << ": train.cuda_graph is \"on\" but this step cannot be captured: "
              << obstacle << "\n";
    return 2;
  }
  if (!obstacle.empty() && r.o.fail_capture) {
    std::cerr << "gpuq-worker: --fail-capture: this run captures no CUDA graph: " << obstacle << "\n";
    return 2;
  }
  if (obstacle.empty()) {
    auto graph = r.o.emulate_cuda_graph
                     ? make_emulated_step_graph([&r] { clear_gradients(r.params); },
                                                [&r] { return r.train_data->quiet(); }, r.o.fail_capture)
                     : make_cuda_step_graph(r.device.index(), r.o.fail_capture);
    r.graphed = std::make_unique<GraphedStep>(std::move(graph), *r.train_data, r.device, r.micro, r.spec.accumulate);
  } else if (r.spec.cuda_graph == "auto") {
    std::cout << "rank " << r.o.rank << ": eager steps, no CUDA graph: " << obstacle << std::endl;
  }
  return 0;
}

// One optimiser step's passes, eager or replayed; the step's loss.
torch::Tensor passes(Run& r) {
  const ForwardBackward eager = [&r](const BatchOf& batch_of) { return forward_backward(r, batch_of); };
  if (!r.graphed) {
    clear_gradients(r.params);
    return forward_backward(r, [&r](int) { return r.train_data->next(); });
  }
  torch::Tensor loss;
  try {
    loss = r.graphed->run(*r.train_data, r.params, eager);
  } catch (const GraphedStep::CaptureFailed& e) {
    if (r.spec.cuda_graph == "on") throw;
    // "auto": this step and the rest run eagerly, from the batches already taken
    std::cerr << "gpuq-worker: rank " << r.o.rank << ": " << e.what() << "; eager steps from here\n";
    const auto inputs = r.graphed->inputs();
    r.graphed.reset();
    clear_gradients(r.params);
    return forward_backward(r, [&inputs](int m) { return inputs[static_cast<std::size_t>(m)]; });
  }
  if (r.graphed->captured() && !r.graph_announced) {
    r.graph_announced = true;
    std::cout << "rank " << r.o.rank << ": step " << r.step + 1 << " captured into a CUDA graph"
              << (r.o.emulate_cuda_graph ? " (emulated)" : "") << "; every later step replays it" << std::endl;
  }
  return loss;
}

// Averages the gradients, unscales and clips them, and applies them (unless fp16 overflowed).
void apply_gradients(Run& r) {
  if (r.reducer) r.reducer->finish();
  bool apply = true;
  if (r.loss_scale) {  // unscale; skip the step if fp16 overflowed (every rank sees the same sums)
    apply = r.loss_scale->update(unscale_gradients(r.params, r.loss_scale->scale()));
    if (!apply) ++r.skipped;
  }
  if (apply && r.spec.clip_grad_norm > 0) clip_gradients(r.params, r.spec.clip_grad_norm, r.spec.optimizer.foreach);
  if (apply) r.optimizer->step();
}

// A stop asked by a signal (a preemption's, whatever its signal; a cancel's SIGTERM): the run
// saves a checkpoint at the next step boundary and ends, instead of losing the epoch so far.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
}

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT})
    ::sigaction(sig, &sa, nullptr);
}

// Every k_stop_check_steps steps the ranks of a gang agree whether any was asked to stop (each gets
// the signal, not at the same step): all stop at the same step, or none does.
constexpr std::int64_t k_stop_check_steps = 16;

bool stop_asked(Run& r) {
  const int here = g_stop_signal.load() != 0 ? 1 : 0;
  if (!r.comm.distributed()) return here != 0;
  if (r.step % k_stop_check_steps != 0) return false;
  auto any =
      torch::full({1}, static_cast<double>(here), torch::TensorOptions().dtype(torch::kFloat32).device(r.device));
  r.comm.allreduce_sum(any)();
  return any.item<float>() > 0;
}

// The random generators' states: the CPU's, then each CUDA device's of the rank (every rank draws
// the same numbers, from the same seeds, so rank 0's are every rank's).
std::vector<torch::Tensor> generator_states(const Run& r) {
  std::vector<torch::Tensor> out;
  auto cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    out.push_back(cpu.get_state());
  }
#ifdef GPUQ_HAVE_CUDA
  for (const auto& d : r.devices)
    if (d.is_cuda()) {
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(d.index());
      std::lock_guard<std::mutex> lock(gen.mutex());
      out.push_back(gen.get_state());
    }
#else
  (void)r;
#endif
  return out;
}

void restore_generators(const Run& r, const std::vector<torch::Tensor>& states) {
  std::size_t i = 0;
  if (i < states.size()) {
    auto cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(states[i++]);
  }
#ifdef GPUQ_HAVE_CUDA
  for (const auto& d : r.devices)
    if (d.is_cuda() && i < states.size()) {
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(d.index());
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(states[i++]);
    }
#else
  (void)r;
#endif
}

// Rank 0 saves where the run stands after `done` steps of `epoch`: weights, optimiser, the
// generators, the loss scale, and the counters, so that a resume takes the same steps from here
// as the run would have.
void save_step(Run& r, int epoch, std::int64_t done, double epoch_seconds) {
  if (r.o.rank != 0 || !r.checkpoints->enabled()) return;
  json state = {{"epoch", epoch - 1},   {"epoch_step", done},   {"step", r.step},
                {"samples", r.samples}, {"skipped", r.skipped}, {"train_seconds", r.train_seconds + epoch_seconds},
                {"loss", r.last_loss}};
  if (r.loss_scale) state["loss_scale"] = {r.loss_scale->scale(), r.loss_scale->clean_steps()};
  r.checkpoints->save_step(*r.model, *r.optimizer, state, r.step, generator_states(r));
  r.events->emit({{"type", "checkpoint"}, {"epoch", epoch}, {"step", r.step}, {"path", r.checkpoints->path()}});
  std::cout << "rank 0: stop signal: saved the checkpoint of step " << r.step << " (epoch " << epoch << ", step "
            << done << " of it)" << std::endl;
}

// One epoch: its steps with progress events, then evaluation, an event and a checkpoint. False
// when a stop signal ended it early (a step checkpoint saved).
bool train_epoch(Run& r, int epoch) {
  const auto& spec = r.spec;
  torch::manual_seed(spec.seed + static_cast<std::uint64_t>(epoch));  // dropout: same masks after a resume
  auto order = spec.sampler == "weighted"
                   ? weighted_indices(r.weights, r.data->train.n, r.o.rank, r.o.world, spec.seed, epoch)
                   : shard_indices(r.data->train.n, r.o.rank, r.o.world, spec.seed, epoch, spec.sampler == "shuffle");
  const std::int64_t steps = static_cast<std::int64_t>(order.size()) / spec.batch_size;  // drop the last partial batch
  // A step checkpoint's epoch goes on from its step: the batches after it, the generators as they were.
  const std::int64_t first = epoch == r.first_epoch ? std::min(r.first_epoch_step, steps) : 0;
  if (first > 0) {
    order.erase(order.begin(), order.begin() + first * spec.batch_size);
    restore_generators(r, r.rng);
  }
  r.train_data->start(order, r.micro, (steps - first) * spec.accumulate);
  const auto t_epoch = std::chrono::steady_clock::now();
  r.model->train(true);
  // Losses stay on the device between progress events: reading one every step would make the
  // host wait for the GPU every step.
  torch::Tensor step_loss;
  const std::int64_t total_steps = r.steps_per_epoch * spec.epochs;
  for (std::int64_t s = first; s < steps; ++s) {
    if (stop_asked(r)) {
      if (step_loss.defined()) r.last_loss = step_loss.item<double>();
      // Nothing trained since the checkpoint it resumed from (a stop during start-up): that one
      // stands, and is not written over in place.
      if (r.step > r.step_at_start) save_step(r, epoch, s, seconds_since(t_epoch));
      return false;
    }
    set_learning_rate(*r.optimizer, learning_rate(spec, epoch, r.step, total_steps));
    step_loss = passes(r);
    apply_gradients(r);
    ++r.step;
    r.samples += spec.batch_size;
    if (r.step % spec.log_every == 0) {
      json progress = {{"type", "progress"}, {"epoch", epoch}, {"epochs", spec.epochs}, {"step", r.step},
                       {"total_steps", total_steps}, {"loss", step_loss.item<double>()},
                       {"samples_per_s", r.samples * r.o.world / (r.train_seconds + seconds_since(t_epoch))}};
      progress.update(memory_fields(r.devices));
      r.events->emit(progress);
    }
  }
  if (step_loss.defined()) r.last_loss = step_loss.item<double>();  // also waits for the device
  r.train_seconds += seconds_since(t_epoch);
  broadcast_from_0(r.model->buffers(), r.comm);  // batch-norm statistics: rank 0's, everywhere

  evaluate(r);
  json progress = {{"type", "progress"}, {"epoch", epoch},          {"epochs", spec.epochs},
                   {"step", r.step},       {"total_steps", total_steps}, {"loss", r.last_loss},
                   {"test_loss", r.test_loss}};
  if (r.classification) progress["test_accuracy"] = r.test_accuracy;
  progress.update(memory_fields(r.devices));
  r.events->emit(progress);
  std::cout << "rank " << r.o.rank << " epoch " << epoch << ": loss " << r.last_loss << ", test_loss " << r.test_loss
            << (r.classification ? ", test_accuracy " + std::to_string(r.test_accuracy) : std::string()) << std::endl;
  // A NaN or infinite loss is no success: the job fails (class `diverged`), and no checkpoint of
  // the broken model is kept, unless the spec says to train on.
  if ((!std::isfinite(r.last_loss) || !std::isfinite(r.test_loss)) && spec.on_nonfinite == "fail")
    throw std::runtime_error("training diverged at epoch " + std::to_string(epoch) + ": the loss is " +
                             std::to_string(r.last_loss) + ", the test loss " + std::to_string(r.test_loss) +
                             " (a smaller learning rate, gradient clipping, or train.on_nonfinite \"continue\")");

  if (r.o.rank == 0 && r.checkpoints->enabled() && (epoch % spec.checkpoint_every == 0 || epoch == spec.epochs))
    r.checkpoints->save(*r.model, *r.optimizer,
                        {{"epoch", epoch},
                         {"step", r.step},
                         {"samples", r.samples},
                         {"train_seconds", r.train_seconds},
                         {"loss", r.last_loss},
                         {"skipped", r.skipped}},
                        epoch);
  if (r.checkpoints->enabled() && (epoch % spec.checkpoint_every == 0 || epoch == spec.epochs))
    r.events->emit({{"type", "checkpoint"}, {"epoch", epoch}, {"step", r.step}, {"path", r.checkpoints->path()}});
  return true;
}

// Every rank's throughput, gathered by an allreduce of one-hot slots; then rank 0's result event
// (and the parameters, where a test asks for them).
void report(Run& r, bool graph_used) {
  const auto& o = r.o;
  const double rank_rate = r.train_seconds > 0 ? static_cast<double>(r.samples) / r.train_seconds : 0;
  auto rates = torch::zeros({o.world}, torch::kFloat64).to(r.device);
  rates[o.rank] = rank_rate;
  r.comm.allreduce_sum(rates)();
  auto per_rank = rates.cpu();

  if (!o.dump_params.empty()) {
    json flat = json::array();
    for (const auto& p : r.params) {
      auto c = p.detach().cpu().contiguous().view(-1);
      for (std::int64_t i = 0; i < c.numel(); ++i) flat.push_back(c[i].item<float>());
    }
    std::ofstream(o.dump_params) << flat.dump();
  }
  if (o.rank != 0) return;
  const auto& spec = r.spec;
  json result = {{"test_loss", r.test_loss}, {"epochs", spec.epochs}, {"steps", r.step}, {"world_size", o.world},
                 {"device", r.device.str()}, {"backend", r.comm.backend()}, {"train_seconds", r.train_seconds},
                 {"wall_seconds", seconds_since(r.t_start)}, {"samples_per_s", per_rank.sum().item<double>()},
                 {"precision", spec.precision}, {"data_on", r.data_place}, {"cuda_graph", graph_used}};
  if (r.classification) result["test_accuracy"] = r.test_accuracy;
  if (r.checkpoints->enabled()) result["checkpoint"] = r.checkpoints->path();
  if (r.first_epoch > 1) result["resumed_from_epoch"] = r.first_epoch - 1;
  if (r.loss_scale) result["skipped_steps"] = r.skipped;
  json ranks = json::array();
  for (int i = 0; i < o.world; ++i) ranks.push_back(per_rank[i].item<double>());
  result["rank_samples_per_s"] = ranks;
  result.update(memory_fields(r.devices));
  result["type"] = "result";
  r.events->emit(result);
}

int train_or_throw(const RunOptions& o) {
  catch_stop_signals();
  Run r(o);
  for (auto step : {pick_devices, load_data, build_and_join})
    if (int code = step(r)) return code;
  resume(r);
  prepare_steps(r);
  r.step_at_start = r.step;
  if (int code = choose_step_graph(r)) return code;
  for (int epoch = r.first_epoch; epoch <= r.spec.epochs; ++epoch)
    if (!train_epoch(r, epoch)) {
      r.train_data->stop();
      const int sig = g_stop_signal.load();
      std::cout << "rank " << r.o.rank << ": stopped by signal " << (sig ? sig : SIGTERM) << " at step " << r.step
                << std::endl;
      return 128 + (sig ? sig : SIGTERM);
    }
  // A resume from the last epoch's checkpoint (a job that ended after saving it, or restarted
  // after it succeeded) trains nothing: it reports what that model scores.
  if (r.first_epoch > r.spec.epochs) evaluate(r);
  r.train_data->stop();
  const bool graph_used = r.graphed && r.graphed->captured();
  r.graphed.reset();  // waits for the graph's stream; later work goes to the default stream again
  report(r, graph_used);
  return 0;
}

}  // namespace

int train(const RunOptions& o) {
  try {
    return train_or_throw(o);
  } catch (const c10::Error& e) {  // its what() carries a C++ backtrace: not for a job log
    std::cerr << "gpuq-worker: rank " << o.rank << ": " << e.what_without_backtrace() << "\n";
    return 1;
  }
}

}  // namespace gpuq::worker
