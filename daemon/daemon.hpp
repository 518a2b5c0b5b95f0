// gpuqd's core: the job table and its indexes, the command table and the request handlers (in
// files by group, named in daemon.cpp), scheduling and recovery after a restart.
// States change through lifecycle.hpp's transition() and land through commit(); job processes are
// the Executor's (executor.hpp). Single-threaded on one io_context: handlers, process exits and
// timers never race. (Two helper threads, which touch no
// daemon state and answer through the io_context: one deletes what `clean` moved into the trash,
// one checks submitted batches.)
// The store is written before any action is acknowledged or taken, so a crash at any point
// leaves a state the next start resumes.
#pragma once

#include <sys/types.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/protocol.hpp"
#include "common/users.hpp"
#include "daemon/attempts.hpp"
#include "daemon/config.hpp"
#include "daemon/control.hpp"
#include "daemon/event_tick.hpp"
#include "daemon/executor.hpp"
#include "daemon/hooks.hpp"
#include "daemon/job_table.hpp"
#include "daemon/last_pass.hpp"
#include "daemon/machine.hpp"
#include "daemon/metrics.hpp"
#include "daemon/operations.hpp"
#include "daemon/outbox.hpp"
#include "daemon/parts.hpp"
#include "daemon/pass_pacer.hpp"
#include "daemon/reads.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/store.hpp"
#include "daemon/users.hpp"
#include "daemon/waiters.hpp"
#include "daemon/watches.hpp"

namespace gpuq::daemon {

namespace asio = boost::asio;
using json = nlohmann::json;

class Daemon {
 public:
  Daemon(asio::io_context& io, Config config, std::unique_ptr<Store> store, Inventory inventory);
  ~Daemon();

  // Gives back the caches it can do without (the store's pages): before the heap is trimmed.
  void release_memory() { m_store->release_memory(); }
  bool idle() const { return m_jobs.size() == 0; }  // no job queued or running
  // Replies made and not yet read by the clients, bounded (outbox.hpp): the server's connections'.
  const std::shared_ptr<Outbox>& outbox() const { return m_outbox; }
  // The client of `connection` (Caller::connection) hung up: the waits and watches it held go.
  void abandon(std::uint64_t connection) {
    m_waiters.abandon(connection);
    m_watches.abandon(connection);
  }
  // Re-adopts running jobs, records those that ended while no daemon ran, and schedules.
  void recover();
  // Handles one request; `reply` is called exactly once, possibly later (wait).
  void dispatch(const Caller& caller, const json& request, Reply reply);
  // The Prometheus exposition of gpuqd's state and counters (metrics.cpp; docs/monitoring.md).
  std::string metrics_text() { return gpuq::daemon::metrics_text(reads(), m_metrics, m_hooks); }
  void dispatch(const json& request, Reply reply) { dispatch(Caller::self(), request, std::move(reply)); }
  // Whom a connection's peer is, or why gpuqd does not serve it (forbidden).
  Result<Caller> identify(uid_t uid) const { return m_users.identify(uid); }
  // Set by main: called when a client asks the daemon to shut down.
  std::function<void()> on_shutdown;

  // The command table (daemon.cpp) is the only list of gpuqd's commands: each row names a
  // command, the decoder of its request (common/protocol.hpp) and its handler, which either
  // answers at once (`now`: its return value is the reply) or takes the reply to answer later
  // (`later`: a wait, or a long request done in parts). A handler throws RequestError to refuse.
  using Run = void (Daemon::*)(const Caller& caller, const json& request, Reply& reply);
  struct Command {
    std::string_view name;
    Run run;
  };
  static const std::vector<Command>& commands();

 private:

  // The rows of commands(): a command of common::k_commands (its name and decoder) with its
  // handler, which takes the caller and the decoded request where it names them, and answers now
  // (its return value is the reply) or later (it is handed the reply).
  template <const auto& C, auto Handler>
  static Command now() {
    return {C.name, &Daemon::answer_now<C, Handler>};
  }
  template <const auto& C, auto Handler>
  static Command later() {
    return {C.name, &Daemon::answer_later<C, Handler>};
  }
  // A handler is a member (taking this), a function of what the daemon holds (Daemon&: an owner's
  // handler, reached through the row), a read-only function of a Reads, or a function of a
  // Changes (control.hpp).
  template <const auto& C, auto Handler>
  void answer_now(const Caller& caller, const json& request, Reply& reply) {
    using H = decltype(Handler);
    using Q = typename std::remove_cvref_t<decltype(C)>::request;
    Q q = C.decode(request);
    if constexpr (std::is_invocable_v<H, const Reads&, const Caller&, Q>)
      reply(answer<C>(Handler(reads(), caller, std::move(q))));
    else if constexpr (std::is_invocable_v<H, const Changes&, const Caller&, Q>)
      reply(answer<C>(Handler(changes(), caller, std::move(q))));
    else if constexpr (std::is_invocable_v<H, Daemon&, const Caller&, Q>)
      reply(answer<C>(std::invoke(Handler, *this, caller, std::move(q))));
    else if constexpr (std::is_invocable_v<H, Daemon&, Q>)
      reply(answer<C>(std::invoke(Handler, *this, std::move(q))));
    else if constexpr (std::is_invocable_v<H, Daemon&, const Caller&>)
      reply(answer<C>(std::invoke(Handler, *this, caller)));
    else
      reply(answer<C>(std::invoke(Handler, *this)));
  }
  // A handler's answer, which must be of its command's reply type (common/protocol.hpp's table).
  template <const auto& C, class Answer>
  static json answer(const Answer& a) {
    static_assert(std::is_same_v<Answer, typename std::remove_cvref_t<decltype(C)>::reply>,
                  "the handler's answer is not of the reply type its command is bound to");
    return common::ok_reply(a);
  }
  // A later handler is handed a Later of its command's reply type: one that takes another type
  // does not compile. It takes the Later (moves it) only once it will answer through it; a refusal
  // before that is thrown, and dispatch answers it through `reply`, given back. Once taken, only
  // the Later answers: a throw after that is logged by dispatch, not answered twice.
  template <const auto& C, auto Handler>
  void answer_later(const Caller& caller, const json& request, Reply& reply) {
    using Cmd = std::remove_cvref_t<decltype(C)>;
    using Q = typename Cmd::request;
    using L = Later<typename Cmd::reply>;
    static_assert(std::is_invocable_v<decltype(Handler), Daemon&, const Caller&, Q, L&>,
                  "a later handler takes the caller, the request and a Later of its command's reply type");
    L later(std::move(reply));
    try {
      std::invoke(Handler, *this, caller, C.decode(request), later);
    } catch (...) {
      if (later) reply = later.release();  // not taken: the refusal is dispatch's to send
      throw;
    }
  }
  common::NoFields cmd_shutdown(const Caller& caller);

