// Hooks: a command run once a job has ended (on_finish: pueue's callback, task-spooler's
// TS_ONFINISH, Slurm's strigger), or once it has been preempted and is back in line (on_preempt),
// from the configuration (every job's) and from the job's spec.
// An owner of its own state (which jobs' hooks wait for a turn, which run), with what it needs of
// the rest of gpuqd named in its constructor: the store (the job, its batch's environment, whether
// its hooks are due), the users (whose account a hook runs as) and how a job is described to its
// hook. Unit-tested alone (tests/unit/test_hooks.cpp) with processes of the test's own.
#pragma once

#include <sys/types.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/spec.hpp"
#include "daemon/store.hpp"
#include "daemon/users.hpp"

namespace gpuq::daemon {

class Hooks {
 public:
  struct Setup {
    std::vector<std::string> on_finish;  // every job's hook (the configuration's); empty: none
    std::vector<std::string> on_preempt;  // likewise, run when a job is preempted
    int max_hooks = 4;                   // hooks running at once; the rest wait their turn
    double timeout_s = 300;              // hook_timeout_s
    double grace_s = 5;                  // SIGTERM to SIGKILL at its timeout (at most 5 s)
    bool multi_user = false;             // hooks run as their job's owner
    std::string state_dir;
    std::optional<gid_t> admin_gid;
    std::string shim_path;
  };
  // The job as `gpuq show --json` gives it: its hook's stdin.
  using Describe = std::function<nlohmann::json(std::int64_t id)>;
  // Starts a supervisor on `dir`/launch.json and returns its pid (gpuqd's child): spawn_supervisor
  // with setup.shim_path unless a test gives another.
  using Spawn = std::function<Result<int>(const std::string& dir)>;
  Hooks(boost::asio::io_context& io, Setup setup, Store& store, Users& users, Describe describe, Spawn spawn = {});

  // Whether a job with `spec` has hooks to run for `event`.
  bool any_for(const common::JobSpec& spec, HookEvent event = HookEvent::finish) const {
    return event == HookEvent::preempt ? !m_setup.on_preempt.empty() || !spec.on_preempt.empty()
                                       : !m_setup.on_finish.empty() || !spec.on_finish.empty();
  }
  // Job `id` has ended (been preempted) with its hooks due (the store says so already): they run
  // in their turn.
  // One waiting for its turn already (of the same job and event, not yet started) is not queued
  // twice: the store holds one row a job and event, so a crash could not run it twice either.
  void due(DueHook h) {
    if (m_waiting.insert(h).second) m_due.push_back(std::move(h));
  }
  // Starts due hooks, up to max_hooks at once. Each job's run under a gpuq-shim of their own (as the
  // job's owner in lab mode), in jobs/<id>/on-finish-<restarts>-<k>/ (on-preempt-<preemptions>-<k>/),
  // with the job on stdin, bounded by timeout_s; each end is watched through a pidfd on the
  // io_context and starts the next.
  void run();
  int running() const { return m_processes; }              // hook processes, of all jobs
  std::size_t waiting() const { return m_due.size(); }     // jobs whose hooks wait for a turn

 private:
  void start(const DueHook& h);
  void ended(const DueHook& h, const std::string& dir, int pid, uid_t owner);

  boost::asio::io_context& m_io;
  Setup m_setup;
  Store& m_store;
  Users& m_users;
  Describe m_describe;
  Spawn m_spawn;
  std::deque<DueHook> m_due;      // jobs whose hooks wait for a turn
  std::set<DueHook> m_waiting;    // the same, to look up
  std::map<DueHook, int> m_jobs;  // job and event -> its hooks still running
  int m_processes = 0;
};

}  // namespace gpuq::daemon
