// What a scheduling pass is given (pass_inputs.hpp): who holds which GPU, as the pass and `gpus`
// both see it, the GPUs in service, and lab mode's fair order and caps. Over a store in memory.
#include <doctest/doctest.h>

#include "daemon/pass_inputs.hpp"
#include "tests/unit/daemon_bench.hpp"

using namespace gpuq::daemon;
using gpuq::JobState;
using gpuq::daemon::testing::DaemonBench;

namespace {

// Job `id` running on `gpus` since 110: shared with `memory_mb` a GPU, or whole (memory_mb 0).
void run_on(DaemonBench& bench, std::int64_t id, std::vector<int> gpus, std::int64_t memory_mb, double timeout_s) {
  JobRecord r = bench.jobs.at(id).rec;
  r.spec.shared = memory_mb > 0;
  r.spec.gpu_memory_mb = memory_mb;
  r.spec.timeout_s = timeout_s;
  r.state = JobState::running;
  r.attempt = 1;
  r.run.started_at = 110;
  r.run.gpus = std::move(gpus);
  bench.store->update(r, true);
  bench.jobs.apply(r);
}

}  // namespace

TEST_SUITE_BEGIN("pass_inputs");

TEST_CASE("one account of who holds which GPU: shared jobs add their memory, a whole one holds it all, free_at is the last end") {
  DaemonBench bench;
  bench.config.grace_s = 10;
  auto ids = bench.submit(4, 1001);
  run_on(bench, ids[0], {0}, 4000, 100);
  run_on(bench, ids[1], {0}, 2000, 0);  // no timeout: no knowing when GPU 0 is free
  run_on(bench, ids[2], {1}, 0, 50);
  const auto holdings = gpu_holdings(bench.reads());
  REQUIRE(holdings.size() == 2);
  CHECK(holdings.at(0).jobs == std::vector<std::int64_t>{ids[0], ids[1]});
  CHECK(holdings.at(0).allocated_mb == 6000);
  CHECK_FALSE(holdings.at(0).exclusive);
  CHECK(holdings.at(0).free_at == k_never);
  CHECK(holdings.at(1).jobs == std::vector<std::int64_t>{ids[2]});
  CHECK(holdings.at(1).allocated_mb == 16000);  // the whole GPU
  CHECK(holdings.at(1).exclusive);
  CHECK(holdings.at(1).free_at == 110 + 50 + 10);  // its timeout, then the grace before SIGKILL
  CHECK(ends_by(bench.jobs.at(ids[2]).rec, 10, 30) == 170);
  CHECK(ends_by(bench.jobs.at(ids[1]).rec, 10, 30) == k_never);
  // Suspended: while frozen, its end waits on another job's; after, the time it stood frozen is added.
  JobRecord frozen = bench.jobs.at(ids[2]).rec;
  frozen.run.suspended_for = ids[3];
  CHECK(ends_by(frozen, 10, 30) == k_never);
  frozen.run.suspended_for = 0;
  frozen.run.suspended_s = 25;
  CHECK(ends_by(frozen, 10, 30) == 195);
  // Preempted: over within its preemption's grace (the spec's, else gpuqd's), then SIGKILL's.
  JobRecord preempted = bench.jobs.at(ids[1]).rec;
  preempted.run.preempt_requested = true;
  preempted.run.preempted_at = 500;
  CHECK(ends_by(preempted, 10, 30) == 540);
  preempted.spec.preempt_grace_s = 5;
  CHECK(ends_by(preempted, 10, 30) == 515);
  preempted.run.preempted_at = 0;  // asked, when unknown: as before
  CHECK(ends_by(preempted, 10, 30) == k_never);

  // The pass sees the GPUs in service only; `gpus` shows every GPU, with the same holdings.
  gpuq::common::DrainRequest drain;
  drain.gpus = {1};
  bench.health.set_drained(drain, true);
  const auto pass = gpus_for_pass(bench.reads());
  REQUIRE(pass.size() == 1);
  CHECK(pass[0].index == 0);
  CHECK(pass[0].holders == 2);
  CHECK(pass[0].allocated_mb == 6000);
  CHECK(pass[0].total_mb == 16000);
  CHECK(pass[0].free_at == k_never);
  const auto shown = queries::gpus(bench.reads());
  REQUIRE(shown.gpus.size() == 2);
  CHECK(shown.gpus[0].jobs == std::vector<std::int64_t>{ids[0], ids[1]});
  CHECK(shown.gpus[0].allocated_mb == 6000);
  CHECK(shown.gpus[1].drained);
  CHECK(shown.gpus[1].jobs == std::vector<std::int64_t>{ids[2]});
  CHECK(shown.gpus[1].exclusive);
}

