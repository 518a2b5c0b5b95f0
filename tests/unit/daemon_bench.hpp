// What the daemon's owners read, filled by hand for unit tests (test_queries, test_restarter,
// test_control): a
// store in memory, a job table, lab mode's users with made-up names (user<uid>), two fake GPUs and
// an executor that runs nothing. Jobs are written to the store and filed in the table as the
// daemon would; no process starts.
#pragma once

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config.hpp"
#include "daemon/control.hpp"
#include "daemon/reads.hpp"
#include "tests/unit/memory_store.hpp"

namespace gpuq::daemon::testing {

using common::json;

// An executor that is never asked to run anything: the handlers only ask it what it can say.
struct QuietExecutor : Executor {
  std::optional<gpuq::Error> start(const Attempt&) override { return std::nullopt; }
  Found adopt(const Attempt&) override { return Found::alive; }
  void stop(std::int64_t id) override { stopped.push_back(id); }
  Outcome outcome(const Attempt&) override { return Outcome::failed("never ran"); }
  std::string detail(std::int64_t id) const override { return "on node n" + std::to_string(id); }
  std::vector<std::int64_t> stopped;  // the jobs it was asked to stop, in order
};

struct DaemonBench {
  boost::asio::io_context io;
  Config config;
  std::unique_ptr<Store> store;
  JobTable jobs;
  Users users;
  LastPass last_pass;
  Inventory inventory;
  GpuService health;
  GpuProcesses gpu_processes;
  QuietExecutor executor;
  SlotCores cores{{0, 1, 2, 3}, {}};
  std::vector<std::int64_t> landed;  // the ids of the records land() applied, in order
  int commits = 0;                   // commit()s, each one transaction (empty ones included)
  int passes_asked = 0;              // scheduling passes asked for (schedule_soon)
  // Its hang watch is off (hang_after_s 0); what it reads lands through land().
  EventTick events{io, config, *store, jobs, executor, inventory,
                   {[this](std::vector<JobRecord> changed, const WriteRows& write) { land(std::move(changed), write); }}};

  static Users::Rules lab_mode() {
    Users::Rules r;
    r.multi_user = true;
    return r;
  }
  DaemonBench()
      : store(gpuq::testing::memory_store()),
        users(lab_mode(),
              Users::Directory{[](uid_t uid) { return uid == 0 ? std::string("root") : "user" + std::to_string(uid); },
                               [](uid_t) -> gpuq::Result<gpuq::common::Account> { return gpuq::Error{}; }}),
        inventory(std::move(*Inventory::create("fake:2:16000", std::nullopt))),
        health(io, inventory, *store, 0, [] {}),
        gpu_processes(io, inventory, 0, [] { return std::vector<GpuProcesses::Running>{}; }, [] {}) {
    config.state_dir = "/nonexistent/state";
  }
  // Daemon::land as the owners see it, without hooks, metrics or waiters: `write` stores the rows,
  // then the job table takes them.
  void land(std::vector<JobRecord> changed, const WriteRows& write) {
    std::vector<const JobRecord*> rows;
    for (const auto& r : changed) rows.push_back(&r);
    write(rows);
    for (auto& r : changed) {
      landed.push_back(r.id);
      jobs.apply(std::move(r));
    }
  }
  // Daemon::commit without hooks: the records and `also` in one transaction, then landed.
  void commit(std::vector<JobRecord> changed, const std::vector<std::string>& why, std::vector<JobRecord> also) {
    ++commits;
    std::vector<const JobRecord*> quiet;
    for (const auto& r : also) quiet.push_back(&r);
    land(std::move(changed), [&](const std::vector<const JobRecord*>& rows) { store->update_many(rows, why, quiet); });
    for (auto& r : also) jobs.apply(std::move(r));
  }
  Changes changes() {
    return {reads(),
            jobs,
            *store,
            users,
            health,
            executor,
            [this](std::vector<JobRecord> changed, const std::vector<std::string>& why, std::vector<JobRecord> also) {
              commit(std::move(changed), why, std::move(also));
            },
            [this](std::vector<JobRecord> changed, const WriteRows& write) { land(std::move(changed), write); },
            [this] { ++passes_asked; }};
  }
  Reads reads() {
    return {config, *store, jobs, users, last_pass, health, gpu_processes, events, executor, inventory, cores};
  }

  // One batch of `n` jobs of `owner`, written to the store; the queued ones live in the job table.
  std::vector<std::int64_t> submit(int n, uid_t owner, const std::vector<std::vector<std::size_t>>& deps = {}) {
    std::vector<JobRecord> recs(n);
    for (int i = 0; i < n; ++i) {
      recs[i].uid = owner;
      recs[i].spec.name = "job" + std::to_string(i);
      recs[i].spec.command = {"true"};  // a spec the store reads back as written
      recs[i].spec.cwd = "/";
      recs[i].spec.gpus = 1;
      recs[i].spec.labels = {{"lr", "0.1"}};
    }
    store->insert_batch(recs, deps.empty() ? std::vector<std::vector<std::size_t>>(n) : deps, "/", json::object(), 100);
    std::vector<std::int64_t> ids;
    for (auto& r : recs) {
      ids.push_back(r.id);
      jobs.load(r, 100);
    }
    return ids;
  }
  // Job `id` ended as `state` with `result`: in the store, and out of the job table.
  void end(std::int64_t id, JobState state, json result = nullptr, std::int64_t blocked_by = 0) {
    JobRecord r = jobs.at(id).rec;
    r.blocked_by = blocked_by;
    r.state = state;
    r.attempt = 1;
    r.run.started_at = 110;
    r.run.ended_at = 120;
    r.run.result = std::move(result);
    r.reason = state == JobState::failed ? "exit 3: Traceback (most recent call last)" : "";
    store->update(r, true);
    jobs.apply(r);
  }
  void run(std::int64_t id, std::vector<int> gpus, double timeout_s = 0) {
    JobRecord r = jobs.at(id).rec;
    r.state = JobState::running;
    r.attempt = 1;
    r.run.started_at = 110;
    r.run.gpus = std::move(gpus);
    r.spec.timeout_s = timeout_s;
    store->update(r, true);
    jobs.apply(r);
  }
};

}  // namespace gpuq::daemon::testing
