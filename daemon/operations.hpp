// The long operations: requests done in parts over many turns of gpuqd's loop, so that none holds
// its thread for long, and what they share. Submissions are checked off the thread and written in
// parts (submissions.hpp); restarts requeue in parts (restarter.hpp); cleans delete and forget in
// parts (cleaner.hpp); both move files into the trash, emptied on a thread of its own (trash.hpp),
// and see the jobs restarts under way hold (restart_pins.hpp). Each part is its own owner with
// its own unit tests; this only builds them in order and wires them to one another.
#pragma once

#include <functional>

// clang-format off
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
// clang-format on

#include "daemon/cleaner.hpp"
#include "daemon/config.hpp"
#include "daemon/job_table.hpp"
#include "daemon/reads.hpp"
#include "daemon/restart_pins.hpp"
#include "daemon/restarter.hpp"
#include "daemon/store.hpp"
#include "daemon/submissions.hpp"
#include "daemon/trash.hpp"
#include "daemon/users.hpp"
#include "daemon/waiters.hpp"

namespace gpuq::daemon {

struct Operations {
  struct Needs {
    std::function<Reads()> reads;
    Land land;                            // a restart's requeued records
    std::function<void()> schedule_soon;  // jobs are back in line
    Submissions::Accept accept;           // a checked batch: what refuses it now
    Submissions::Written written;         // a written batch: its jobs go live
  };
  Operations(boost::asio::io_context& io, const Config& config, Store& store, JobTable& jobs, const Users& users,
             const Waiters& waiters, Needs needs)
      : trash(io, config.state_dir),
        restarter(io, config.state_dir, store, jobs, pins, trash, users,
                  {needs.reads, needs.land, needs.schedule_soon}),
        cleaner(io, config.state_dir, config.forget_after_s, store, jobs, pins, waiters, trash, needs.reads),
        submissions(io, store, std::move(needs.accept), std::move(needs.written)) {}
  Operations(const Operations&) = delete;  // the parts hold one another by reference
  Operations& operator=(const Operations&) = delete;

  RestartPins pins;  // the jobs restarts under way hold
  Trash trash;       // where cleaned jobs' files go: restarts and cleans move them there
  Restarter restarter;
  Cleaner cleaner;
  Submissions submissions;  // last: its check thread is joined first
};

}  // namespace gpuq::daemon
