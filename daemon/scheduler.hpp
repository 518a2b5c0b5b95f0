// The scheduler: a pure function from (eligible queued jobs, GPU state, now) to the jobs to start
// and the GPUs each gets. No I/O, so every policy is a unit test (tests/unit/test_scheduler.cpp).
//
// Policies:
// - Order: priority (higher first), then the order given: submission order (lower id first), or
//   in lab mode the fair-share order gpuqd makes (fair_order).
// - Exclusive jobs take whole idle GPUs; a multi-GPU job (a DDP gang) gets all its GPUs in the same
//   pass or none.
// - Shared jobs pack by memory, best fit (the GPU left with the least free memory that still fits),
//   so idle GPUs stay idle for exclusive jobs. Memory held by processes outside gpuq is not free;
//   an exclusive job that names its memory needs that much beside them.
// - No starvation: a job that cannot start reserves the GPUs it waits for (EASY-style backfill, as
//   in Slurm). A lower job may use reserved GPUs only when its timeout guarantees it ends before the
//   reserved GPUs are expected to free up (from the running jobs' timeouts); otherwise it waits.
// - CPU slots (gpuqd's --cpu-slots, by default one per core gpuqd may run on): a job with `cpus`
//   takes that many per rank, GPUs or not; a job without `cpus` takes one per rank when it has no
//   GPUs, none when it has. A job gets numbered slots (the first free run long enough, else the
//   lowest free ones), which gpuqd maps to cores to pin a `cpus` job's ranks to. Jobs start in
//   order for slots: once one waits for slots, later ones wait too, so a wide CPU gang is never
//   starved by a stream of single-process jobs; a GPU job waiting for slots also reserves its
//   GPUs. A job wider than the whole pool runs when the pool is empty, alone, on every slot.
// - NUMA: where the GPUs' and cores' NUMA nodes are known, a multi-GPU job gets GPUs of one node
//   when enough of them are free (their traffic then stays off the inter-socket link), and a GPU
//   job's slots are taken on its GPUs' node first: each DDP rank's near its own GPU, a single
//   process's near any of its GPUs. A job with `cpus` prefers GPUs whose node has free slots. A
//   preference, never a wait: with no free slot there, other slots serve (Slurm without
//   --gres-flags=enforce-binding).
// - Batch limits (`gpuq submit --max-running N`, as Slurm's array throttle `%N`): a job whose
//   batch already runs its limit waits without reserving anything, so the jobs behind it start as
//   if it were not there. So does a job whose user runs their limit of jobs or would pass their
//   limit of GPUs (lab mode's user_limits, as Slurm's per-user QOS limits).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gpuq::daemon {

constexpr double k_never = std::numeric_limits<double>::infinity();
// Jobs a pass lists in Plan::wanting_gpus and wanting_slots, at most each: a pass's cost stays
// bounded whatever the queue (preemption looks at no more).
constexpr std::size_t k_max_wanting = 64;

struct GpuState {
  int index = 0;
  std::int64_t total_mb = 0;
  std::int64_t allocated_mb = 0;  // sum of gpu_memory_mb of jobs holding it
  std::int64_t foreign_mb = 0;    // held by processes outside gpuq (NVML): not there to give
  int holders = 0;                // jobs holding it
  bool exclusive = false;         // held whole by one job
  double free_at = 0;             // when all holders will have ended at the latest (k_never if unknown)
  int node = -1;                  // NUMA node, -1 when unknown
};

struct PendingJob {
  std::int64_t id = 0;
  int priority = 0;
  int gpus = 0;
  bool shared = false;
  std::int64_t memory_mb = 0;  // per GPU; 0 = unspecified
  double timeout_s = 0;        // 0 = none: can never backfill onto a reservation
  int ranks = 1;               // processes
  int cpus = 0;                // CPU slots per rank; 0 = one per rank without GPUs, none with
  std::int64_t batch = 0;
  std::uint32_t user = 0;      // its owner's uid
  bool spread = false;         // a shared job: the GPU with the fewest jobs first (spec.hpp's Placement)
};

// A user's limits and what their running jobs hold (lab mode); 0: no limit.
struct UserCap {
  int max_running = 0, running = 0;
  int max_gpus = 0, gpus = 0;
};
using UserCaps = std::map<std::uint32_t, UserCap>;  // users without a limit are absent

// A batch's limit on running jobs, and how many of its jobs run now.
struct BatchLimit {
  int limit = 0;
  int running = 0;
};
using BatchLimits = std::map<std::int64_t, BatchLimit>;  // batches without a limit are absent

