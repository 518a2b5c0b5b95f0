// Submissions on their way into the store (daemon/submissions.hpp): checked off gpuqd's thread,
// accepted or refused on it, written one batch at a time; the jobs go live before the submitter
// hears their ids, and a refused or failed batch leaves nothing behind. A store in memory.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "daemon/submissions.hpp"
#include "tests/unit/memory_store.hpp"

using namespace gpuq::daemon;
using gpuq::ErrorCode;
using gpuq::common::json;

namespace {

struct Bench {
  boost::asio::io_context io;
  std::unique_ptr<Store> store;
  std::function<gpuq::Result<bool>(Submissions::Batch&)> accept = [](Submissions::Batch&) {
    return gpuq::Result<bool>(true);
  };
  std::vector<std::vector<std::int64_t>> live;  // each written batch's job ids, as `written` saw them
  std::vector<json> replies;                    // in the order they came
  Submissions subs;

  Bench()
      : store(gpuq::testing::memory_store()),
        subs(
            io, *store, [this](Submissions::Batch& b) { return accept(b); },
            [this](Submissions::Batch& b) {
              std::vector<std::int64_t> ids;
              for (const auto& [id, a] : b.staged) {
                CHECK(a.rec.id == id);
                ids.push_back(id);
              }
              live.push_back(ids);
              std::size_t ok = 0;  // batches answered with their ids
              for (const auto& r : replies) ok += r.value("ok", false);
              CHECK(ok + 1 == live.size());  // live before its submitter is answered
            }) {}

  // `jobs` jobs; with `broken`, the last names no command.
  void submit(int jobs, bool broken = false) {
    gpuq::common::SubmitRequest q;
    q.cwd = "/";
    q.jobs = json::array();
    for (int i = 0; i < jobs; ++i) q.jobs.push_back({{"name", "j" + std::to_string(i)}, {"command", {"true"}}});
    if (broken) q.jobs.back().erase("command");
    MachineFacts facts;
    facts.gpus = 1;
    facts.largest_gpu_mb = 16000;
    facts.gpu_source = "fake";
    subs.submit(Caller::self(), q, facts, std::nullopt, [this](json r) { replies.push_back(std::move(r)); });
  }
  // Runs gpuqd's loop until `n` replies have come (a bound, not a wait: none coming fails the test).
  void until_replies(std::size_t n) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    io.restart();  // after a run that found nothing left to do
    auto work = boost::asio::make_work_guard(io);
    while (replies.size() < n) {
      if (std::chrono::steady_clock::now() > give_up) FAIL("only " << replies.size() << " replies of " << n);
      io.run_one_for(std::chrono::milliseconds(100));
    }
  }
};

}  // namespace

TEST_SUITE_BEGIN("submissions");

TEST_CASE("each batch is written whole before the next, its jobs go live before its reply, and ids follow on") {
  Bench b;
  b.submit(3);
  b.submit(2000);  // more than one part's worth on most machines: the next waits for all of it
  b.submit(1);
  b.until_replies(3);
  REQUIRE(b.live.size() == 3);
  std::vector<std::int64_t> all;
  for (std::size_t i = 0; i < 3; ++i) {
    INFO(b.replies[i].dump());
    REQUIRE(b.replies[i].value("ok", false));
    CHECK(b.replies[i]["ids"].get<std::vector<std::int64_t>>() == b.live[i]);
    all.insert(all.end(), b.live[i].begin(), b.live[i].end());
  }
  // The batches were checked in parallel with nothing, and written in the order their checks
  // ended, which on one check thread is the order they came: 3, 2000, 1 jobs.
  CHECK(b.live[0].size() == 3);
  CHECK(b.live[1].size() == 2000);
  CHECK(b.live[2].size() == 1);
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i] == all[i - 1] + 1);
  CHECK(b.store->count_jobs({}) == 2004);
  CHECK(b.subs.writing() == 0);
}

TEST_CASE("a batch its checks or accept refuse is answered with the error and leaves nothing in the store") {
  Bench b;
  b.submit(2, true);
  b.until_replies(1);
  CHECK(b.replies[0]["error"]["code"] == "invalid_spec");
  b.accept = [](Submissions::Batch& batch) -> gpuq::Result<bool> {
    CHECK(batch.checked);
    CHECK(batch.checked->jobs.size() == 4);
    return gpuq::Error{ErrorCode::forbidden, "over max_queued"};
  };
  b.submit(4);
  b.until_replies(2);
  CHECK(b.replies[1]["error"]["code"] == "forbidden");
  CHECK(b.replies[1]["error"]["message"] == "over max_queued");
  CHECK(b.live.empty());
  CHECK(b.store->count_jobs({}) == 0);
  // The next accepted batch goes through as if the refused ones had not been.
  b.accept = [](Submissions::Batch&) { return gpuq::Result<bool>(true); };
  b.submit(1);
  b.until_replies(3);
  CHECK(b.replies[2].value("ok", false));
  CHECK(b.store->count_jobs({}) == 1);
}
