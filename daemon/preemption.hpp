// Preemption's choice, as a pure function: which running jobs to stop so that queued jobs of
// higher priority, which wait for GPUs, can start. No I/O, so each rule is a unit test
// (tests/unit/test_preemption.cpp); gpuqd asks it after each scheduling pass (running.cpp).
//
// Rules (docs/preemption.md):
// - Only a job marked `preemptible`, of lower priority than the waiting job, not asked to stop
//   already (so two urgent jobs never preempt one victim twice), and not protected: a job preempted
//   `protect_after` times or more runs `min_run_s` from each start before it may be preempted again;
//   nor a job launched in the same pass.
// - A victim is a whole job: a gang's ranks all stop, and all its GPUs come free.
// - The cheapest set that makes room: candidates in order of GPU-seconds lost (GPUs times the time
//   since its last checkpoint event, or its start), then lowest priority, then youngest; taken in
//   that order until the waiting job fits, then each taken one that is not needed after all is
//   put back (most expensive first), as Kueue's minimal preemption set.
// - GPUs of jobs already stopping (preempted, cancelled, requeued) count as coming free: a waiting
//   job they make room for preempts nothing more, and claims them before the jobs after it in line.
// - Lab mode: a job preempts only its own user's jobs, unless across_users (gpuqd's
//   `preempt_across_users: fair_share`) lets a user who, with this job, holds no more than the fair
//   share of GPUs preempt a user who holds more than it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/scheduler.hpp"

namespace gpuq::daemon {

// A running job, as preemption sees it.
struct Runner {
  std::int64_t id = 0;
  int priority = 0;
  std::uint32_t user = 0;
  std::vector<int> gpus;
  bool shared = false;
  std::int64_t memory_mb = 0;  // a shared job's, per GPU
  bool preemptible = false;
  bool stopping = false;  // asked to stop already: its GPUs are coming free
  double started_at = 0;
  double checkpoint_at = 0;  // its last checkpoint event; 0: none
  int preemptions = 0;       // times it was preempted (or suspended) before
  double resumed_at = 0;     // when it was last thawed after a suspension; 0: never
  std::vector<int> cpu_slots;
  bool suspended = false;    // frozen for another job, which runs on its CPU slots
  bool borrows = false;      // runs on what a frozen job lends (its slots, its GPU): never frozen in turn,
                             // or that job would be thawed under a third
  std::int64_t kept_mb = 0;  // the GPU memory it keeps on each of its GPUs once frozen; 0: unknown
  bool may_requeue = true;   // its preempt_mode lets a preemption stop it (not `suspend`)
  bool may_suspend = false;  // its preempt_mode lets one freeze it (not `requeue`), and gpuqd can here
};

struct PreemptRules {
  int protect_after = 1;
  double min_run_s = 300;
  bool lab = false;                   // jobs of several users: only a user's own jobs, unless across_users
  bool across_users = false;          // lab mode's fair_share rule
  double fair_share = 0;              // GPUs per user with work (lab mode)
  std::map<std::uint32_t, int> held;  // GPUs each user's running jobs not asked to stop hold (lab mode)
};

struct Preemption {
  std::int64_t victim = 0;
  std::int64_t by = 0;
};

// Why `r` may not be preempted by `j` now ("" when it may), in words: stopped and requeued, or with
// `freeze`, suspended in place.
std::string preempt_refusal(const Runner& r, const PendingJob& j, double now, const PreemptRules& rules,
                            bool freeze = false);

// Waiting jobs looked at in one pass, at most: a pass's cost stays bounded whatever the queue.
constexpr std::size_t k_max_preempting = k_max_wanting;

// The preemptions to ask for: `waiting` are queued jobs that a pass left waiting for GPUs, in the
// pass's order (priority first); `gpus` the GPUs in service as they are after the pass's launches
// (gpus_for_pass); `running` every running job, those launches included (a job launched at `now`
// is no victim: it has not begun); `reserved` the GPUs the pass reserved for each waiting job,
// which the jobs after it do not count on.
std::vector<Preemption> choose_preemptions(const std::vector<PendingJob>& waiting, std::vector<GpuState> gpus,
                                           const std::vector<Runner>& running, double now, const PreemptRules& rules,
                                           const std::map<std::int64_t, std::vector<int>>& reserved = {});

// Suspension, preemption's other form (Slurm's PreemptMode=SUSPEND): a waiting job gets preemptible
// jobs of lower priority frozen in place (their cgroup's freezer), and runs on what they lend
// while they keep everything else, their memory included: their CPU slots (a job waiting for
// slots alone, Plan::wanting_slots), or time on their GPUs, where it fits beside the memory they
// keep there (a shared job that says its gpu_memory_mb, waiting for GPUs: Plan::wanting_gpus;
// what each victim keeps must be known: Runner::kept_mb). Once it has ended
// they are thawed and go on where they were. Nothing is lost, so the cheapest set idles the fewest
// GPUs: victims holding none first, then the lowest priority, then the youngest; taken until the
// job fits, then those not needed put back. The rules of preempt_refusal hold (a job suspended
// `protect_after` times runs `min_run_s` from its thaw first); a job frozen already lends nothing
// more, nor do GPUs the pass reserved for other jobs (`reserved`). In line order: a job waiting
// for slots that even every candidate would not make room for stops the look (the jobs after it
// wait behind it, as in the pass); a GPU job that cannot be helped is left to requeueing
// preemption (choose_preemptions).
struct Suspension {
  std::int64_t by = 0;                // the waiting job, which starts on...
  std::vector<int> cpu_slots;         // ...these slots (ascending), free ones first
  std::vector<int> gpus;              // ...and these GPUs (none for a job without)
  std::vector<std::int64_t> victims;  // frozen until it has ended
};
std::vector<Suspension> choose_suspensions(const std::vector<PendingJob>& waiting, std::vector<GpuState> gpus,
                                           const CpuSlots& cpu, const std::vector<Runner>& running, double now,
                                           const PreemptRules& rules,
                                           const std::map<std::int64_t, std::vector<int>>& reserved = {});

}  // namespace gpuq::daemon
