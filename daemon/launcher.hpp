// Launching a job attempt. The daemon writes the attempt's launch document (argv, environment,
// cwd and log file of every rank) into the attempt directory, then has gpuq-shim --serve fork a
// supervisor on it in a new session (SupervisorServer), or spawns gpuq-shim on it with
// Boost.Process. The shim, not the daemon, is the parent of the job's processes,
// so jobs keep running when the daemon stops or crashes (see supervisor/supervisor.hpp).
//
// Layout of a job:   <state>/jobs/<id>/             GPUQ_JOB_DIR (stable across attempts)
//                    <state>/jobs/<id>/checkpoints/ GPUQ_CHECKPOINT_DIR
//                    <state>/jobs/<id>/attempt-<n>/ launch.json shim.pid exit.json
//                                                   rank-<r>.log events-<r>.jsonl error-<r>.json
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/process.hpp"
#include "common/users.hpp"
#include "daemon/cgroups.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

using Env = std::map<std::string, std::string>;
// Shared with gpuq-shim (common/process.hpp), named here as the daemon has always named them.
using common::is_alive;
using common::mark_inherited_fds_cloexec;
using common::proc_stat_fields;
using common::process_start_time;
using common::ProcessId;
using common::read_pid_file;
using common::resolve_executable;
using common::wall_now;
using common::write_file_atomic;

std::string job_dir(const std::string& state_dir, std::int64_t id);
std::string attempt_dir(const std::string& state_dir, std::int64_t id, int attempt);
std::string rank_log_path(const std::string& attempt_dir, int rank);
std::string rank_events_path(const std::string& attempt_dir, int rank);
// $GPUQ_PREEMPT_FILE: the file the attempt's supervisor writes when the attempt is preempted.
std::string preempt_file_path(const std::string& attempt_dir);
// Whether an attempt's launch document has a `preempt` block, so that its supervisor takes a
// preemption (gpuqd writes it compact; the text cannot appear inside a JSON string, where quotes
// are escaped). Supervisors that an earlier gpuqd started, adopted across an upgrade, have none.
bool launched_with_preempt(const std::string& attempt_dir);
// The events a spec's `report` makes of rank `rank`'s output, written by its supervisor beside the
// rank's own events file (never into it: a line the job writes in pieces would take the
// supervisor's line into its middle, and both be lost). Their read offsets are kept under the
// key report_offset_key(rank), a rank number no rank has.
std::string rank_report_path(const std::string& attempt_dir, int rank);
constexpr int report_offset_key(int rank) {
  return -1 - rank;
}

// An attempt's directories for a job that runs as another user than gpuqd (lab mode): the job's
// own directory stays gpuqd's (mode 0711: its owner passes through, and cannot swap the attempt
// directory that gpuqd reads for another), while the attempt directory and the checkpoints belong
// to the owner, in `group` (the admin group, given one: mode 2750, so admins read the logs; else
// 0700). An existing one must already be the owner's, or gpuqd's own (then it is handed over).
Result<bool> make_owned_dirs(const std::string& state_dir, std::int64_t id, int attempt, uid_t owner,
                             std::optional<gid_t> group, gid_t owner_gid);
// The same for another directory of the job's own in jobs/<id> (an on_finish hook's, `name`).
Result<bool> make_owned_subdir(const std::string& state_dir, std::int64_t id, const std::string& name, uid_t owner,
                               std::optional<gid_t> group, gid_t owner_gid);

// The environment of one rank: the submitter's environment, then the spec's `env`, then what
// gpuq sets (CUDA_VISIBLE_DEVICES, the torchrun variables for ddp jobs, GPUQ_*). Pure.
// Every rank of a job sees all of the job's GPUs in rank order, as under torchrun or Slurm, so
// `torch.cuda.set_device(LOCAL_RANK)` in an unmodified script selects the rank's own GPU.
// A rank pinned to `cores` also gets GPUQ_CPUS (the list) and OMP_NUM_THREADS (their number).
Env rank_environment(const JobRecord& job, const Env& base_env, const std::vector<std::string>& gpu_uuids,
                     const std::string& job_dir, const std::string& attempt_dir, int rank,
                     const std::vector<int>& cores = {});

