// Data parallelism by hand on c10d: the gang's process groups, parameter broadcast, and the
// gradient reducer that averages gradients over ranks while the backward pass still runs. An
// internal header of the worker's LibTorch TUs.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "worker/trainer.hpp"

namespace gpuq::worker {

// A collective in flight; calling it waits for the result (NCCL: orders the current stream
// after it, without blocking the host).
using Pending = std::function<void()>;

// The rank's process groups: one per device its stages use (each stage's gradients are averaged
// with the same stage on the other ranks, on a group of its own); none for a process not launched
// as a rank.
class Collectives {
 public:
  // Joins the gang through the TCPStore at MASTER_ADDR:MASTER_PORT. Throws when the build lacks
  // the backend the devices need (NCCL for CUDA, Gloo for the CPU).
  static Collectives connect(const RunOptions& o, const std::vector<torch::Device>& devices);

  Pending allreduce_sum(const torch::Tensor& t);
  void broadcast_from_0(const torch::Tensor& t);
  const std::string& backend() const { return m_backend; }
  int world() const { return m_world; }
  bool distributed() const { return m_distributed; }  // has process groups

 private:
  struct Group {
    std::function<Pending(std::vector<torch::Tensor>&)> allreduce_sum;
    std::function<Pending(std::vector<torch::Tensor>&)> broadcast_from_0;
  };
  Group& group_of(const torch::Tensor& t);

  std::map<std::string, Group> m_groups;  // by device, e.g. "cuda:1"
  std::string m_backend = "none";
  int m_world = 1;
  bool m_distributed = false;
};

// Makes every rank start from rank 0's values (floating-point tensors; integer counters such as
// batch norm's agree anyway).
void broadcast_from_0(const std::vector<torch::Tensor>& tensors, Collectives& comm);

// Averages gradients over the ranks the way DDP's reducer does: parameters are grouped into
// buckets of about `bucket_mb` (reverse order, since backward produces the last layers'
// gradients first; one device per bucket), a hook copies each gradient into its bucket the
// moment autograd computes it, and a full bucket's allreduce starts at once, overlapping the
// rest of the backward pass. Buckets start strictly in order, so every rank issues the same
// collectives in the same sequence whatever order its hooks fire in.
class GradientReducer {
 public:
  GradientReducer(std::vector<torch::Tensor> params, Collectives& comm, double bucket_mb);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Call before the backward pass that completes a step's gradients (the last micro-batch).
  void arm();
  // Call after it: starts what is left, waits, and leaves the average in every .grad.
  void finish();
  std::size_t buckets() const { return m_buckets.size(); }

 private:
  struct Bucket {
    torch::Tensor flat;
    std::vector<std::size_t> params;
    std::size_t pending = 0;  // parameters whose gradient has not arrived this step
    Pending work;
  };
  struct Slot {
    std::size_t bucket = 0;
    std::int64_t offset = 0;
    bool seen = false;
  };
  void on_gradient(std::size_t param, const torch::Tensor& grad);
  void fill(std::size_t param, const torch::Tensor* incoming);
  void start_ready();  // under m_mutex

  std::vector<torch::Tensor> m_params;
  Collectives& m_comm;
  std::vector<Bucket> m_buckets;
  std::vector<Slot> m_slots;
  std::vector<unsigned> m_hooks;
  std::mutex m_mutex;  // hooks of different devices' autograd threads
  bool m_armed = false;
  std::size_t m_next = 0;  // the next bucket to start
};

}  // namespace gpuq::worker
