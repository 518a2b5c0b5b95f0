// GPU memory budgets: a shared job's `gpu_memory_mb` is what it may hold on each of its GPUs, and
// gpuqd holds it to that with NVML's per-process readings (gpu_processes.hpp), every look. A job
// over its budget on a GPU whose other jobs still have room owed to them (their budgets less what
// they hold) that the GPU no longer has is stopped (its policy `requeue`: SIGTERM, grace, kill)
// and put back in line with a larger budget, no retry spent; one over its budget on a GPU with
// room has its budget raised and is left running (and so is one whose policy is `warn`). Its
// neighbours are never the ones stopped. A watchdog acts after the fact: a neighbour's allocation
// may fail in the moment before a look sees the overrun; only CUDA MPS's per-client limit stops the
// allocation itself. Pure: tests/unit/test_gpu_budgets.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpuq::daemon {

// A larger budget than `budget_mb` for a job seen holding `used_mb`: half as much again, and at
// least a quarter over what it held, in whole 256 MiB; never past `cap_mb` (its GPU's memory).
std::int64_t raised_budget_mb(std::int64_t budget_mb, std::int64_t used_mb, std::int64_t cap_mb);

struct BudgetGpu {  // one GPU at a look
  int gpu = 0;
  std::int64_t total_mb = 0;
  std::int64_t foreign_mb = 0;  // held by processes outside gpuq: no budget is raised past the rest
};

struct BudgetJob {  // a running job on one of its GPUs, at a look
  std::int64_t id = 0;
  int gpu = 0;
  std::int64_t budget_mb = 0;  // 0: none (a job with GPUs of its own)
  std::int64_t used_mb = 0;    // its processes' memory there now
  // May have its budget raised or be stopped, and is owed the room its budget leaves: shared, not
  // stopping, not frozen (what a frozen job keeps is all it has: preemption.hpp's kept_mb).
  bool judged = false;
  bool may_stop = false;  // its policy is `requeue`
  bool leaving = false;   // asked to stop: what it holds comes back
};

struct Overrun {
  std::int64_t id = 0;
  int gpu = 0;  // where it is furthest over (a job of several GPUs: one Overrun)
  std::int64_t used_mb = 0, budget_mb = 0, raised_mb = 0;
  bool stop = false;                   // stopped for the room; else only its budget raised
  std::vector<std::int64_t> short_of;  // stop: the jobs on its GPU owed the room it took
  std::int64_t short_mb = 0;           // stop: how much they are owed past what the GPU has
};

// The jobs over their budgets at one look, and what each gets. On each GPU the overruns are taken
// furthest over first: stopped while the room owed to the GPU's other jobs is more than the GPU
// has free (counting what those stopped, now or before, will free), else raised, never into the
// room the others' budgets (or what they hold, where more) and the memory held outside gpuq take.
std::vector<Overrun> judge_budgets(const std::vector<BudgetGpu>& gpus, const std::vector<BudgetJob>& jobs);

// For a reason: "it held 26000 MiB of its 20000 MiB budget on GPU 0".
std::string overrun_words(const Overrun& o);

}  // namespace gpuq::daemon
