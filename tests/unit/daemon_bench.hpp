// What the daemon's owners read, filled by hand for unit tests (test_queries, test_restarter,
// test_control, test_attempts, test_dependencies): a store in memory, a job table, lab mode's users
// with made-up names (user<uid>), a machine of two fake GPUs and four cores, and an executor that
// runs nothing and records what it is asked. Jobs are written to the store and filed in the table
// as the daemon would; no process starts.
#pragma once

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/attempts.hpp"
#include "daemon/config.hpp"
#include "daemon/control.hpp"
#include "daemon/machine.hpp"
#include "daemon/reads.hpp"
#include "tests/unit/memory_store.hpp"

namespace gpuq::daemon::testing {

using common::json;

// An executor that runs nothing: it records what it is asked, refuses a start where told to, and
// says where work is placed by another system where told to (`places`).
struct QuietExecutor : Executor {
  gpuq::Result<bool> start(const Attempt& a) override {
    started.push_back(a.id);
    if (on_start) on_start(a);
    return answer();
  }
  gpuq::Result<bool> start_array(const std::vector<Attempt>& attempts, int limit) override {
    arrays.emplace_back();
    for (const auto& a : attempts) arrays.back().push_back(a.id);
    array_limit = limit;
    return answer();
  }
  gpuq::Result<bool> answer() const {
    if (refuse) return *refuse;
    return true;
  }
  Found adopt(const Attempt&) override { return Found::alive; }
  void stop(std::int64_t id) override { stopped.push_back(id); }
  void withdraw(std::int64_t id) override { withdrawn.push_back(id); }
  Outcome outcome(const Attempt&) override { return Outcome::failed("never ran"); }
  bool places_work() const override { return places; }
  // Where it places work: every job goes at once, each alone; a job may follow a dependency that
  // has the other system's id.
  std::optional<Handover> place(const std::vector<PendingJob>& queue, const BatchLimits& limits,
                                const FirstAttempt&) const override {
    if (!places) return std::nullopt;
    return hand_over(
        queue, limits, [](const PendingJob&) { return std::string(); }, 1);
  }
  bool follows(std::int64_t dep) const override { return places && !external_id(dep).empty(); }
  std::string detail(std::int64_t id) const override { return "on node n" + std::to_string(id); }
  std::string containment() const override { return "nothing (a test's executor)"; }
  std::string lingering(const Attempt& a) const override {
    const auto it = lingers.find(a.id);
    return it == lingers.end() ? std::string() : it->second;
  }
  std::string external_id(std::int64_t id) const override {
    const auto it = handed.find(id);
    return it == handed.end() ? std::string() : it->second;
  }
  std::vector<std::int64_t> stopped;    // the jobs it was asked to stop, in order
  std::vector<std::int64_t> started;    // ... to start alone
  std::vector<std::vector<std::int64_t>> arrays;  // ... to start as one array
  int array_limit = -1;
  std::vector<std::int64_t> withdrawn;  // ... to take back
  std::optional<gpuq::Error> refuse;    // its answer to every start
  std::function<void(const Attempt&)> on_start;  // what a test sees at the moment of a start
  bool places = false;
  std::map<std::int64_t, std::string> handed;  // job -> the other system's id for it
  std::map<std::int64_t, std::string> lingers;  // job -> why processes of its ended attempt live on
};

struct DaemonBench {
  boost::asio::io_context io;
  Config config;
  std::unique_ptr<Store> store;
  JobTable jobs;
  Users users;
  LastPass last_pass;
  Machine machine;
  Inventory& inventory = machine.inventory;
  GpuService& health = machine.health;
  GpuProcesses& gpu_processes = machine.gpu_processes;
  SlotCores& cores = machine.cores;
  QuietExecutor executor;
  MetricCounters metrics;
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
        machine(io, std::move(*Inventory::create("fake:2:16000", std::nullopt)), SlotCores{{0, 1, 2, 3}, {}}, *store, {},
                [] { return std::vector<GpuProcesses::Running>{}; }, [] {}) {
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
            [this] { ++passes_asked; },
            [this](const std::vector<std::int64_t>& ids, const std::vector<std::string>& by) {
              for (std::size_t i = 0; i < ids.size(); ++i)
                preempted.emplace_back(ids[i], by[i]);
            }};
  }
  std::vector<std::pair<std::int64_t, std::string>> preempted;  // what Changes::preempt was asked, in order
  // The attempts' owner over this bench: its commits land here, withdraw_orphans is counted, and
  // a pass asked for counts in passes_asked.
  int orphan_walks = 0;
  Attempts attempts{io, config, *store, jobs, users, machine, executor, events, metrics,
                    {[this](std::vector<JobRecord> changed, const std::vector<std::string>& why,
                            std::vector<JobRecord> also) { commit(std::move(changed), why, std::move(also)); },
                     [this] { ++orphan_walks; }, [this] { ++passes_asked; }}};
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