  // Handlers, by group: see the files named in daemon.cpp.
  void cmd_submit(const Caller& caller, common::SubmitRequest sub,
                  Later<common::SubmitReply>& reply);             // answers once the batch is written
  Result<bool> accept_submission(Submissions::Batch& s);          // Submissions::Accept
  void submission_written(Submissions::Batch& s);                 // Submissions::Written
  void cmd_wait(const Caller& caller, const common::IdsRequest& q,
                Later<common::JobsReply>& reply);  // takes `reply` only once the request is valid
  void cmd_watch(const Caller& caller, const common::WatchRequest& q, Later<common::WatchReply>& reply);

  // Scheduling: one pass (m_pacer runs it); the attempts' owner launches what it places.
  void schedule_now();
  // After a pass: preemptions for the jobs it left waiting for GPUs (running.cpp).
  void preempt_for(const Plan& plan, double now);
  void suspend_for(const Plan& plan, const UserCaps& caps, double now);
  // A re-adopted job's record with its slots under this gpuqd's CPU mask; nullopt where they stand.
  std::optional<JobRecord> rederive_slots(const JobRecord& rec) const;
  // The one place a change of state lands: `changed` (each a record lifecycle.hpp made, `why` its
  // history row's reason where given) is stored in one transaction with a transition each, then
  // applied in memory in order (of two records of one job, the second: a failed attempt and its
  // retry). Throws (store_error) before anything in memory changed. `also`: records of other jobs
  // written in the same transaction without a transition (a cancel's intent on running ones),
  // applied in memory after them.
  void commit(std::vector<JobRecord> changed, const std::vector<std::string>& why = {},
              std::vector<JobRecord> also = {});
  // What commit does with another store write: an update's new specs (no transition), a restart's
  // part (with its progress). `write` is handed the rows and throws before memory changes; a
  // record that ends a job makes its hooks due, a job that comes back is live to dependencies
  // and waits again. Every record lands here, but a submission's new jobs (Submissions, then submission_written).
  void land(std::vector<JobRecord> changed, const WriteRows& write);
  // Memory after the store took `rec`: the job table files it (JobTable::apply), the metrics count
  // its change of state, and waiters hear of a job that ended or came back.
  void apply(JobRecord rec);
  // Metrics' counters for a job's change of state (`was`: nullopt for one new to memory).
  void count_transition(Active& a, std::optional<JobState> was, const JobRecord& now);
  void notify_waiters();
  // commit, as the owners are handed it; and dependencies::withdraw_orphans over this daemon.
  Commit commit_fn();
  void withdraw_orphans();

  // What the handlers read through (reads.hpp), over this daemon's owners.
  Reads reads();
  // What the handlers that change jobs in place may touch (control.hpp).
  Changes changes();

  asio::io_context& m_io;
  Config m_config;
  std::unique_ptr<Store> m_store;
  Machine m_machine;  // GPUs, their service and processes, CPU cores (machine.hpp)
  Users m_users;  // callers, accounts, lab mode's limits and fair share (users.hpp)
  Hooks m_hooks;  // on_finish hooks (hooks.hpp)
  JobTable m_jobs;  // queued and running jobs, filed by state (job_table.hpp)
  LastPass m_last_pass;  // what the last scheduling pass said (last_pass.hpp)
  Waiters m_waiters;  // `wait`s, answered once their jobs end (waiters.hpp)
  std::shared_ptr<Outbox> m_outbox = std::make_shared<Outbox>();
  Watches m_watches;  // which jobs changed, and the `watch`es held until one does (watches.hpp)
  MetricCounters m_metrics;
  PassPacer m_pacer;                     // when scheduling passes run (pass_pacer.hpp)
  std::unique_ptr<Executor> m_executor;  // runs the attempts (executor.hpp)
  EventTick m_events;  // running jobs' events read in, and the hang watch (event_tick.hpp)
  Attempts m_attempts;  // launches attempts and records their ends (attempts.hpp)
  // Submit, restart and clean, done in parts (operations.hpp). Declared last: the threads of its
  // trash and its submission checks are joined before the state they post to goes.
  Operations m_ops;
};

}  // namespace gpuq::daemon