struct Placement {
  std::int64_t id = 0;
  std::vector<int> gpus;
  std::vector<int> cpu_slots;  // in rank order: rank r has [r·cpus, (r+1)·cpus), each rank's ascending
};

// What the jobs a pass did not examine wait for (see Plan::stopped).
struct TailState {
  int gpu_count = 0;
  int cpu_free = 0, cpu_total = 0;
};

struct Plan {
  std::vector<Placement> start;
  std::map<std::int64_t, std::vector<int>> reservations;  // blocked job -> GPUs held for it
  std::map<std::int64_t, std::string> waiting;            // blocked job -> why, for `gpuq show`
  // Batches whose jobs the pass passed over for their limit (as they stood then). Those jobs are
  // not in `waiting`: a throttled sweep of 100,000 jobs costs a pass no string per job; their
  // reason is batch_limit_reason(batch, at_limit[batch]).
  std::map<std::int64_t, BatchLimit> at_limit;
  // Users whose jobs the pass passed over for their limits, as they stood then (likewise).
  std::map<std::uint32_t, UserCap> users_at_limit;
  // A pass stops at the first job from which no job can start: no CPU slot can be taken (or no
  // later job needs one), and every GPU is held whole and reserved (or no later job could start
  // on a GPU alone). A deep queue then costs a pass the jobs up to that point, not the whole
  // queue. `waiting` and `reservations` cover the examined jobs; the others wait for
  // tail_wait_reason(job, tail), which is what examining them would have said.
  bool stopped = false;
  TailState tail;
  // The examined jobs that wait for GPUs alone (not for CPU slots or a limit), in line order: those
  // a preemption could make room for (preemption.hpp).
  std::vector<PendingJob> wanting_gpus;
  // The examined jobs without GPUs that wait for CPU slots alone, in line order: those a
  // suspension could lend slots to (preemption.hpp).
  std::vector<PendingJob> wanting_slots;
};

struct CpuSlots {
  int total = 1 << 30;
  std::set<int> taken;          // slots held by running jobs (numbers >= total are ignored)
  std::vector<int> core_nodes;  // slot s is on NUMA node core_nodes[s % size]; empty when unknown
};

// Why a job the pass did not examine waits.
std::string tail_wait_reason(const PendingJob& j, const TailState& tail);

// The CPU slots `j` takes from a pool of `total`.
int cpu_slots_needed(const PendingJob& j, int total);

// Why a job waits for its batch's limit.
std::string batch_limit_reason(std::int64_t batch, const BatchLimit& limit);

// Whether a job of `gpus` GPUs of a user with `cap` waits for the user's limits.
bool user_at_limit(const UserCap& cap, int gpus);
// Why, for the user `name`.
std::string user_limit_reason(const std::string& name, const UserCap& cap, int gpus);

// `stop_early = false` examines every job (tests compare the two).
Plan schedule(std::vector<PendingJob> queue, std::vector<GpuState> gpus, double now, CpuSlots cpu = {},
              bool stop_early = true, BatchLimits limits = {}, UserCaps users = {});

// The pass where another system (Slurm) decides where and when jobs run: every job of `queue`
// goes to it now, in line, within its batch's limit on jobs at once. First attempts of one batch
// that the system can take as one array (`array_key` of a job: equal keys go together; "": the
// job goes alone) are handed over together, at most `max_array` to an array; an array takes the
// room left in its batch's limit as its own (Slurm's %N) and leaves none, so that the batch's jobs
// there never run more than the limit at once, whoever is watching. A job that joins no array
// goes alone once fewer than the limit are handed over. `plan.start` holds the jobs that go
// alone, `plan.at_limit` the batches whose limit held jobs back.
struct Handover {
  struct Array {
    std::vector<std::int64_t> ids;
    int limit = 0;  // running at most this many at once (0: any)
  };
  Plan plan;
  std::vector<Array> arrays;
};
Handover hand_over(const std::vector<PendingJob>& queue, BatchLimits limits,
                   const std::function<std::string(const PendingJob&)>& array_key, std::size_t max_array);

// Lab mode's fair share: within each run of equal priority of `queue` (in line order), the jobs
// of several users are interleaved: next comes the head job of the user who, counting the jobs
// placed before it in this order as started, holds the fewest GPUs (a job without GPUs counts as
// one), then the one with the least recent GPU use (`usage`: GPU-seconds, decayed), then the
// lower uid; each user's own jobs keep their order. `held`: what each user's running jobs hold.
void fair_order(std::vector<PendingJob>& queue, const std::map<std::uint32_t, int>& held,
                const std::map<std::uint32_t, double>& usage);

}  // namespace gpuq::daemon