// Whose environment a job's ranks start from, and as whom they run.
struct RunsAs {
  // Another system runs the ranks (Slurm) and they start from its environment: which GPUs they
  // see and where rank 0 listens are that system's to say (Slurm sets CUDA_VISIBLE_DEVICES for
  // the allocation, the batch script MASTER_ADDR and MASTER_PORT from its nodes), so gpuq sets
  // none of CUDA_VISIBLE_DEVICES, GPUQ_GPU_UUIDS, MASTER_ADDR, MASTER_PORT.
  bool inherit_env = false;
  // Lab mode: the job's owner, whom gpuq-shim becomes; HOME, USER, LOGNAME and SHELL are theirs,
  // as login(1) sets them, whatever the submitter's environment said. nullptr: gpuqd's user.
  const common::Account* account = nullptr;
  // OMP_NUM_THREADS for the ranks of a job without `cpus` (unpinned), unless its spec or the
  // submitter's environment sets it: its share of gpuqd's cores (omp_share); 0: none set.
  int omp_threads = 0;
};

// A job without `cpus`'s share of gpuqd's `cores` for each rank, as OMP_NUM_THREADS (PyTorch's
// intra-op pool sizes itself to every core of the machine otherwise: 12 shared jobs on 2 cores ran
// at load 9.5): a rank with GPUs gets the cores of its GPUs' share of the machine's `machine_gpus`,
// and a shared one the part of that its `gpu_memory_mb` is of the GPU's `gpu_total_mb`; a rank
// without GPUs 1 (it holds one CPU slot). At least 1. 0 for a job with `cpus` (pinned: its cores).
int omp_share(const common::JobSpec& spec, int cores, int machine_gpus, std::int64_t gpu_total_mb);

// The launch document gpuq-shim executes (all ranks), also written for `gpuq show`. `cores` maps
// CPU-pool slots to core ids (slot s is core cores[s % size]); a job with `cpus` has each rank
// pinned to the cores of its share of the job's slots. `core_nodes[i]` is the NUMA node of
// cores[i] (-1 or missing: unknown); with `mem_bind` a rank's entry names its cores' nodes
// ({"policy": "local", "nodes": [0]}; no nodes where one is unknown) for the shim to bind to.
nlohmann::json launch_document(const JobRecord& job, const Env& base_env,
                               const std::vector<std::string>& gpu_uuids, const std::string& state_dir,
                               double grace_s, std::int64_t log_limit_bytes = 0, const std::vector<int>& cores = {},
                               const std::vector<int>& core_nodes = {}, const RunsAs& runs_as = {});

// The NUMA nodes of the cores `subset`, where cores[i] is on node core_nodes[i]: ascending,
// distinct; empty when the node of any of them is unknown.
std::vector<int> numa_nodes_of(const std::vector<int>& subset, const std::vector<int>& cores,
                               const std::vector<int>& core_nodes);

// The cores each rank of a `cpus` job is pinned to: rank r takes `cpus` consecutive entries of
// the job's slots, wrapping around when the job got fewer slots than it asked (a job wider than
// the pool), mapped to cores as above. Ascending, without repeats; empty without `cpus`.
std::vector<std::vector<int>> rank_cores(const JobRecord& job, const std::vector<int>& cores);
// Their union: what JobRecord::cores keeps.
std::vector<int> job_cores(const JobRecord& job, const std::vector<int>& cores);

