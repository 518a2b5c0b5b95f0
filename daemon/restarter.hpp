// Restarts under way (`gpuq restart`): ended jobs queued again under their own ids with the jobs
// that failed waiting for them, chosen, cleared (--fresh) and requeued in parts; those a crash cut
// short are finished at the next start. How, step by step: restart.cpp's opening comment.
// What a restart changes lands through the daemon (Needs::land), so the job table, metrics and
// waiters see a requeued job as they see every change.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>

#include "common/protocol.hpp"
#include "daemon/job_table.hpp"
#include "daemon/reads.hpp"
#include "daemon/restart_pins.hpp"
#include "daemon/store.hpp"
#include "daemon/trash.hpp"
#include "daemon/users.hpp"
#include "daemon/waiters.hpp"

namespace gpuq::daemon {

// A user's jobs that are queued or running, or chosen by a restart under way: what max_queued
// bounds, on every path that queues jobs (submit, restart).
std::int64_t queued_or_running(const JobTable& jobs, const RestartPins& pins, uid_t owner);

class Restarter {
 public:
  // What a restart asks of the daemon that holds it.
  struct Needs {
    std::function<Reads()> reads;
    // Daemon::land: the requeued records, written by `write` in one transaction.
    Land land;
    std::function<void()> schedule_soon;
  };
  Restarter(boost::asio::io_context& io, std::string state_dir, Store& store, JobTable& jobs, RestartPins& pins,
            Trash& trash, const Users& users, Needs needs);

  // `restart`: refuses at once (RequestError) a job that has not ended, is another's or another
  // restart's; else takes `reply`, answered once every job is requeued or the restart is refused.
  void start(const Caller& caller, const common::RestartRequest& q, Later<common::RestartReply>& reply);
  // At gpuqd's start: finishes the restarts a crash cut short (Store::unfinished_restarts).
  void resume();

 private:
  struct Restarting {
    enum class Step { choose, clear, requeue } step = Step::choose;
    bool fresh = false;
    std::map<std::int64_t, JobRecord> chosen;   // until requeued
    std::map<std::int64_t, std::int64_t> with;  // a dependent -> the chosen job it had failed waiting for
    std::vector<std::int64_t> frontier;         // chosen jobs whose dependents are still to be read
    std::int64_t batch = 0, batch_after = 0;    // a batch to read, from after this id on
    std::vector<std::int64_t> outside;          // jobs not restarted that chosen ones wait for
    std::size_t cleared = 0;                    // --fresh: of plan.jobs, those whose checkpoints are gone
    Trash::Moved moved;
    Store::RestartPlan plan;
    std::size_t part_jobs = 256;  // jobs in the next requeue part
    common::RestartReply out;
    Later<common::RestartReply> reply;  // none for a restart resumed at start
  };
  void part(const std::shared_ptr<Restarting>& r);  // the next part of it, or its answer
  bool choose_part(Restarting& r);  // each returns true once its step is done
  bool clear_part(Restarting& r);
  bool requeue_part(Restarting& r);
  void choose(Restarting& r, JobRecord rec, std::int64_t along);
  void done(Restarting& r);
  void release_outside(Restarting& r);

  boost::asio::io_context& m_io;
  std::string m_state_dir;
  Store& m_store;
  JobTable& m_jobs;
  RestartPins& m_pins;
  Trash& m_trash;
  const Users& m_users;
  Needs m_needs;
};

}  // namespace gpuq::daemon
