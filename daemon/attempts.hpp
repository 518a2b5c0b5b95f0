// The attempts' owner: a job's launch (its record and launch.json written before any process
// exists, then the executor's hand-over, one job or an array), the attempt's end once the executor
// says its processes are gone (its last events read in, its outcome judged: a retry with backoff,
// or the job's end, in words a user can act on), and the file descriptors a pass may spend on
// launches. Every change of a record goes through the daemon's commit (Needs); nothing here
// touches the scheduler or the handlers. Unit tests drive it over a store in memory with an
// executor that records what it was asked (test_attempts).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

// clang-format off
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
// clang-format on

#include "daemon/config.hpp"
#include "daemon/event_tick.hpp"
#include "daemon/executor.hpp"
#include "daemon/job_table.hpp"
#include "daemon/launcher.hpp"
#include "daemon/machine.hpp"
#include "daemon/metrics.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/store.hpp"
#include "daemon/users.hpp"

namespace gpuq::daemon {

// The descriptors one pass may spend on launches: a launch that would leave fewer than the reserve
// waits, saying why, and is tried again soon (a job's end or a client's leaving frees some).
// gpuqd's log says so once a shortage, and once when it is over.
class DescriptorBudget {
 public:
  // Every pass begins here (what a pass that threw left is dropped): one that launches with what
  // is free now (descriptors(); free -1: unknown, no limit).
  void begin(bool launching, Descriptors fds = {});
  // Spends one launch's descriptors; nullopt, or (none spent) why the launch waits.
  std::optional<std::string> spend();
  // The pass is over: says (to stderr) that a shortage began or ended.
  void end();

 private:
  long m_free = -1;
  long m_reserved = 0;
  bool m_launching = false;  // this pass began with launches
  bool m_held_back = false;  // this pass held one back
  bool m_short = false;      // the last pass that launched was short (said already)
};

class Attempts {
 public:
  struct Needs {
    Commit commit;                           // every change of a record (Daemon::commit)
    std::function<void()> withdraw_orphans;  // after a job that will not succeed (dependencies.hpp)
    std::function<void()> schedule_soon;     // an attempt ended: GPUs free, or a retry waits
  };
  Attempts(boost::asio::io_context& io, const Config& config, Store& store, JobTable& jobs, Users& users,
           Machine& machine, Executor& executor, EventTick& events, MetricCounters& metrics, Needs needs);

  // A launch in two steps. First the record (running, with its GPUs, cores and port) and
  // launch.json: false when it could not start, its attempt ended (an owner with no account, a
  // working directory gone); throws RequestError (a full disk) with the job still queued.
  bool prepare(Active& a, const Placement& placement, double now);
  // Then the executor's hand-over; a refusal ends the attempt failed, with the executor's words.
  void start(Active& a);
  // Jobs prepared together, handed to an executor that places work as one array of `limit`
  // running at once (0: no limit); one job starts alone.
  void start_array(const std::vector<std::int64_t>& ids, int limit);
  // What the executor is told of a job's attempt.
  Executor::Attempt attempt_of(const JobRecord& rec) const;
  // A preemption's grace for the job: its spec's, else gpuqd's `preempt_grace_s`.
  double preempt_grace_s(const common::JobSpec& spec) const;
  // Asks a running job to checkpoint and stop, preempted by `by` (a job, or a user's `gpuq
  // preempt`): the intent stored first (a gpuqd restarted meanwhile carries it out), then the
  // executor asked. Once its processes are gone, finish() puts it back in line.
  void preempt(const std::vector<std::int64_t>& ids, const std::vector<std::string>& by, double now);
  // Freezes the running `victims` in place for the queued job `borrower`, which is to launch next
  // on their CPU slots (preemption.hpp's Suspension): the suspension stored first (a gpuqd
  // restarted meanwhile thaws them, the borrower not running), then each frozen. False when one
  // could not be frozen: those frozen are thawed, and the borrower waits on.
  bool suspend(const std::vector<std::int64_t>& victims, const JobRecord& borrower, double now);
  // Thaws each suspended job whose borrower's attempt no longer runs (it ended, or never began).
  // Returns whether any was thawed.
  bool thaw_lent(double now);
  // After a restart of gpuqd's: `id`, adopted running and suspended, is frozen again (its
  // executor's timeout backstop stands still) and watched for its borrower's end; where it cannot
  // be, it is thawed and recorded so.
  void keep_suspended(std::int64_t id, double now);
  // Whether a freeze of the job's current attempt failed: it is not asked again.
  bool unfreezable(const JobRecord& rec) const {
    const auto it = m_unfreezable.find(rec.id);
    return it != m_unfreezable.end() && it->second == rec.attempt;
  }
  // The executor says the job's processes are gone: its last events are read in and its end is
  // recorded. Where the store refuses, the job stays running in the records and this is tried
  // again every k_write_retry_s.
  void ended(std::int64_t id);
  // The executor says processes of an attempt that ended lingering (Executor::lingering) are gone:
  // the GPUs drained for it are back in service.
  void released(std::int64_t id);
  // At start: GPUs a gpuqd before this one drained for lingering processes (their reason names the
  // job) are held again for the jobs in `lingering` (Executor::adopt_lingering), and put back in
  // service where nothing of their job is left.
  void resume_holds(const std::vector<std::int64_t>& lingering);
  // Records an attempt's end as `outcome` says: a retry, or the job's end.
  void finish(Active& a, const Outcome& outcome);
  // After each look at the GPUs' processes: the shared jobs over their GPU memory budgets have
  // them raised, and those whose GPU's other jobs need the room are stopped, to go back in line
  // (gpu_budgets.hpp); stored first, as any intent.
  void hold_budgets(double now);

  DescriptorBudget& descriptors() { return m_descriptors; }

 private:
  // What the GPUs say of a failed attempt: for CUDA out of memory, its peak and the processes
  // outside gpuq that grew on its GPUs; for any failure, the Xids its GPUs reported meanwhile.
  // "" when nothing.
  std::string gpu_failure_notes(const JobRecord& r, const nlohmann::json& failure);

  boost::asio::io_context& m_io;
  const Config& m_config;
  Store& m_store;
  JobTable& m_jobs;
  Users& m_users;
  Machine& m_machine;
  Executor& m_executor;
  EventTick& m_events;
  MetricCounters& m_metrics;
  Needs m_needs;
  DescriptorBudget m_descriptors;
  // Drains the GPUs of `rec`'s ended attempt whose processes live on (`why`, Executor::lingering),
  // or counts it among those holding a GPU drained already for a lingering job; returns the GPUs it
  // holds ("0,1"), "" for none.
  std::string hold_gpus(const JobRecord& rec, const std::string& why);
  // GPUs drained for lingering processes, by index: the jobs whose processes hold each out of
  // service, and the reason it was drained with (the first job's).
  struct Held {
    std::set<std::int64_t> jobs;
    std::string reason;
  };
  std::map<int, Held> m_held_gpus;
  std::set<std::int64_t> m_suspended;  // jobs frozen for another (or ended since: thaw_lent forgets them)
  std::map<std::int64_t, int> m_unfreezable;  // job -> its attempt whose freeze failed
  std::set<std::int64_t> m_thaw_failed;       // said once: its thaw failed, tried again each pass
};

}  // namespace gpuq::daemon
