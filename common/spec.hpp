// The job spec: what a user writes in job.json. Parsing is strict: every error names the job, the
// field and the fix, unknown fields are errors (a typo like "gpu": 2 must never run on zero GPUs),
// and a batch is accepted or rejected as a whole. Checks that need the machine (how many GPUs it
// has) happen in the daemon; everything else happens here so the CLI and daemon agree.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace gpuq::common {

using json = nlohmann::json;

enum class Mode { independent, ddp };

// Memory placement of a job with `cpus`, as Slurm's --mem-bind: `local` binds each rank's memory
// to the NUMA nodes of its cores (MPOL_BIND: allocations fail over to the OOM killer, not to
// another node), `prefer` only prefers them (MPOL_PREFERRED: other nodes once they are full).
enum class MemBind { none, local, prefer };

// `after` entries: a name of a job in the same batch, or the id of an already submitted job.
struct Dependency {
  std::string name;     // set when the dependency names a job in the same batch
  std::int64_t id = 0;  // set (> 0) for an existing job, or once a batch name is resolved
};

// How a program that does not write $GPUQ_EVENTS reports: what its supervisor reads from one
// rank's output lines (RE2 patterns whose named groups, `(?P<loss>[0-9.]+)`, become an event's
// fields) and from a file it leaves (a JSON object, its result). gpuq-shim turns them into events
// (supervisor/output_report.hpp).
struct Report {
  std::vector<std::string> progress;  // each line a pattern matches: a progress event
  std::vector<std::string> result;    // each match's fields go into the result, the last match winning
  int rank = 0;                       // whose output
  std::string file;                   // read when the job ends, relative to its cwd; "" for none
  bool empty() const { return progress.empty() && result.empty() && file.empty(); }
};
constexpr std::size_t k_max_report_patterns = 16;  // in each of progress and result
constexpr std::size_t k_max_report_pattern_bytes = 1024;

// Where a shared job goes among the GPUs it fits on: `pack` (best fit: the GPU left with the least
// free memory, so whole GPUs stay free for exclusive jobs) or `spread` (the GPU with the fewest
// jobs, then the most free memory: shared jobs that compete for compute each get a GPU while
// there are idle ones). A spec that names none gets gpuqd's `placement` when it is submitted.
enum class Placement { pack, spread };

enum class PreemptMode { auto_, requeue, suspend };
std::string_view to_string(PreemptMode m);
// What gpuqd does with a shared job over its GPU memory budget while its GPU's other jobs need the
// room (daemon/gpu_budgets.hpp): stop it and requeue it with a larger budget, or only raise its
// budget and say so. default_: gpuqd's `gpu_memory_policy`.
enum class MemoryPolicy { default_, requeue, warn };
std::string_view to_string(MemoryPolicy p);

struct JobSpec {
  std::string name;
  std::vector<std::string> command;  // argv; for a "shell" job: {"/bin/sh", "-c", shell}
  std::string shell;                 // the shell text when the user asked for one
  int gpus = 0;
  Mode mode = Mode::independent;
  int ranks = 1;  // processes: 1 for independent jobs, one per GPU (or `ranks` on CPU) for ddp
  int nodes = 1;  // machines a ddp job's ranks and GPUs are split over, evenly (Slurm executor)
  int cpus = 0;   // cores per rank, pinned and counted against gpuqd's CPU pool; 0 = unspecified
  MemBind mem_bind = MemBind::none;  // needs cpus
  std::int64_t gpu_memory_mb = 0;  // per GPU; 0 = unspecified
  std::int64_t memory_mb = 0;      // host memory (and swap) per rank, a limit the kernel holds it to; 0 = none
  bool shared = false;             // may share a GPU with other shared jobs when memory allows
  Placement placement = Placement::pack;  // among the GPUs a shared job fits on
  int priority = 0;
  std::vector<Dependency> after;
  int retries = 0;
  bool retry_on_oom = false;  // an attempt that ended out_of_memory is retried too (within `retries`)
  double timeout_s = 0;  // 0 = no timeout
  std::map<std::string, std::string> env;
  std::map<std::string, json> labels;  // each a string, a number or a boolean, kept as typed
  std::string cwd;  // absolute; the submitter's directory when the spec has none
  json train;       // a `train` job: the normalised train section (common/train_spec.hpp), else null
  std::vector<std::string> on_finish;  // argv run once the job has ended (hooks.cpp); empty: none
  std::vector<std::string> on_preempt;  // argv run once the job has been preempted; empty: none
  Report report;                       // progress and results read from its output (report.hpp)
  // Preemption (daemon/preemption.hpp): whether a higher-priority job may stop it to start, the
  // signal its processes get first ("": SIGTERM), and the seconds they have to checkpoint before
  // the rest is killed (< 0: unset; gpuqd's `preempt_grace_s` fills it at submit, as `preemptible`).
  bool preemptible = false;
  std::string preempt_signal;
  double preempt_grace_s = -1;
  // How it may be preempted: `auto` (frozen in place where that frees what the urgent job needs,
  // its CPU slots; else stopped and requeued), `requeue` (never frozen: a job holding connections
  // that time out), `suspend` (never stopped: a job that cannot checkpoint).
  PreemptMode preempt_mode = PreemptMode::auto_;
  MemoryPolicy gpu_memory_policy = MemoryPolicy::default_;
};

