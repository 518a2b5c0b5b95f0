// Process groups, broadcast and the overlapping gradient reducer; see parallel.hpp.
#include "worker/parallel.hpp"

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
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <torch/version.h>

#include <cstdlib>
#include <iostream>
#include <set>
#include <stdexcept>

namespace gpuq::worker {

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

#if defined(GPUQ_HAVE_GLOO) || defined(GPUQ_HAVE_NCCL)
namespace {

// The rendezvous store, as torch.distributed's env:// opens it: LibTorch ≥ 2.4 serves it with
// libuv unless USE_LIBUV=0. A LibTorch built without libuv (Debian's) refuses that, where Python
// would need USE_LIBUV=0 set by hand: here the classic backend, which speaks the same protocol,
// takes over.
c10::intrusive_ptr<c10d::TCPStore> open_store(const std::string& host, c10d::TCPStoreOptions options) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  const char* use_libuv = std::getenv("USE_LIBUV");
  if (use_libuv && std::string(use_libuv) == "0") options.useLibUV = false;
  if (options.useLibUV) {
    try {
      return c10::make_intrusive<c10d::TCPStore>(host, options);
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("without libuv") == std::string::npos) throw;
      std::cerr << "gpuq-worker: this LibTorch was built without libuv: the rendezvous store uses "
                   "its classic backend\n";
      options.useLibUV = false;
    }
  }
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

}  // namespace
#endif

Collectives Collectives::connect(const RunOptions& o, const std::vector<torch::Device>& devices) {
  Collectives c;
  c.m_world = o.world;
  if (!o.distributed && o.world == 1) return c;
  c.m_distributed = true;
#if defined(GPUQ_HAVE_GLOO) || defined(GPUQ_HAVE_NCCL)
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(o.master_port);
  store_options.isServer = o.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(o.world);
  store_options.timeout = std::chrono::minutes(5);
  auto store = open_store(o.master_addr, store_options);
  // The ProcessGroup class (LibTorch 1.x) or Backend (2.x) behind two closures.
  auto bind = [](auto pg) {
    Group g;
    g.allreduce_sum = [pg](std::vector<torch::Tensor>& t) -> Pending {
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      auto work = pg->allreduce(t, opts);
      return [work] { work->wait(); };
    };
    g.broadcast_from_0 = [pg](std::vector<torch::Tensor>& t) -> Pending {
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      auto work = pg->broadcast(t, opts);
      return [work] { work->wait(); };
    };
    return g;
  };
  std::set<std::string> seen;
  for (std::size_t stage = 0; stage < devices.size(); ++stage) {
    const torch::Device& device = devices[stage];
    if (!seen.insert(device.str()).second) continue;
    // Stage i of every rank meets on the store's "stage-i/" keys.
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("stage-" + std::to_string(stage), store);
    if (device.is_cuda()) {
#ifdef GPUQ_HAVE_NCCL
      c.m_groups[device.str()] = bind(c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, o.rank, o.world));
      c.m_backend = "nccl";
      continue;
#else
      throw std::runtime_error("DDP on CUDA needs NCCL, which this build of gpuq-worker lacks (backends: " +
                               available_backends() + ")");
#endif
    }
#ifdef GPUQ_HAVE_GLOO
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.master_addr));
    c.m_groups[device.str()] = bind(c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, o.rank, o.world, options));
    c.m_backend = "gloo";
#else
    throw std::runtime_error("DDP on the CPU needs Gloo, which this build of gpuq-worker lacks (backends: " +
                             available_backends() + ")");
#endif
  }
  return c;
#else
  (void)devices;
  throw std::runtime_error("this build of gpuq-worker has no c10d backend; it cannot run DDP ranks");
#endif
}

Collectives::Group& Collectives::group_of(const torch::Tensor& t) {
  auto it = m_groups.find(t.device().str());
  if (it == m_groups.end()) throw std::logic_error("no process group for a tensor on " + t.device().str());
  return it->second;
}

Pending Collectives::allreduce_sum(const torch::Tensor& t) {
  if (!m_distributed) return [] {};
  std::vector<torch::Tensor> one{t};
  return group_of(t).allreduce_sum(one);
}

void Collectives::broadcast_from_0(const torch::Tensor& t) {
  if (!m_distributed) return;
  std::vector<torch::Tensor> one{t};
  group_of(t).broadcast_from_0(one)();
}

