// The handlers that change jobs in place (control.hpp): cancel, hold and release, update, drain.
// Each runs over a Changes built on a store in memory (daemon_bench.hpp), so a test sees what it
// committed, what it asked the executor, and whether it asked for a scheduling pass.
#include <doctest/doctest.h>

#include "daemon/control.hpp"
#include "tests/unit/daemon_bench.hpp"
#include "tests/unit/refusal.hpp"

using namespace gpuq::daemon;
using gpuq::ErrorCode;
using gpuq::JobState;
using gpuq::daemon::testing::DaemonBench;
using gpuq::testing::refusal;

namespace {

const Caller k_alice{1001, false}, k_bob{1002, false}, k_admin{0, true};

gpuq::common::IdsRequest ids_of(std::vector<std::int64_t> ids) {
  gpuq::common::IdsRequest q;
  q.ids = std::move(ids);
  return q;
}
gpuq::common::SelectRequest select(std::vector<std::int64_t> ids, std::int64_t batch = 0) {
  gpuq::common::SelectRequest q;
  q.ids = std::move(ids);
  q.batch = batch;
  return q;
}

}  // namespace

TEST_SUITE_BEGIN("control");

TEST_CASE("cancel: an unknown id or another user's job cancels nothing; else the queued end at once, the running are stopped") {
  DaemonBench bench;
  auto ids = bench.submit(2, k_alice.uid);
  bench.run(ids[1], {0});
  auto mine = bench.submit(1, k_bob.uid);

  // A typo among the ids: nothing changes, nothing is stopped.
  std::string why;
  CHECK(refusal([&] { control::cancel(bench.changes(), k_alice, ids_of({ids[0], ids[1], 999})); }, why) ==
        ErrorCode::not_found);
  CHECK(why.find("999") != std::string::npos);
  // Another user's job among them: refused before any of the caller's own is touched.
  CHECK(refusal([&] { control::cancel(bench.changes(), k_alice, ids_of({ids[0], mine[0]})); }, why) ==
        ErrorCode::forbidden);
  CHECK(why.find("user1002") != std::string::npos);
  CHECK(bench.commits == 0);
  CHECK(bench.executor.stopped.empty());
  CHECK(bench.store->get(ids[0])->state == JobState::queued);

  auto reply = control::cancel(bench.changes(), k_alice, ids_of({ids[0], ids[1]}));
  CHECK(bench.commits == 1);  // one transaction: the queued one's end and the running one's flag
  REQUIRE(reply.jobs.size() == 2);
  CHECK(reply.jobs[0].state == JobState::cancelled);
  CHECK(reply.jobs[0].changed);
  CHECK(reply.jobs[1].state == JobState::running);  // it ends as cancelled once its processes are gone
  CHECK(bench.store->get(ids[0])->state == JobState::cancelled);
  CHECK(bench.store->get(ids[1])->run.cancel_requested);  // stored before it is stopped
  CHECK(bench.jobs.at(ids[1]).rec.run.cancel_requested);
  CHECK(bench.executor.stopped == std::vector<std::int64_t>{ids[1]});
  CHECK(bench.passes_asked == 1);  // the GPUs it frees
  // Again: the ended one is reported as it is, unchanged.
  reply = control::cancel(bench.changes(), k_alice, ids_of({ids[0]}));
  CHECK(reply.jobs[0].state == JobState::cancelled);
  CHECK_FALSE(reply.jobs[0].changed);
  // An admin cancels anyone's.
  reply = control::cancel(bench.changes(), k_admin, ids_of({mine[0]}));
  CHECK(reply.jobs[0].state == JobState::cancelled);
}

