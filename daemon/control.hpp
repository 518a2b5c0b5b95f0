// The requests that change queued or running jobs in place, and the GPUs' service: cancel, hold
// and release, update, drain and undrain (control.cpp). Each is a function of a Changes, which
// names all it may touch: what every handler reads (Reads), the owners it changes, and the
// daemon's commit, land and scheduling pass, handed in. Nothing else of gpuqd is in reach; unit
// tests build one over a store in memory (test_control).
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include "common/protocol.hpp"
#include "daemon/executor.hpp"
#include "daemon/gpu_service.hpp"
#include "daemon/job_table.hpp"
#include "daemon/reads.hpp"
#include "daemon/store.hpp"
#include "daemon/users.hpp"

namespace gpuq::daemon {

struct Changes {
  Reads reads;
  JobTable& jobs;          // a batch's limit on running jobs
  Store& store;            // an update's specs and a batch's limit (no change of state: no transition)
  const Users& users;      // who may set which priority
  GpuService& health;      // GPUs in and out of service
  Executor& executor;      // stops a cancelled job; a batch's array limit where it places work
  Commit commit;           // changes of state
  Land land;               // an update's new specs
  std::function<void()> schedule_soon;
  // Asks running jobs to checkpoint and stop for a preemption, by whom (Attempts::preempt).
  std::function<void(const std::vector<std::int64_t>&, const std::vector<std::string>&)> preempt;
};

namespace control {
// Cancels jobs: queued ones end at once, running ones are asked to stop (they end as cancelled).
// Every id must exist and be the caller's (or the caller an admin) before anything changes.
common::CancelReply cancel(const Changes& c, const Caller& caller, const common::IdsRequest& q);
// Stops running jobs and puts them back in line, no retry spent (Slurm's `scontrol requeue`): each
// is asked to stop as a cancel asks (SIGTERM, then SIGKILL after the grace), and once its processes
// are gone it is queued again, its next attempt numbered on. Every id must exist, be the caller's
// (or the caller an admin) and be running, or nothing changes.
common::CancelReply requeue(const Changes& c, const Caller& caller, const common::IdsRequest& q);
// Preempts running jobs by hand (the owner's or an admin's), preemptible or not: each gets the
// preemption's file, signal and grace, then goes back in line as preempted, by the caller, no retry
// spent. Every id must exist, be the caller's (or the caller an admin), be running and not be
// asked to stop already, or nothing changes.
common::CancelReply preempt(const Changes& c, const Caller& caller, const common::IdsRequest& q);
// Holds queued jobs out of line, or releases them (`hold` false); with a batch, its queued jobs.
common::CancelReply set_held(const Changes& c, const Caller& caller, const common::SelectRequest& q, bool hold);
// A job's priority, retries or timeout, or a batch's limit on running jobs, after submission.
common::UpdateReply update(const Changes& c, const Caller& caller, const common::UpdateRequest& q);
// Takes GPUs out of service or puts them back (admins'); the reply is `gpus`'.
common::GpusReply set_drained(const Changes& c, const Caller& caller, const common::DrainRequest& q, bool drain);
}  // namespace control

}  // namespace gpuq::daemon
