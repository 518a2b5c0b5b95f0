// Restarts under way (daemon/restarter.hpp) without a daemon: ended jobs in a store in memory,
// what the restart lands applied to the job table as the daemon's land() does. A restart takes
// along the jobs that failed waiting for its own, requeues each after what it waits for, holds
// its jobs pinned only while it runs, and refuses whole what cannot run again.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "daemon/lifecycle.hpp"
#include "daemon/restarter.hpp"
#include "tests/unit/daemon_bench.hpp"
#include "tests/unit/refusal.hpp"

using namespace gpuq::daemon;
using gpuq::daemon::testing::DaemonBench;
using gpuq::ErrorCode;
using gpuq::JobState;
using gpuq::RequestError;
using gpuq::common::json;

using gpuq::testing::refusal;

namespace {

struct Bench : DaemonBench {
  RestartPins pins;
  Trash trash{io, "/nonexistent/state"};
  int passes = 0;                    // scheduling passes asked for
  Restarter restarter{io,
                      "/nonexistent/state",
                      *store,
                      jobs,
                      pins,
                      trash,
                      users,
                      {[this] { return reads(); },
                       [this](std::vector<JobRecord> changed, const WriteRows& write) {
                         land(std::move(changed), write);  // requeued job ids in `landed`, in order
                       },
                       [this] { ++passes; }}};

  // The reply to a restart of `q`, gpuqd's loop run until it comes.
  json restart(const gpuq::common::RestartRequest& q, const Caller& caller = Caller::self()) {
    std::optional<json> reply;
    Later<gpuq::common::RestartReply> r = [&](json j) { reply = std::move(j); };
    restarter.start(caller, q, r);
    io.restart();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!reply) {
      if (std::chrono::steady_clock::now() > give_up) FAIL("no reply within 60 s");
      io.run_one_for(std::chrono::milliseconds(100));
    }
    return *reply;
  }
};

gpuq::common::RestartRequest of(std::vector<std::int64_t> ids) {
  gpuq::common::RestartRequest q;
  q.ids = std::move(ids);
  return q;
}

}  // namespace

TEST_SUITE_BEGIN("restarter");

TEST_CASE("a restart takes along the jobs that failed waiting for its job, requeues each after what it waits for, and unpins them") {
  Bench b;
  // 0 failed; 1 and 2 failed waiting for it (1 also waits for 2, a later job); 3 failed on its own.
  const auto ids = b.submit(4, 1001);
  for (std::int64_t dependent : {ids[1], ids[2]}) {
    JobRecord r = b.jobs.at(dependent).rec;
    r.after = dependent == ids[1] ? std::vector<std::int64_t>{ids[2], ids[0]} : std::vector<std::int64_t>{ids[0]};
    b.jobs.apply(r);
  }
  b.end(ids[0], JobState::failed);
  b.end(ids[1], JobState::failed, nullptr, ids[0]);
  b.end(ids[2], JobState::failed, nullptr, ids[0]);
  b.end(ids[3], JobState::failed);

  const json reply = b.restart(of({ids[0]}));
  INFO(reply.dump());
  REQUIRE(reply.value("ok", false));
  CHECK(reply["total"] == 3);
  CHECK(reply["along"] == 2);
  CHECK(b.landed == std::vector<std::int64_t>{ids[0], ids[2], ids[1]});  // each after what it waits for
  for (int i = 0; i < 3; ++i) {
    CHECK(b.jobs.at(ids[i]).rec.state == JobState::queued);
    CHECK(b.store->get(ids[i])->state == JobState::queued);
    CHECK(b.store->get(ids[i])->restarts == 1);
    CHECK_FALSE(b.pins.pinned(ids[i]));
  }
  CHECK(b.store->get(ids[3])->state == JobState::failed);  // not named, not along
  CHECK(b.passes >= 1);
  CHECK(queued_or_running(b.jobs, b.pins, 1001) == 3);
}

TEST_CASE("a job still running, another restart's, or one waiting for a job that stays failed is refused, and nothing stays pinned") {
  Bench b;
  const auto ids = b.submit(3, 1001);
  std::string message;
  // Queued: not ended.
  CHECK(refusal([&] { b.restart(of({ids[0]})); }, message) == ErrorCode::wrong_state);
  CHECK(message.find("only a job that has ended can be restarted") != std::string::npos);
  // Another restart under way holds it.
  b.end(ids[0], JobState::failed);
  REQUIRE(b.pins.pin(ids[0], 1001));
  CHECK(refusal([&] { b.restart(of({ids[0]})); }, message) == ErrorCode::wrong_state);
  CHECK(message.find("being restarted by another request") != std::string::npos);
  b.pins.unpin(ids[0]);
  // Job 1 waits for job 2, which failed and is not restarted with it: refused at choosing.
  JobRecord r = b.jobs.at(ids[1]).rec;
  r.after = {ids[2]};
  b.jobs.apply(r);
  b.end(ids[1], JobState::cancelled);
  b.end(ids[2], JobState::failed);
  const json reply = b.restart(of({ids[0], ids[1]}));
  CHECK(reply["error"]["code"] == "wrong_state");
  CHECK(reply["error"]["message"].get<std::string>().find("restart that job too") != std::string::npos);
  CHECK(b.landed.empty());
  for (auto id : ids) CHECK_FALSE(b.pins.pinned(id));
  CHECK(b.store->get(ids[0])->state == JobState::failed);
  // Another user's job is refused naming its owner.
  CHECK(refusal([&] { b.restart(of({ids[0]}), Caller{1002, false}); }, message) ==
        ErrorCode::forbidden);
  CHECK(message.find("belongs to user1001") != std::string::npos);
}