TEST_CASE("hold and release: only queued jobs are held, each change is in the history, and only a release asks for a pass") {
  DaemonBench bench;
  auto ids = bench.submit(3, k_alice.uid);
  bench.run(ids[2], {0});
  std::string why;
  CHECK(refusal([&] { control::set_held(bench.changes(), k_alice, select({ids[0], ids[2]}), true); }, why) ==
        ErrorCode::wrong_state);
  CHECK(why.find("only a queued job can be held (`gpuq cancel` stops a running one)") != std::string::npos);
  CHECK(bench.commits == 0);
  CHECK(refusal([&] { control::set_held(bench.changes(), k_bob, select({ids[0]}), true); }) == ErrorCode::forbidden);

  // By batch: its queued jobs.
  auto held = control::set_held(bench.changes(), k_alice, select({}, bench.store->get(ids[0])->batch), true);
  REQUIRE(held.jobs.size() == 2);
  CHECK(held.jobs[0].changed);
  CHECK(held.jobs[1].changed);
  CHECK(bench.jobs.at(ids[0]).rec.held);
  CHECK(bench.store->get(ids[1])->held);
  CHECK(bench.store->history(ids[0]).back().reason == "held");
  CHECK(bench.passes_asked == 0);  // holding starts nothing

  auto released = control::set_held(bench.changes(), k_alice, select({ids[0]}), false);
  CHECK(released.jobs[0].changed);
  CHECK_FALSE(bench.store->get(ids[0])->held);
  CHECK(bench.store->history(ids[0]).back().reason == "released");
  CHECK(bench.passes_asked == 1);  // it may start now
  // Releasing one not held changes nothing and starts no pass.
  released = control::set_held(bench.changes(), k_alice, select({ids[0]}), false);
  CHECK_FALSE(released.jobs[0].changed);
  CHECK(bench.passes_asked == 1);
}

TEST_CASE("update: a new priority is stored, taken by the job table and asks for a pass; a running job's timeout is refused") {
  DaemonBench bench;
  auto ids = bench.submit(2, k_alice.uid);
  bench.run(ids[1], {0}, 60);
  gpuq::common::UpdateRequest q;
  q.ids = {ids[0]};
  q.priority = 7;
  auto reply = control::update(bench.changes(), k_alice, q);
  CHECK(reply.jobs[0].changed);
  CHECK(bench.store->get(ids[0])->spec.priority == 7);
  CHECK(bench.jobs.at(ids[0]).rec.spec.priority == 7);
  CHECK(bench.store->history(ids[0]).back().reason == "updated: priority 0 -> 7");
  CHECK(bench.passes_asked == 1);  // its new place in line
  // The same again changes nothing.
  reply = control::update(bench.changes(), k_alice, q);
  CHECK_FALSE(reply.jobs[0].changed);
  CHECK(bench.passes_asked == 1);

  gpuq::common::UpdateRequest timeout;
  timeout.ids = {ids[1]};
  timeout.timeout_s = 10;
  std::string why;
  CHECK(refusal([&] { control::update(bench.changes(), k_alice, timeout); }, why) == ErrorCode::wrong_state);
  CHECK(why.find("its supervisor enforces the timeout it started with") != std::string::npos);
  CHECK(bench.jobs.at(ids[1]).rec.spec.timeout_s == 60);
  CHECK(refusal([&] { control::update(bench.changes(), k_bob, q); }) == ErrorCode::forbidden);
}

TEST_CASE("drain and undrain are an admin's; the reply is the GPUs as they are now") {
  DaemonBench bench;
  gpuq::common::DrainRequest q;
  q.gpus = {1};
  q.reason = "fan";
  CHECK(refusal([&] { control::set_drained(bench.changes(), k_alice, q, true); }) == ErrorCode::forbidden);
  auto gpus = control::set_drained(bench.changes(), k_admin, q, true);
  REQUIRE(gpus.gpus.size() == 2);
  CHECK_FALSE(gpus.gpus[0].drained);
  CHECK(gpus.gpus[1].drained);
  CHECK(gpus.gpus[1].drain_reason == "fan");
  gpus = control::set_drained(bench.changes(), k_admin, q, false);
  CHECK_FALSE(gpus.gpus[1].drained);
  q.gpus = {5};
  std::string why;
  CHECK(refusal([&] { control::set_drained(bench.changes(), k_admin, q, true); }, why) == ErrorCode::not_found);
  CHECK(why.find("no GPU 5") == 0);
}

TEST_SUITE_END();
