// `clean`: ended jobs' files freed (or the jobs forgotten) in parts through the state dir's trash,
// and, with forget_after_s, old jobs forgotten on a timer. How and why in parts: clean.cpp's
// comment on start(). What it must not forget (still_needed) comes from the job table, the
// waits and the restarts under way.
#pragma once

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
#include "daemon/waiters.hpp"

namespace gpuq::daemon {

class Cleaner {
 public:
  Cleaner(boost::asio::io_context& io, std::string state_dir, double forget_after_s, Store& store, JobTable& jobs,
          const RestartPins& pins, const Waiters& waiters, Trash& trash, std::function<Reads()> reads);

  // `clean`: refuses at once (RequestError) a named job that has not ended, is another's, or (to
  // forget) is still needed; else takes `reply`, answered once the files are deleted.
  void start(const Caller& caller, const common::CleanRequest& q, Later<common::CleanReply>& reply);
  // With forget_after_s: forgets the jobs that ended over forget_after_s ago, now and every tenth
  // of that (as clean --forget --older-than).
  void forget_old_jobs();
  // Ended jobs that a queued job's `after`, a pending wait or a restart under way names: id ->
  // why it must stay.
  std::map<std::int64_t, std::string> still_needed() const;

 private:
  struct Cleaning {  // a clean under way: its jobs, and what became of those done so far
    bool forget = false, checkpoints_only = false;
    std::vector<std::int64_t> ids;  // chosen, ascending
    std::size_t next = 0;           // the first of `ids` not yet done
    std::map<std::int64_t, std::string> needed;  // still_needed() as of m_jobs.needs_changed() == needed_as_of
    std::uint64_t needed_as_of = ~std::uint64_t{0};
    Trash::Moved moved;  // job, its files' place in the trash
    std::vector<std::string> failures;
    common::CleanReply out;
    Later<common::CleanReply> reply;
  };
  void next_part(const std::shared_ptr<Cleaning>& c);  // the next ~10 ms of it, or its answer
  // Deletes `moved` (Trash::empty); then answers `reply` with `out` and what was freed.
  void empty_trash(Trash::Moved moved, Later<common::CleanReply> reply, common::CleanReply out);

  boost::asio::io_context& m_io;
  std::string m_state_dir;
  double m_forget_after_s;
  Store& m_store;
  JobTable& m_jobs;
  const RestartPins& m_pins;
  const Waiters& m_waiters;
  Trash& m_trash;
  std::function<Reads()> m_reads;
  boost::asio::steady_timer m_forget_timer;
};

}  // namespace gpuq::daemon