TEST_CASE("what a frozen job keeps on its GPUs: NVML's peak and at least its spec's; its spec's where none is seen") {
  CHECK(kept_on_gpu_mb(true, 30000, 20000) == 30000);          // it grew past what it said
  CHECK(kept_on_gpu_mb(true, 10000, 20000) == 20000);          // its spec's is a floor
  CHECK(kept_on_gpu_mb(true, std::nullopt, 20000) == 0);       // not looked at yet: unknown, it lends no GPU
  CHECK(kept_on_gpu_mb(false, std::nullopt, 20000) == 20000);  // fake GPUs: what it says
  CHECK(kept_on_gpu_mb(false, std::nullopt, 0) == 0);
}

TEST_CASE(
    "who may be frozen: auto freezes a job of one process, suspend any, requeue none; nothing without a freezer") {
  DaemonBench bench;
  auto ids = bench.submit(4, 1001);
  for (std::int64_t id : ids)
    run_on(bench, id, {}, 0, 0);
  const auto set = [&](std::int64_t id, gpuq::common::PreemptMode mode, int ranks) {
    JobRecord r = bench.jobs.at(id).rec;
    r.spec.preemptible = true;
    r.spec.preempt_mode = mode;
    r.spec.ranks = ranks;
    bench.jobs.apply(r);
  };
  set(ids[0], gpuq::common::PreemptMode::auto_, 1);
  set(ids[1], gpuq::common::PreemptMode::auto_, 2);  // a gang: its collectives' timeouts run on
  set(ids[2], gpuq::common::PreemptMode::suspend, 2);
  set(ids[3], gpuq::common::PreemptMode::requeue, 1);
  bool any = false;
  const auto may = [&](bool freezer) {
    std::vector<std::pair<bool, bool>> out;  // (may_suspend, may_requeue) by id
    const auto yes = [](std::int64_t) { return true; };
    for (const Runner& r : runners(bench.reads(), any, freezer ? yes : std::function<bool(std::int64_t)>()))
      out.emplace_back(r.may_suspend, r.may_requeue);
    return out;
  };
  CHECK(may(true) == std::vector<std::pair<bool, bool>>{{true, true}, {false, true}, {true, false}, {false, true}});
  CHECK(may(false) == std::vector<std::pair<bool, bool>>{{false, true}, {false, true}, {false, false}, {false, true}});
}

TEST_CASE("lab mode: the user holding fewer GPUs goes first, and a user's limit counts what their running jobs take") {
  DaemonBench bench;
  Users::Rules rules = DaemonBench::lab_mode();
  rules.user_limits["user1001"] = {3, 4, 0};  // max_running 3, max_gpus 4
  bench.users = Users(rules, Users::Directory{[](uid_t uid) { return "user" + std::to_string(uid); },
                                              [](uid_t) -> gpuq::Result<gpuq::common::Account> { return gpuq::Error{}; }});
  auto alice = bench.submit(3, 1001);
  auto bob = bench.submit(1, 1002);
  run_on(bench, alice[0], {0, 1}, 0, 0);
  std::vector<PendingJob> queue{pending_of(bench.jobs.at(alice[1]).rec), pending_of(bench.jobs.at(alice[2]).rec),
                                pending_of(bench.jobs.at(bob[0]).rec)};

  // Outside lab mode: the line as it is, no caps.
  auto caps = lab_order(bench.reads(), queue, 200);
  CHECK(caps.empty());
  CHECK(queue[0].id == alice[1]);

  bench.config.multi_user = true;
  caps = lab_order(bench.reads(), queue, 200);
  REQUIRE(queue.size() == 3);
  CHECK(queue[0].id == bob[0]);  // alice holds 2 GPUs, bob none
  CHECK(queue[1].id == alice[1]);
  CHECK(queue[2].id == alice[2]);
  REQUIRE(caps.size() == 1);  // bob has no limit
  CHECK(caps.at(1001).max_running == 3);
  CHECK(caps.at(1001).running == 1);
  CHECK(caps.at(1001).max_gpus == 4);
  CHECK(caps.at(1001).gpus == 2);
}

TEST_SUITE_END();
