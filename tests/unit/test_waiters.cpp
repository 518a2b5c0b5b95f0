// Waits (daemon/waiters.hpp): answered once none of their jobs is active, each exactly once; at a
// timeout, saying so; a job that comes back makes the waits naming it wait again. The answer is
// made here, so the test sees who asked, for what, and whether it timed out.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <set>
#include <type_traits>
#include <vector>

#include "daemon/waiters.hpp"

using namespace gpuq::daemon;
using nlohmann::json;

namespace {

struct Bench {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::set<std::int64_t> active;
  // The answer names the caller (as `total`) and the ids (as jobs), to be checked.
  Waiters waiters{io, [](const Caller& c, const std::set<std::int64_t>& ids, bool timed_out) {
                    gpuq::common::JobsReply r;
                    r.total = c.uid;
                    r.timed_out = timed_out;
                    for (auto id : ids) {
                      r.jobs.emplace_back();
                      r.jobs.back().id = id;
                    }
                    return r;
                  }};
  void notify() {
    waiters.notify([this](std::int64_t id) { return active.count(id) > 0; });
  }
};

}  // namespace

TEST_SUITE_BEGIN("waiters");

TEST_CASE("a wait is answered once, when the last of its jobs ends, with its caller's answer") {
  Bench b;
  b.active = {1, 2, 3};
  int answers = 0;
  json got;
  b.waiters.add({42, false}, {1, 2}, [&](json j) { ++answers, got = j; }, 0);
  b.notify();
  CHECK(answers == 0);
  b.active.erase(1);
  b.notify();
  CHECK(answers == 0);
  b.active.erase(2);
  b.notify();
  CHECK(answers == 1);
  CHECK(got["ok"] == true);
  CHECK(got["total"] == 42);
  CHECK(got["timed_out"] == false);
  REQUIRE(got["jobs"].size() == 2);
  CHECK(got["jobs"][0]["id"] == 1);
  CHECK(got["jobs"][1]["id"] == 2);
  b.notify();
  CHECK(answers == 1);
  CHECK(b.waiters.size() == 0);
}

TEST_CASE("a wait on jobs already ended is answered at the first notify") {
  Bench b;
  int answers = 0;
  b.waiters.add({1, true}, {7}, [&](json) { ++answers; }, 0);
  CHECK(b.waiters.names(7));
  b.notify();
  CHECK(answers == 1);
  CHECK_FALSE(b.waiters.names(7));
}

TEST_CASE("a job that comes back makes the waits that name it wait for it again") {
  Bench b;
  b.active = {1, 2};
  int answers = 0;
  b.waiters.add({1, true}, {1, 2}, [&](json) { ++answers; }, 0);
  b.active.erase(1);
  b.notify();  // 1 has left the wait's pending set
  b.active.insert(1);
  b.waiters.came_back(1);  // restarted
  b.active.erase(2);
  b.notify();
  CHECK(answers == 0);
  b.active.erase(1);
  b.notify();
  CHECK(answers == 1);
}

TEST_CASE("at its timeout a wait is answered saying so, and never again") {
  Bench b;
  b.active = {1};
  std::optional<json> got;
  int answers = 0;
  b.waiters.add({5, false}, {1}, [&](json j) { ++answers, got = j; }, 0.05);
  int other = 0;
  b.waiters.add({6, false}, {1}, [&](json) { ++other; }, 0);  // no timeout: stays
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!got) {
    if (std::chrono::steady_clock::now() > give_up) FAIL("the timeout did not answer within 60 s");
    b.io.run_one_for(std::chrono::milliseconds(100));
  }
  CHECK((*got)["timed_out"] == true);
  CHECK(b.waiters.size() == 1);
  b.active.clear();
  b.notify();
  CHECK(answers == 1);
  CHECK(other == 1);
}

