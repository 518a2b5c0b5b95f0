// Cleans (daemon/cleaner.hpp) without a daemon: ended jobs in a store in memory, their directories
// in a temporary state dir. A clean frees the files and keeps the records; forget removes the
// records too, but never of a job a queued job, a pending wait or a restart under way still needs.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>

#include "daemon/cleaner.hpp"
#include "daemon/launcher.hpp"
#include "tests/unit/daemon_bench.hpp"
#include "tests/unit/refusal.hpp"
#include "tests/unit/temp_dir.hpp"

using namespace gpuq::daemon;
using gpuq::daemon::testing::DaemonBench;
using gpuq::ErrorCode;
using gpuq::JobState;
using gpuq::common::json;

using gpuq::testing::refusal;

namespace {

struct Bench : DaemonBench {
  gpuq::testing::TempDir tmp{"gpuq-unit-cleaner"};
  const std::string dir = tmp.path;
  RestartPins pins;
  Waiters waiters{io, [](const Caller&, const std::set<std::int64_t>&, bool) { return json::object(); }};
  Trash trash{io, dir};
  Cleaner cleaner{io, dir, 0, *store, jobs, pins, waiters, trash, [this] { return reads(); }};

  Bench() { config.state_dir = dir; }
  // Job `id`'s directory with a file in it.
  std::string make_files(std::int64_t id) {
    const std::string d = job_dir(dir, id);
    std::filesystem::create_directories(d + "/checkpoints");
    std::ofstream(d + "/checkpoints/last.pt") << std::string(4096, 'x');
    return d;
  }
  json clean(gpuq::common::CleanRequest q, const Caller& caller = Caller::self()) {
    std::optional<json> reply;
    Later<gpuq::common::CleanReply> r = [&](json j) { reply = std::move(j); };
    cleaner.start(caller, q, r);
    io.restart();
    auto work = boost::asio::make_work_guard(io);  // the trash's thread answers later
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!reply) {  // the trash is emptied on a thread of its own, which answers through `io`
      if (std::chrono::steady_clock::now() > give_up) FAIL("no reply within 60 s");
      io.run_one_for(std::chrono::milliseconds(100));
    }
    return *reply;
  }
};

std::vector<std::int64_t> ids_of(const json& list) {
  std::vector<std::int64_t> out;
  for (const auto& j : list) out.push_back(j.is_object() ? j["id"].get<std::int64_t>() : j.get<std::int64_t>());
  return out;
}

}  // namespace

TEST_SUITE_BEGIN("cleaner");

TEST_CASE("clean frees ended jobs' files and keeps their records; forget keeps what a queued job or a wait still needs") {
  Bench b;
  // 0 and 1 ended; 2 is queued after 1; 3 ended and a wait names it; 4 is queued (nothing to clean).
  const auto ids = b.submit(5, 1001);
  JobRecord r = b.jobs.at(ids[2]).rec;
  r.after = {ids[1]};
  b.jobs.apply(r);
  for (int i : {0, 1, 3}) {
    b.end(ids[i], JobState::succeeded);
    b.make_files(ids[i]);
  }
  b.waiters.add(Caller::self(), {ids[3]}, [](json) {}, 0);

  gpuq::common::CleanRequest q;
  q.ended_before = 1000;  // every job that ended before then: all of them (the bench ends jobs at 120)
  json reply = b.clean(q);
  INFO(reply.dump());
  REQUIRE(reply.value("ok", false));
  CHECK(ids_of(reply["cleaned"]) == std::vector<std::int64_t>{ids[0], ids[1], ids[3]});
  CHECK(reply["bytes_freed"].get<std::int64_t>() >= 3 * 4096);
  for (int i : {0, 1, 3}) {
    CHECK_FALSE(std::filesystem::exists(job_dir(b.dir, ids[i])));
    CHECK(b.store->get(ids[i]).has_value());  // the record stays
  }

  q.forget = true;
  reply = b.clean(q);
  REQUIRE(reply.value("ok", false));
  CHECK(ids_of(reply["forgotten"]) == std::vector<std::int64_t>{ids[0]});
  CHECK(ids_of(reply["kept"]) == std::vector<std::int64_t>{ids[1], ids[3]});
  CHECK(reply["kept"][0]["reason"].get<std::string>().find("waits for it") != std::string::npos);
  CHECK(reply["kept"][1]["reason"].get<std::string>().find("`gpuq wait`") != std::string::npos);
  CHECK_FALSE(b.store->get(ids[0]).has_value());
  CHECK(b.store->get(ids[1]).has_value());
  CHECK(b.store->get(ids[4])->state == JobState::queued);

  // Named, a needed job is refused, saying why; a queued one, that it has not ended.
  q.ended_before = 0;
  q.ids = {ids[1]};
  std::string message;
  CHECK(refusal([&] { b.clean(q); }, message) == ErrorCode::wrong_state);
  CHECK(message.find("cannot be forgotten") != std::string::npos);
  q.ids = {ids[4]};
  CHECK(refusal([&] { b.clean(q); }, message) == ErrorCode::wrong_state);
  CHECK(message.find("has ended") != std::string::npos);
}

TEST_CASE("what a restart under way holds is still needed") {
  Bench b;
  const auto ids = b.submit(2, 1001);
  b.end(ids[0], JobState::failed);
  b.end(ids[1], JobState::failed);
  REQUIRE(b.pins.pin(ids[0], 1001));
  b.pins.need(ids[1]);
  const auto needed = b.cleaner.still_needed();
  REQUIRE(needed.size() == 2);
  CHECK(needed.at(ids[0]).find("queueing it again") != std::string::npos);
  CHECK(needed.at(ids[1]).find("a restart under way queues a job that waits for it") != std::string::npos);
  gpuq::common::CleanRequest q;
  q.forget = true;
  q.ended_before = 1000;
  const json reply = b.clean(q);
  CHECK(reply["forgotten"].empty());
  // The job a restart has chosen is passed over (it is on its way back to the queue); the one it
  // will wait for is kept, saying why.
  CHECK(ids_of(reply["kept"]) == std::vector<std::int64_t>{ids[1]});
  CHECK(b.store->get(ids[0]).has_value());
}
