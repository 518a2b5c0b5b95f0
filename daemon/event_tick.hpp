// The event tick: every ingest_interval_s while jobs run, each started job's new event lines are
// read into its record and the store, and the hang watch judges the running jobs; an attempt's
// last lines are read once more when it ends (ingest(a, true)). Reads are bounded (a flooding job
// cannot grow gpuqd or hold its thread), refuse files that are not the job's own (links, fifos,
// another owner's), and land through the daemon (Needs::land) with their file offsets, so a
// restart neither loses nor repeats an event.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>

#include "daemon/config.hpp"
#include "daemon/executor.hpp"
#include "daemon/hang_watch.hpp"
#include "daemon/inventory.hpp"
#include "daemon/job_table.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

class EventTick {
 public:
  static constexpr std::int64_t k_max_events_bytes = 64 << 20;  // of a rank's events file, ever read
  static constexpr std::int64_t k_events_per_call = 8 << 20;    // read by one ingest while the job runs

  // Reads of running jobs' events files (one rank's file, one ingest) and the most one read: what
  // `gpus` reports, so a test can see the k_events_per_call bound hold.
  struct Reads {
    std::uint64_t reads = 0;
    std::int64_t max_bytes = 0;
  };

  struct Needs {
    // Daemon::land: a job's record with its new progress and result, written by `write` in one
    // transaction.
    Land land;
  };
  EventTick(boost::asio::io_context& io, const Config& config, Store& store, JobTable& jobs, Executor& executor,
            Inventory& inventory, Needs needs);

  // Starts the tick where jobs run and it is not running; it stops by itself once none run.
  void arm();
  // Reads new event lines of the job's ranks into its record and the store. `ended`: the job's
  // processes are gone, so a last line without its newline is read too, and the whole rest of
  // the file up to k_max_events_bytes. False: the store refused some (read again next time).
  bool ingest(Active& a, bool ended = false);

  // The hang watch over the running jobs (hang_watch.hpp): `status` and `why` read its flags, and
  // an attempt's end asks it whether the tick stopped the job.
  HangWatch& hangs() { return m_hangs; }
  const HangWatch& hangs() const { return m_hangs; }
  const Reads& reads() const { return m_reads; }

 private:
  void tick();
  void check_hangs(double now);  // stops those the hang watch says

  const Config& m_config;
  Store& m_store;
  JobTable& m_jobs;
  Executor& m_executor;
  Inventory& m_inventory;
  Needs m_needs;
  HangWatch m_hangs;
  boost::asio::steady_timer m_timer;
  bool m_armed = false;
  Reads m_reads;
};

}  // namespace gpuq::daemon
