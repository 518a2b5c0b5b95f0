// Dependencies (dependencies.hpp) over a store in memory: what lets a queued job go, a failed
// chain failing in one pass (a part at a time when long), and jobs handed over to another system
// after a dependency that will no longer succeed taken back.
#include <doctest/doctest.h>

#include "daemon/dependencies.hpp"
#include "tests/unit/daemon_bench.hpp"

using namespace gpuq::daemon;
using gpuq::JobState;
using gpuq::daemon::testing::DaemonBench;

namespace {

constexpr uid_t k_owner = 1001;

Commit commit_of(DaemonBench& b) {
  return [&b](std::vector<JobRecord> changed, const std::vector<std::string>& why, std::vector<JobRecord> also) {
    b.commit(std::move(changed), why, std::move(also));
  };
}

// A chain of `n` jobs, each after the one before it.
std::vector<std::int64_t> chain(DaemonBench& b, int n) {
  std::vector<std::vector<std::size_t>> deps(n);
  for (int i = 1; i < n; ++i)
    deps[i] = {static_cast<std::size_t>(i - 1)};
  return b.submit(n, k_owner, deps);
}

}  // namespace

TEST_SUITE_BEGIN("dependencies");

TEST_CASE("a dependency lets its job go once it succeeded; running or failed, it does not") {
  DaemonBench b;
  const auto ids = b.submit(3, k_owner);
  b.end(ids[0], JobState::succeeded);
  b.run(ids[1], {0});
  b.end(ids[2], JobState::failed);
  const Reads r = b.reads();
  CHECK(dependencies::met(r, ids[0]));
  CHECK_FALSE(dependencies::met(r, ids[1]));
  CHECK_FALSE(dependencies::met(r, ids[2]));
  CHECK_FALSE(dependencies::met(r, 999));  // no such job

  // Where another system places work, a running dependency handed over there lets its job go (to
  // wait there), unless it is being cancelled.
  b.executor.places = true;
  CHECK_FALSE(dependencies::met(b.reads(), ids[1]));  // not handed over yet
  b.executor.handed[ids[1]] = "slurm:7";
  CHECK(dependencies::met(b.reads(), ids[1]));
  b.executor.places = false;  // an executor that does not follow (Executor::follows): it waits here
  CHECK_FALSE(dependencies::met(b.reads(), ids[1]));
  b.executor.places = true;
  JobRecord cancelling = b.jobs.at(ids[1]).rec;
  cancelling.run.cancel_requested = true;
  b.jobs.apply(cancelling);
  CHECK_FALSE(dependencies::met(b.reads(), ids[1]));
}

TEST_CASE("a failed dependency fails its whole chain in one pass, each job naming the one it waited for") {
  DaemonBench b;
  const auto ids = chain(b, 4);
  CHECK_FALSE(dependencies::fail_blocked(b.reads(), commit_of(b), 500));  // nothing failed yet
  CHECK(b.commits == 0);
  b.end(ids[0], JobState::failed);
  CHECK_FALSE(dependencies::fail_blocked(b.reads(), commit_of(b), 500));
  CHECK(b.commits == 1);  // one transaction
  for (int i = 1; i < 4; ++i) {
    const JobRecord r = *b.store->get(ids[i]);
    CHECK(r.state == JobState::failed);
    CHECK(r.blocked_by == ids[i - 1]);
    CHECK(r.reason == "dependency " + std::to_string(ids[i - 1]) + " ended failed");
  }
}

TEST_CASE("a long failed chain fails a part at a time, saying more is left") {
  DaemonBench b;
  const auto ids = chain(b, 600);
  b.end(ids[0], JobState::cancelled);
  CHECK(dependencies::fail_blocked(b.reads(), commit_of(b), 500));  // 512 now, the rest next pass
  CHECK(b.store->get(ids[512])->state == JobState::failed);
  CHECK(b.store->get(ids[513])->state == JobState::queued);
  CHECK(b.store->get(ids[1])->reason == "dependency " + std::to_string(ids[0]) + " ended cancelled");
  CHECK_FALSE(dependencies::fail_blocked(b.reads(), commit_of(b), 500));
  CHECK(b.store->get(ids[599])->state == JobState::failed);
}

TEST_CASE("jobs handed over after a dependency that will not succeed are taken back, unless being cancelled") {
  DaemonBench b;
  b.executor.places = true;
  const auto ids = b.submit(5, k_owner);
  b.end(ids[0], JobState::failed);
  b.end(ids[4], JobState::succeeded);
  b.run(ids[1], {0});
  b.run(ids[2], {1});
  b.run(ids[3], {});
  for (auto id : {ids[1], ids[2], ids[3]}) {
    JobRecord r = b.jobs.at(id).rec;
    r.after = {id == ids[3] ? ids[4] : ids[0]};
    if (id == ids[2]) r.run.cancel_requested = true;
    b.jobs.apply(r);
  }
  dependencies::withdraw_orphans(b.reads(), b.executor);
  CHECK(b.executor.withdrawn ==
        std::vector<std::int64_t>{ids[1]});  // not ids[2], cancelled; not ids[3], its dependency met
}

TEST_SUITE_END();
