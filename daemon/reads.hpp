// What the request handlers read through: a job by id (from memory while it is active, else from
// the store) with the words for one that is missing or forgotten, a job as clients see it (lab
// mode's visibility rule applied), and who may act on which. A value of references to the owners
// it reads, built for each request (Daemon::reads), so a handler's signature says it changes
// nothing: the read-only handlers (queries.cpp: status, show, why, events, results) take this
// alone, and unit tests build one over a store in memory.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/protocol.hpp"
#include "daemon/cpu_topology.hpp"
#include "daemon/executor.hpp"
#include "daemon/gpu_processes.hpp"
#include "daemon/gpu_service.hpp"
#include "daemon/event_tick.hpp"
#include "daemon/inventory.hpp"
#include "daemon/job_table.hpp"
#include "daemon/last_pass.hpp"
#include "daemon/store.hpp"
#include "daemon/users.hpp"

namespace gpuq::daemon {

struct Config;

struct Reads {
  const Config& config;
  Store& store;      // read, never written
  JobTable& jobs;    // read; it remembers the end states of dependencies it looked up
  const Users& users;
  const LastPass& last_pass;
  const GpuService& health;
  const GpuProcesses& gpu_processes;
  const EventTick& events;  // its hang watch, and its reads of events files
  const Executor& executor;
  const Inventory& inventory;
  const SlotCores& cores;  // slot s is core cores.cores[s % size]

  std::optional<JobRecord> lookup(std::int64_t id) const;
  // Job `id`, or not_found ("no job N", or "job N was forgotten").
  JobRecord existing_job(std::int64_t id) const;
  // Nothing when job `id` exists (one index probe, no record read); else not_found, as existing_job.
  void require_job(std::int64_t id) const;
  // Job `id`, which must have ended: else not_found, or wrong_state "job N (name) is S; <only>".
  JobRecord ended_job(std::int64_t id, const std::string& only) const;
  // "job N, which does not exist" or "…, which was forgotten": what to say of an id not found.
  std::string missing_job(std::int64_t id) const;
  RequestError missing_batch(std::int64_t batch) const;  // not_found: "no batch N", or "… was forgotten"
  // The jobs of `batch`, or not_found.
  std::vector<JobRecord> jobs_of_batch(std::int64_t batch) const;
  // `ids` and the queued jobs of `batch` (0: none), ascending, each once.
  std::vector<std::int64_t> with_queued_of_batch(std::vector<std::int64_t> ids, std::int64_t batch) const;
  // The state of a job named as a dependency (ended ones remembered), nullopt if there is none.
  std::optional<JobState> dependency_state(std::int64_t id) const;
  // The CPU slot pool with the slots running jobs hold.
  CpuSlots cpu_pool() const;

  // A job as clients see it: the in-memory record (with why it waits) when the job is active,
  // else `stored`. `viewer`: who asks; another user's job shows only its public fields to one who
  // is no admin (may_read_details, details_hidden).
  common::JobInfo info_of(const JobRecord& stored, const Caller& viewer) const;
  // Appends `r` as clients see it, counting it against the reply's bound (common::k_max_reply_jobs
  // and k_max_reply_bytes, with `bytes` so far); once the reply is full, adds nothing, sets `more`
  // and returns false.
  bool add_to_reply(common::JobsReply& out, const JobRecord& r, std::size_t& bytes, const Caller& viewer) const;

  // Refuses (forbidden, naming the owner) unless `caller` may `act` on job `r` ("cancel"): its
  // owner or an admin.
  void authorize(const Caller& caller, const JobRecord& r, std::string_view act) const;
  void authorize(const Caller& caller, std::int64_t id, std::string_view act) const;  // job `id`, or not_found
  // The batch's jobs are one submission's, so one owner's: as authorize for its first job.
  void authorize_batch(const Caller& caller, std::int64_t batch, std::string_view act) const;
  void authorize_admin(const Caller& caller, std::string_view act) const;  // admins only
};

// The read-only handlers (queries.cpp).
namespace queries {
common::HelloReply hello(const Reads& r, const Caller& caller, const common::HelloRequest& q);
common::UsageReply usage(const Reads& r, const Caller& caller, const common::NoFields& q);
common::JobsReply status(const Reads& r, const Caller& caller, const common::StatusRequest& q);
common::ShowReply show(const Reads& r, const Caller& caller, const common::IdRequest& q);
// What a queued job waits for, a sentence each, and when it may start at the earliest.
common::WhyReply why(const Reads& r, const Caller& caller, const common::IdRequest& q);
common::EventsReply events(const Reads& r, const Caller& caller, const common::EventsRequest& q);
common::JobsReply results(const Reads& r, const Caller& caller, const common::ResultsRequest& q);
// The jobs of a wait as they are now (Waiters::Answer).
common::JobsReply wait_answer(const Reads& r, const Caller& caller, const std::set<std::int64_t>& ids, bool timed_out);
// Watches::Answer: the jobs of `ids` as `caller` may see them, into out.jobs within a reply's
// bounds; how many of `ids` it took (a forgotten one is taken, showing nothing).
std::size_t watch_answer(const Reads& r, const Caller& caller, const std::vector<std::int64_t>& ids,
                         common::WatchReply& out);
// The GPUs as gpuq and NVML see them, the CPU slots, and the daemon's own counts: `gpuq gpus`,
// and the metrics' GPU series.
common::GpusReply gpus(const Reads& r, const Caller& caller = Caller::self(), const common::NoFields& q = {});
}  // namespace queries

}  // namespace gpuq::daemon