TEST_CASE("every id a pending wait names is listed, for clean --forget to keep") {
  Bench b;
  b.active = {1, 2, 3};
  b.waiters.add({1, true}, {1, 2}, [](json) {}, 0);
  b.waiters.add({1, true}, {3}, [](json) {}, 0);
  std::set<std::int64_t> named;
  b.waiters.for_each_named([&](std::int64_t id) { named.insert(id); });
  CHECK(named == std::set<std::int64_t>{1, 2, 3});
}

TEST_CASE("a wait whose answer cannot be made is answered with the error, and the other waits with theirs") {
  boost::asio::io_context io;
  Waiters waiters{io, [](const Caller& c, const std::set<std::int64_t>&, bool) {
                    if (c.uid == 13) throw gpuq::RequestError(gpuq::ErrorCode::store_error, "disk I/O error");
                    return gpuq::common::JobsReply{};
                  }};
  std::vector<json> unlucky, lucky;
  waiters.add(
      {13, false}, {1}, [&](json j) { unlucky.push_back(j); }, 0);
  waiters.add(
      {14, false}, {1}, [&](json j) { lucky.push_back(j); }, 0);
  // The store fails while answering the first: it is still answered (with the error), nothing
  // escapes to the caller of notify (another client's request), and the second is answered too.
  CHECK_NOTHROW(waiters.notify([](std::int64_t) { return false; }));
  REQUIRE(unlucky.size() == 1);
  CHECK(unlucky[0]["ok"] == false);
  CHECK(unlucky[0]["error"]["code"] == "store_error");
  REQUIRE(lucky.size() == 1);
  CHECK(lucky[0]["ok"] == true);
  CHECK(waiters.size() == 0);
}

// A Later is one request's reply: of its command's type only, sent once.
static_assert(!std::is_convertible_v<Later<gpuq::common::CleanReply>, Later<gpuq::common::RestartReply>>);
static_assert(!std::is_constructible_v<Later<gpuq::common::RestartReply>, Later<gpuq::common::CleanReply>&>);
static_assert(!std::is_copy_constructible_v<Later<gpuq::common::CleanReply>>);
static_assert(std::is_convertible_v<Reply, Later<gpuq::common::CleanReply>>);

TEST_CASE("a Later sends one reply: a second answer, or one through a Later moved from, sends nothing") {
  std::vector<json> sent;
  Later<gpuq::common::CleanReply> later = [&](json j) { sent.push_back(std::move(j)); };
  CHECK(static_cast<bool>(later));
  Later<gpuq::common::CleanReply> taken = std::move(later);
  CHECK_FALSE(static_cast<bool>(later));
  later.fail(gpuq::ErrorCode::internal, "never sent");
  gpuq::common::CleanReply out;
  out.bytes_freed = 7;
  taken(out);
  taken.fail(gpuq::ErrorCode::internal, "never sent either");
  REQUIRE(sent.size() == 1);
  CHECK(sent[0]["ok"] == true);
  CHECK(sent[0]["bytes_freed"] == 7);
  CHECK_FALSE(static_cast<bool>(taken));
}

TEST_SUITE_END();

TEST_CASE("the waits of a connection whose client hung up are let go unanswered, the others kept") {
  Bench b;
  b.active = {1, 2};
  int left = 0, kept = 0;
  Caller gone{42, false}, stays{42, false};
  gone.connection = 7, stays.connection = 8;
  b.waiters.add(
      gone, {1}, [&](json) { ++left; }, 0);
  b.waiters.add(
      gone, {1, 2}, [&](json) { ++left; }, 0.01);
  b.waiters.add(
      stays, {1}, [&](json) { ++kept; }, 0);
  CHECK(b.waiters.abandon(0) == 0);  // no connection: nothing
  CHECK(b.waiters.abandon(7) == 2);
  CHECK(b.waiters.size() == 1);
  CHECK_FALSE(b.waiters.names(2));
  b.io.run_for(std::chrono::milliseconds(50));  // the abandoned one's timeout would be up
  b.active.clear();
  b.notify();
  CHECK(left == 0);
  CHECK(kept == 1);
  CHECK(b.waiters.size() == 0);
}
