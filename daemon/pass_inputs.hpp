// What a scheduling pass is given, read from the daemon's owners: the GPUs in service with what
// holds them, and in lab mode the fair-share order and each user's caps. Functions of a Reads, so
// the pass (running.cpp), `gpus` and `why` (queries.cpp) see one account of who holds what, and
// unit tests build them without a daemon (test_pass_inputs).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "daemon/preemption.hpp"
#include "daemon/reads.hpp"
#include "daemon/scheduler.hpp"

namespace gpuq::daemon {

// When a running job is over at the latest: its start, its timeout and the grace period after it
// (the supervisor's SIGKILL), or, once preempted, its preemption's grace. k_never without either.
double ends_by(const JobRecord& r, double grace_s, double preempt_grace_s,
               double preempt_grace_max_s = common::k_max_preempt_grace_s);
// The grace a preempted job with `spec` gets: its own preempt_grace_s, else the configuration's,
// at most the configuration's preempt_grace_max_s.
double preempt_grace_of(const common::JobSpec& spec, const Config& config);

// What the running jobs hold of one GPU.
struct GpuHolding {
  std::vector<std::int64_t> jobs;  // ascending ids
  std::int64_t allocated_mb = 0;   // a shared job's gpu_memory_mb, or the whole GPU
  bool exclusive = false;          // held whole by one of them
  double free_at = 0;              // when all of them are over at the latest (k_never if unknown)
};
// Every GPU's holding by index (GPUs no running job holds are absent).
std::map<int, GpuHolding> gpu_holdings(const Reads& reads);

// The GPUs a pass may place jobs on (drained ones are not there), each with what holds it and
// what processes outside gpuq hold of it.
std::vector<GpuState> gpus_for_pass(const Reads& reads);

// Lab mode: `queue` (in line order) put in fair-share order (scheduler.hpp's fair_order, with each
// user's GPUs held and recent use, running jobs' GPU time so far counted), and the caps of the
// users in it who have limits, with what their running jobs take of them. Outside lab mode, or
// with an empty queue: nothing changes, no caps.
UserCaps lab_order(const Reads& reads, std::vector<PendingJob>& queue, double now);

// What a running job keeps on each of its GPUs once frozen (Runner::kept_mb): where gpuqd sees the
// GPUs' processes (`seen`: NVML), at least its processes' peak and at least its spec's
// gpu_memory_mb, and unknown (0) before the first look; elsewhere (fake GPUs) its spec's.
std::int64_t kept_on_gpu_mb(bool seen, std::optional<std::int64_t> peak_mb, std::int64_t spec_mb);

// The running jobs as preemption sees them (preemption.hpp), and whether any may be preempted at
// all (a preemptible job not asked to stop yet): without one a pass asks nothing more.
// `freezable`: whether a job can be frozen in place here (Executor::can_suspend, and no freeze of
// its attempt failed); none without it. A job may be frozen where its preempt_mode is `suspend`,
// or `auto` and it has one process.
std::vector<Runner> runners(const Reads& reads, bool& any_preemptible,
                            const std::function<bool(std::int64_t)>& freezable = {});
// gpuqd's preemption rules; in lab mode with each user's GPUs held now and the fair share: the
// GPUs in service over the users with jobs running or in line for GPUs.
PreemptRules preempt_rules(const Reads& reads, const std::vector<PendingJob>& waiting);

}  // namespace gpuq::daemon
