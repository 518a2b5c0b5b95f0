// Watches (daemon/watches.hpp): a watch is answered at once when a change it may see lies after its
// cursor, else held until one lands (changes landing together answer once) or its timeout; each
// job once, in the order of its first change; cut at its page with a cursor that misses nothing;
// a cursor of another run or older than the journal is reset; another user's progress is not news
// to one who may not read it. The answer names the jobs only, so the test sees which.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "daemon/watches.hpp"

using namespace gpuq::daemon;
using gpuq::common::WatchReply;
using gpuq::common::WatchRequest;
using nlohmann::json;

namespace {

constexpr std::int64_t k_epoch = 77;

struct Bench {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::size_t bound = 1000;  // jobs the answer takes, as a reply's byte bound would
  Watches watches{io,
                  [this](const Caller&, const std::vector<std::int64_t>& ids, WatchReply& out) {
                    std::size_t took = 0;
                    for (auto id : ids) {
                      if (took == bound) break;
                      out.jobs.emplace_back();
                      out.jobs.back().id = id;
                      ++took;
                    }
                    return took;
                  },
                  k_epoch, 8};
  std::vector<json> got;
  // A watch of `who` from `after` (this run's epoch unless told), its replies into `got`.
  void watch(Caller who, std::int64_t after, WatchRequest q = {}, std::int64_t epoch = k_epoch) {
    q.epoch = epoch;
    q.after = after;
    watches.add(who, q, [this](json j) { got.push_back(std::move(j)); });
  }
  void change(std::int64_t id, uid_t uid = 1, Watches::Kind kind = Watches::Kind::state, std::int64_t batch = 1) {
    watches.changed({id, batch, uid, kind});
  }
  void settle() { io.poll(); }  // what was posted (the answers of changes that landed)
  static std::vector<std::int64_t> ids(const json& reply) {
    std::vector<std::int64_t> out;
    for (const auto& j : reply["jobs"])
      out.push_back(j["id"].get<std::int64_t>());
    return out;
  }
};

const Caller k_alice{1, false};
const Caller k_bob{2, false};
const Caller k_admin{0, true};

WatchRequest held_for(double timeout_s) {
  WatchRequest q;
  q.timeout_s = timeout_s;
  return q;
}

}  // namespace

TEST_SUITE_BEGIN("watches");

TEST_CASE("a first watch learns the cursor at once; one from it is held until a change lands, then answered once") {
  Bench b;
  b.change(1);
  b.watch(k_alice, 0, {}, 0);  // no cursor yet
  REQUIRE(b.got.size() == 1);
  CHECK(b.got[0]["ok"] == true);
  CHECK(b.got[0]["reset"] == true);
  CHECK(b.got[0]["epoch"] == k_epoch);
  CHECK(b.got[0]["cursor"] == 1);
  b.watch(k_alice, 1);
  b.settle();
  CHECK(b.got.size() == 1);  // nothing after cursor 1: held
  CHECK(b.watches.held() == 1);
  b.change(2);
  b.change(3);
  b.change(2);
  CHECK(b.got.size() == 1);  // answered once the changes that land together have landed
  b.settle();
  REQUIRE(b.got.size() == 2);
  CHECK(Bench::ids(b.got[1]) == std::vector<std::int64_t>{2, 3});  // each once, by first change
  CHECK(b.got[1]["cursor"] == 4);
  CHECK(b.got[1]["more"] == false);
  CHECK(b.got[1]["reset"] == false);
  CHECK(b.watches.held() == 0);
  b.change(4);
  b.settle();
  CHECK(b.got.size() == 2);  // never answered twice
}

TEST_CASE("changes already after the cursor answer at once, and a reconnecting client resumes from its cursor") {
  Bench b;
  b.change(1);
  b.change(2);
  b.watch(k_alice, 1, held_for(30));
  REQUIRE(b.got.size() == 1);
  CHECK(Bench::ids(b.got[0]) == std::vector<std::int64_t>{2});
  b.change(3);
  b.watch(k_alice, 2, held_for(30));  // as from a new connection: the cursor is all it needs
  REQUIRE(b.got.size() == 2);
  CHECK(Bench::ids(b.got[1]) == std::vector<std::int64_t>{3});
  CHECK(b.got[1]["cursor"] == 3);
}

TEST_CASE("a cursor of another run, from the future, or older than the journal is reset to the head") {
  Bench b;  // the journal keeps 8 changes
  for (int id = 1; id <= 10; ++id)
    b.change(id);
  b.watch(k_alice, 3, {}, k_epoch + 1);  // another gpuqd's run
  b.watch(k_alice, 11);                  // after the head
  b.watch(k_alice, 1);                   // changes 2 and 3 are gone: 2 is not resumable
  for (const auto& r : b.got) {
    CHECK(r["reset"] == true);
    CHECK(r["cursor"] == 10);
    CHECK(r["jobs"].empty());
  }
  CHECK(b.got.size() == 3);
  b.watch(k_alice, 2);  // the oldest kept is 3: from 2 on, nothing was lost
  REQUIRE(b.got.size() == 4);
  CHECK(b.got[3]["reset"] == false);
  CHECK(Bench::ids(b.got[3]) == std::vector<std::int64_t>{3, 4, 5, 6, 7, 8, 9, 10});
}