void broadcast_from_0(const std::vector<torch::Tensor>& tensors, Collectives& comm) {
  if (!comm.distributed()) return;
  torch::NoGradGuard no_grad;
  // Flattened in runs of one device and dtype, at most ~25 MiB each: few collectives for a model
  // of many small layers.
  constexpr std::int64_t k_bucket_bytes = 25 << 20;
  std::vector<torch::Tensor> run;
  std::int64_t bytes = 0;
  auto flush = [&] {
    if (run.empty()) return;
    std::vector<torch::Tensor> views;
    for (auto& t : run) views.push_back(t.reshape(-1));
    auto flat = torch::cat(views);
    comm.broadcast_from_0(flat);
    std::int64_t offset = 0;
    for (auto& t : run) {
      t.view(-1).copy_(flat.narrow(0, offset, t.numel()));
      offset += t.numel();
    }
    run.clear();
    bytes = 0;
  };
  for (const auto& t : tensors) {
    if (!t.defined() || !t.is_floating_point()) continue;
    if (!run.empty() && (run.back().device() != t.device() || run.back().scalar_type() != t.scalar_type())) flush();
    run.push_back(t);
    bytes += t.numel() * static_cast<std::int64_t>(t.element_size());
    if (bytes >= k_bucket_bytes) flush();
  }
  flush();
}

GradientReducer::GradientReducer(std::vector<torch::Tensor> params, Collectives& comm, double bucket_mb)
    : m_params(std::move(params)), m_comm(comm), m_slots(m_params.size()) {
  const auto cap = static_cast<std::int64_t>(bucket_mb * 1024 * 1024);
  std::vector<std::int64_t> sizes;
  std::int64_t bytes = 0;
  for (std::size_t k = m_params.size(); k-- > 0;) {
    const auto& p = m_params[k];
    const Bucket* last = m_buckets.empty() ? nullptr : &m_buckets.back();
    const bool fits = last && bytes < cap && m_params[last->params.back()].device() == p.device() &&
                      m_params[last->params.back()].scalar_type() == p.scalar_type();
    if (!fits) {
      m_buckets.emplace_back();
      sizes.push_back(0);
      bytes = 0;
    }
    m_slots[k] = {m_buckets.size() - 1, sizes.back(), false};
    m_buckets.back().params.push_back(k);
    sizes.back() += p.numel();
    bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  }
  for (std::size_t b = 0; b < m_buckets.size(); ++b) {
    const auto& first = m_params[m_buckets[b].params.front()];
    m_buckets[b].flat = torch::zeros({sizes[b]}, first.options().requires_grad(false));
  }
  for (std::size_t k = 0; k < m_params.size(); ++k)
    m_hooks.push_back(m_params[k].register_hook([this, k](torch::Tensor grad) { on_gradient(k, grad); }));
}

GradientReducer::~GradientReducer() {
  for (std::size_t k = 0; k < m_params.size(); ++k) m_params[k].remove_hook(m_hooks[k]);
}

void GradientReducer::arm() {
  std::lock_guard<std::mutex> lock(m_mutex);
  for (auto& s : m_slots) s.seen = false;
  for (auto& b : m_buckets) b.pending = b.params.size(), b.work = nullptr;
  m_next = 0;
  m_armed = true;
}

// Copies what the parameter's .grad will hold after this backward (what it holds now plus the
// incoming gradient, since a hook runs before autograd accumulates) into its bucket slot.
void GradientReducer::fill(std::size_t k, const torch::Tensor* incoming) {
  torch::NoGradGuard no_grad;
  auto& slot = m_slots[k];
  const auto& p = m_params[k];
  auto dst = m_buckets[slot.bucket].flat.narrow(0, slot.offset, p.numel());
  const auto& held = p.grad();
  if (held.defined()) {
    dst.copy_(held.reshape(-1));
    if (incoming) dst.add_(incoming->reshape(-1));
  } else if (incoming) {
    dst.copy_(incoming->reshape(-1));
  } else {
    dst.zero_();  // unused on this rank this step
  }
  slot.seen = true;
  m_buckets[slot.bucket].pending--;
}

void GradientReducer::on_gradient(std::size_t k, const torch::Tensor& grad) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!m_armed || m_slots[k].seen) return;
  fill(k, &grad);
  start_ready();
}

void GradientReducer::start_ready() {
  while (m_next < m_buckets.size() && m_buckets[m_next].pending == 0) {
    m_buckets[m_next].work = m_comm.allreduce_sum(m_buckets[m_next].flat);
    ++m_next;
  }
}

void GradientReducer::finish() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    for (std::size_t k = 0; k < m_params.size(); ++k)
      if (!m_slots[k].seen) fill(k, nullptr);
    start_ready();
    m_armed = false;
  }
  torch::NoGradGuard no_grad;
  const double world = m_comm.world();
  for (auto& b : m_buckets) {
    b.work();
    b.flat.div_(world);
    for (std::size_t k : b.params) {
      auto& p = m_params[k];
      auto avg = b.flat.narrow(0, m_slots[k].offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) p.mutable_grad().copy_(avg);
      else p.mutable_grad() = avg.clone();
    }
  }
}

}  // namespace gpuq::worker