// The argv placeholder of a train job; gpuqd puts its gpuq-worker's path there at launch.
constexpr const char* k_worker_placeholder = "gpuq-worker";

constexpr int k_max_gpus = 1024;
constexpr int k_max_cpus = 4096;
constexpr int k_max_nodes = 1024;
constexpr int k_max_retries = 100;
constexpr int k_max_priority = 1000000;  // priorities run from -k_max_priority to k_max_priority
constexpr std::size_t k_max_batch = 100000;
constexpr double k_max_timeout_s = 1e9;
constexpr double k_max_preempt_grace_s = 86400;
// Linux's MAX_ARG_STRLEN (32 pages of 4 KiB): the longest single argv or environment string,
// with its NUL, that exec accepts.
constexpr std::size_t k_max_exec_string = 32 * 4096;
constexpr std::size_t k_max_on_finish_bytes = 256 * 1024;  // a hook's argv, all strings
constexpr std::size_t k_max_on_finish_args = 4096;           // and its arguments

// Parses one job object or an array of them, jobs with a `matrix` expanded first (matrix.hpp).
// `default_cwd` fills jobs without `cwd`.
// On failure the Error lists every problem found, one per line, each prefixed with its job.
Result<std::vector<JobSpec>> parse_batch(const json& doc, const std::string& default_cwd);

// The same, keeping going past the jobs whose specs have problems, so that gpuqd can check the
// others against the machine and list every problem of a batch in one answer. The Error is for a
// batch that has no jobs to look at (not an object or array, empty, too large, a bad matrix).
struct BatchParse {
  std::vector<JobSpec> specs;                        // one per job; a spec with problems holds what could be read of it
  std::vector<bool> ok;                              // per job: its spec has no problem
  std::vector<std::string> problems;                 // "job[3] (name): ...", the specs' own, then their `after`s'
  std::vector<std::vector<std::size_t>> local_deps;  // when every spec is ok and `after` resolves
};
Result<BatchParse> parse_batch_all(const json& doc, const std::string& default_cwd);

// The error for a spec with these problems: "invalid job spec (2 problems):" and one per line.
Error invalid_spec_error(const std::vector<std::string>& problems);

// Parses one job object without batch-level checks (used to reload stored specs).
Result<JobSpec> parse_job(const json& obj, const std::string& default_cwd);

// Resolves `after` names within the batch to indices and rejects cycles; returns, per job, the
// indices of the batch jobs it waits for. Existing-job ids are left for the daemon to check.
Result<std::vector<std::vector<std::size_t>>> resolve_batch_dependencies(
    const std::vector<JobSpec>& batch);

json to_json(const JobSpec& spec);

// A set of core ids the way the kernel writes one (cpuset, taskset -c): ascending, runs as ranges:
// {0, 1, 2, 3, 6} -> "0-3,6".
std::string format_cpu_list(const std::vector<int>& cores);
// The inverse: "0-3,8" -> {0, 1, 2, 3, 8}, ascending, without repeats; nullopt if malformed.
std::optional<std::vector<int>> parse_cpu_list(const std::string& text);
std::string_view to_string(Mode mode);
// A `preempt_signal`'s number ("SIGUSR1" or "USR1" -> 10; "" -> SIGTERM); 0 for one not allowed.
int preempt_signal_number(std::string_view name);
// A job's name as specs allow it: 1-128 letters, digits, '-', '_' or '.', not all digits.
bool valid_name(const std::string& s);
std::string_view to_string(MemBind bind);

// Environment variables gpuq sets for every job; a spec may not override them.
bool is_reserved_env(const std::string& key);

// exec takes at most ARG_MAX bytes of arguments and environment in all (E2BIG), pointers included.
// The bytes exec needs besides the job's own arguments and environment: the variables gpuq sets
// for a rank (job-spec.md), with room.
constexpr std::size_t k_env_reserve_bytes = 16 << 10;
std::size_t exec_bytes(const std::map<std::string, std::string>& env);
// Why `spec` with `base_env` under it could never be exec'd on this machine ("its command and
// environment come to 3,900 KiB; exec takes at most ..."), or "": gpuqd refuses such a job at
// submit, and `submit --dry-run` says so too.
std::string exec_size_problem(const JobSpec& spec, std::size_t base_env_bytes);

}  // namespace gpuq::common