TEST_CASE("a watch hears only its ids and batch, and a held one is not reset by a long run of others' changes") {
  Bench b;
  WatchRequest mine = held_for(30);
  mine.ids = {5, 9};
  b.watch(k_alice, 0, mine);  // 0, this run's start, is a cursor too: nothing after it yet
  WatchRequest batch2 = held_for(30);
  batch2.batch = 2;
  b.watch(k_bob, 0, batch2);
  CHECK(b.watches.held() == 2);
  for (int id = 10; id < 40; ++id)
    b.change(id);  // more than the journal keeps, none of theirs
  b.settle();
  CHECK(b.got.empty());
  b.change(9);
  b.change(41, 2, Watches::Kind::state, 2);
  b.settle();
  REQUIRE(b.got.size() == 2);
  for (const auto& r : b.got)
    CHECK(r["reset"] == false);
  CHECK(Bench::ids(b.got[0]) == std::vector<std::int64_t>{9});
  CHECK(Bench::ids(b.got[1]) == std::vector<std::int64_t>{41});
}

TEST_CASE("another user's progress is not news to one who may not read it; its state is") {
  Bench b;
  b.watch(k_bob, 0, held_for(30));
  b.watch(k_admin, 0, held_for(30));
  b.watch(k_alice, 0, held_for(30));
  b.change(1, k_alice.uid, Watches::Kind::details);
  b.settle();
  REQUIRE(b.got.size() == 2);  // the admin's and alice's own
  CHECK(b.watches.held() == 1);
  b.change(1, k_alice.uid, Watches::Kind::state);
  b.settle();
  REQUIRE(b.got.size() == 3);
  CHECK(Bench::ids(b.got[2]) == std::vector<std::int64_t>{1});
  // From bob's cursor on, the progress change is skipped and the change of state shown.
  b.watch(k_bob, 0);
  REQUIRE(b.got.size() == 4);
  CHECK(Bench::ids(b.got[3]) == std::vector<std::int64_t>{1});
}

TEST_CASE("a caller's cursor moves only over changes it may see, and only those reset it") {
  Bench b;  // the journal keeps 8 changes
  for (int i = 0; i < 3; ++i)
    b.change(1, k_alice.uid, Watches::Kind::details);
  b.watch(k_bob, 0, {}, 0);  // where to start: the last change bob may see, none
  REQUIRE(b.got.size() == 1);
  CHECK(b.got[0]["cursor"] == 0);
  b.watch(k_bob, 0, held_for(0));
  REQUIRE(b.got.size() == 2);
  CHECK(b.got[1]["cursor"] == 0);
  CHECK(b.got[1]["jobs"].empty());
  b.watch(k_alice, 0, held_for(0));
  CHECK(b.got.back()["cursor"] == 3);  // her own
  b.change(1, k_alice.uid, Watches::Kind::state);
  b.watch(k_bob, 0, held_for(0));
  CHECK(b.got.back()["cursor"] == 4);
  CHECK(Bench::ids(b.got.back()) == std::vector<std::int64_t>{1});
  // Twenty more of alice's progress: gone from the journal, and never bob's news, so his cursor
  // is still good; hers is reset.
  for (int i = 0; i < 20; ++i)
    b.change(1, k_alice.uid, Watches::Kind::details);
  b.watch(k_bob, 4, held_for(0));
  CHECK(b.got.back()["reset"] == false);
  CHECK(b.got.back()["cursor"] == 4);
  b.watch(k_alice, 4, held_for(0));
  CHECK(b.got.back()["reset"] == true);
  CHECK(b.got.back()["cursor"] == 24);
  // Held: alice's progress meanwhile neither answers bob's watch nor moves its cursor.
  b.watch(k_bob, 4, held_for(0.01));
  b.change(1, k_alice.uid, Watches::Kind::details);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const std::size_t had = b.got.size();
  while (b.got.size() == had) {
    if (std::chrono::steady_clock::now() > give_up) FAIL("the timeout did not answer within 60 s");
    b.io.run_one_for(std::chrono::milliseconds(100));
  }
  CHECK(b.got.back()["cursor"] == 4);
  CHECK(b.got.back()["jobs"].empty());
}

