// gpuqd's settings: every key of the configuration table (common/config.hpp) and what only gpuqd
// knows (its helpers' paths, intervals, another executor for tests).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/config.hpp"
#include "daemon/cgroups.hpp"
#include "daemon/executor.hpp"

namespace gpuq::daemon {

// What gpuqd runs with: every setting of the configuration table (common/config.hpp: the file,
// the environment, gpuqd's options), and what only gpuqd knows.
struct Config : common::Settings {
  std::string shim_path;
  std::string worker_path;  // gpuq-worker, for train jobs; empty when this build has none
  double retry_backoff_max_s = 60;
  double ingest_interval_s = 0.25; // how often running jobs' event files are read
  std::string sysfs_root = "/sys"; // CPU topology and NUMA nodes (another tree in tests)
  int max_hooks = 4;               // hooks running at once; the rest wait their turn
  std::optional<gid_t> admin_gid;  // admin_group's members may act on every job (as root may)
  double slurm_poll_s = 2;         // its squeue, once for all jobs, this often
  // The attempts' cgroups as main opened them at start (which their failure may stop); unset:
  // the local executor opens them.
  std::optional<Result<Cgroups>> cgroups;
  // Another executor, whatever `executor` says (tests: one that records what it is asked).
  std::function<std::unique_ptr<Executor>(boost::asio::io_context&, Executor::Ended)> make_executor;

  bool hang_retry() const { return hang_action == "retry"; }
  // A shared job over its GPU memory budget while its neighbours need the room is stopped and
  // requeued (gpu_budgets.hpp), by its spec's word or else gpuqd's. In lab mode a spec's `warn`
  // does not loosen gpuqd's `requeue`: one user's job would take the room of another's.
  bool budget_stops(const common::JobSpec& spec) const {
    if (spec.gpu_memory_policy == common::MemoryPolicy::default_ || (multi_user && gpu_memory_policy == "requeue"))
      return gpu_memory_policy == "requeue";
    return spec.gpu_memory_policy == common::MemoryPolicy::requeue;
  }
};

}  // namespace gpuq::daemon