// The slots of a pool of `total` that map onto `job_cores` when slot s is core cores[s % size]:
// what a job pinned to those cores holds in this mapping, so no other job is given them. A
// restarted gpuqd under another affinity mask maps slots to other cores than the one that
// launched the job; its slots are re-derived from the cores it really runs on.
std::vector<int> slots_on_cores(const std::vector<int>& job_cores, const std::vector<int>& cores, int total);

// The cores this process may run on (its affinity mask, which honours taskset and cpusets),
// ascending; gpuqd's CPU pool is made of them.
std::vector<int> usable_cores();

// Spawns `shim_path attempt_dir/launch.json` in its own session; returns its pid. With `cgroups`
// (the attempt's cgroup in each hierarchy, as Cgroups::make gives them), rank R joins `rank-R` of
// each (or the cgroup itself, where its ranks have none of their own) before it runs (the shim
// stays outside).
Result<int> spawn_supervisor(const std::string& shim_path, const std::string& attempt_dir,
                             const std::vector<AttemptCgroup>& cgroups = {});

// gpuqd's end of `gpuq-shim --serve` (supervisor/serve.hpp), which forks each attempt's
// supervisor where spawn_supervisor execs one: the same supervisor, in a session of its own,
// named `gpuq-shim DIR/launch.json` in its command line, outliving gpuqd. The server is gpuqd's
// child, started at the first start(); it ends when this closes its end (destroyed, or given up
// on), and what it started goes on. A start holds gpuqd's thread for one fork: a server that has
// not answered within k_answer_ms of the request is killed and one more is tried within the same
// bound; after that (or a server that cannot start), start() fails at once for k_rest_s, and the
// caller execs the supervisor. A start is done at most once whatever fails (serve.cpp's start()).
class SupervisorServer {
 public:
  explicit SupervisorServer(std::string shim_path) : m_shim(std::move(shim_path)) {}
  ~SupervisorServer() { end(); }
  SupervisorServer(const SupervisorServer&) = delete;
  SupervisorServer& operator=(const SupervisorServer&) = delete;

  struct Started {
    ProcessId pid;
    int pidfd = -1;  // the caller's to close; -1 where the kernel has no pidfd_open
  };
  // Starts the supervisor of `attempt_dir`/launch.json, as spawn_supervisor would.
  Result<Started> start(const std::string& attempt_dir, const std::vector<AttemptCgroup>& cgroups = {});
  // The server's pid; 0 while none runs.
  int pid() const { return m_pid; }

  static constexpr int k_answer_ms = 3000;
  static constexpr double k_rest_s = 60;

 private:
  Result<bool> launch();
  Result<Started> ask(const std::string& request, std::chrono::steady_clock::time_point deadline);
  void end();
  std::string m_shim;
  int m_sock = -1;  // gpuqd's end of the socket pair
  int m_pid = 0;
  std::vector<int> m_dead;  // servers killed and not yet reaped
  std::chrono::steady_clock::time_point m_rest_until{};
};

// File descriptors. gpuqd raises its soft RLIMIT_NOFILE to the hard limit at start (every running
// job holds one, every client one, a launch a few more for a moment), and gives what it spawns
// the soft limit it was started with: programs that select() or walk every descriptor expect the
// usual 1,024. Returns the line to log ("" when nothing changed).
std::string raise_descriptor_limit();
// Descriptors gpuqd can still open (its soft limit less those open, from /proc/self/fd; -1:
// unknown), and how many it keeps for clients, the store, logs and hooks: 64, or a quarter of a
// smaller limit. A job starts only while `reserved` + k_descriptors_per_launch are free, and
// waits, saying why, otherwise (it never fails for it).
struct Descriptors {
  long free = -1;
  long reserved = 0;
};
Descriptors descriptors();
constexpr long k_descriptors_per_launch = 8;  // the supervisor's pidfd and, for a moment, spawn's pipes and files

// A TCP port on 127.0.0.1 that is free now and not in `in_use` (handed to DDP ranks).
int pick_free_port(const std::set<int>& in_use);

}  // namespace gpuq::daemon