TEST_CASE("a reply cut at its page or its bound says more, and the next one starts where it stopped") {
  Bench b;
  for (int id = 1; id <= 5; ++id)
    b.change(id);
  b.change(1);
  WatchRequest q;
  q.page = 2;
  b.watch(k_alice, 0, q);
  REQUIRE(b.got.size() == 1);
  CHECK(Bench::ids(b.got[0]) == std::vector<std::int64_t>{1, 2});
  CHECK(b.got[0]["more"] == true);
  CHECK(b.got[0]["cursor"] == 2);
  b.bound = 1;  // the reply's byte bound takes one job
  b.watch(k_alice, 2, q);
  REQUIRE(b.got.size() == 2);
  CHECK(Bench::ids(b.got[1]) == std::vector<std::int64_t>{3});
  CHECK(b.got[1]["more"] == true);
  CHECK(b.got[1]["cursor"] == 3);
  b.bound = 1000;
  b.watch(k_alice, 3, q);
  REQUIRE(b.got.size() == 3);
  CHECK(Bench::ids(b.got[2]) == std::vector<std::int64_t>{4, 5});
  CHECK(b.got[2]["more"] == true);  // job 1 changed again after them
  b.watch(k_alice, b.got[2]["cursor"].get<std::int64_t>(), q);
  REQUIRE(b.got.size() == 4);
  CHECK(Bench::ids(b.got[3]) == std::vector<std::int64_t>{1});
  CHECK(b.got[3]["more"] == false);
  CHECK(b.got[3]["cursor"] == 6);
}

TEST_CASE("at its timeout a held watch is answered with nothing and the head, and never again") {
  Bench b;
  b.watch(k_alice, 0, held_for(0.05));
  WatchRequest other = held_for(30);
  other.ids = {3};
  b.watch(k_bob, 0, other);
  b.change(2, k_bob.uid, Watches::Kind::details);  // not for alice: moves her cursor on
  b.settle();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (b.got.empty()) {
    if (std::chrono::steady_clock::now() > give_up) FAIL("the timeout did not answer within 60 s");
    b.io.run_one_for(std::chrono::milliseconds(100));
  }
  REQUIRE(b.got.size() == 1);
  CHECK(b.got[0]["ok"] == true);
  CHECK(b.got[0]["jobs"].empty());
  CHECK(b.got[0]["cursor"] == 0);  // bob's progress is not alice's to count
  CHECK(b.watches.held() == 1);
  b.change(3);
  b.settle();
  CHECK(b.got.size() == 2);
}

TEST_CASE("a watch whose timeout passes in the turn a change answers it is answered once") {
  Bench b;
  b.watch(k_alice, 0, held_for(0.001));
  // Its timer's wait is over (its handler is due, and cancelling cannot take it back) when the
  // change that answers it lands: both run in the next turn.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  b.change(1);
  b.io.poll();
  b.io.poll();
  REQUIRE(b.got.size() == 1);
  CHECK(Bench::ids(b.got[0]) == std::vector<std::int64_t>{1});
  CHECK(b.watches.held() == 0);
  CHECK(b.watches.answers() == 1);
}

TEST_CASE("a watch whose answer cannot be made is answered with the error") {
  boost::asio::io_context io;
  Watches watches{io,
                  [](const Caller&, const std::vector<std::int64_t>&, WatchReply&) -> std::size_t {
                    throw gpuq::RequestError(gpuq::ErrorCode::store_error, "disk I/O error");
                  },
                  k_epoch};
  std::vector<json> got;
  WatchRequest q;
  q.epoch = k_epoch;
  watches.add(k_alice, q, [&](json j) { got.push_back(j); });
  watches.changed({1, 1, 1, Watches::Kind::state});
  CHECK_NOTHROW(io.poll());
  REQUIRE(got.size() == 1);
  CHECK(got[0]["ok"] == false);
  CHECK(got[0]["error"]["code"] == "store_error");
  CHECK(watches.held() == 0);
  // One that could be answered at once is answered with the error too, not left unanswered.
  CHECK_NOTHROW(watches.add(k_alice, q, [&](json j) { got.push_back(j); }));
  REQUIRE(got.size() == 2);
  CHECK(got[1]["error"]["code"] == "store_error");
}

TEST_SUITE_END();

TEST_CASE("the watches held for a connection whose client hung up are let go unanswered") {
  Bench b;
  Caller gone = k_alice, stays = k_alice;
  gone.connection = 3, stays.connection = 4;
  WatchRequest on_job = held_for(0.01);
  on_job.ids = {5};
  b.watch(gone, 0, on_job);
  b.watch(gone, 0, held_for(300));
  b.watch(stays, 0, held_for(300));
  CHECK(b.watches.held() == 3);
  CHECK(b.watches.abandon(3) == 2);
  CHECK(b.watches.held() == 1);
  b.io.run_for(std::chrono::milliseconds(50));  // the abandoned one's timeout would be up
  b.change(5);
  b.settle();
  REQUIRE(b.got.size() == 1);  // the one kept, of its connection
  CHECK(Bench::ids(b.got[0]) == std::vector<std::int64_t>{5});
  CHECK(b.watches.held() == 0);
}
