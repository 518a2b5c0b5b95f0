// The event tick (daemon/event_tick.hpp) without a daemon: the bench's, over a running job's events
// file in a temp state directory, what it lands applied to the job table (DaemonBench::land).
// Only complete lines are read while the job runs, the last unterminated one at its end; a read
// while it runs takes at most k_events_per_call; a file that is not the job's own reads as empty;
// the tick reads by itself while a job runs and stops once none does.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "common/paths.hpp"
#include "daemon/event_tick.hpp"
#include "daemon/launcher.hpp"
#include "tests/unit/daemon_bench.hpp"
#include "tests/unit/temp_dir.hpp"

using namespace gpuq::daemon;
using gpuq::daemon::testing::DaemonBench;
using gpuq::JobState;
using gpuq::common::json;

namespace {

struct Bench : DaemonBench {
  gpuq::testing::TempDir tmp{"gpuq-unit-events"};
  const std::string dir = tmp.path;
  EventTick& tick = events;
  std::int64_t id = 0;

  // One job of this process's user, running as attempt 1 with its attempt directory made.
  Bench() {
    config.state_dir = dir;
    config.ingest_interval_s = 0.01;
    id = submit(1, ::getuid()).front();
    run(id, {0});
    REQUIRE(gpuq::common::make_dirs(attempt_dir(dir, id, 1)));
  }
  std::string events_path() const { return rank_events_path(attempt_dir(dir, id, 1), 0); }
  void append(const std::string& text) {
    std::ofstream(events_path(), std::ios::app) << text;
  }
  const JobRecord& rec() { return jobs.at(id).rec; }
};

}  // namespace

TEST_SUITE_BEGIN("event tick");

TEST_CASE("complete lines are read while the job runs, an unterminated last line only at its end, each once") {
  Bench b;
  b.append("{\"type\":\"progress\",\"step\":1}\n{\"type\":\"result\",\"loss\":0.5}\n{\"type\":\"result\",\"acc\"");
  REQUIRE(b.tick.ingest(b.jobs.at(b.id)));
  CHECK(b.rec().run.progress["step"] == 1);
  CHECK(b.rec().run.result == json{{"loss", 0.5}});
  const auto first = static_cast<std::int64_t>(std::string("{\"type\":\"progress\",\"step\":1}\n{\"type\":\"result\",\"loss\":0.5}\n").size());
  CHECK(b.store->event_offset(b.id, 1, 0) == first);
  CHECK(b.jobs.at(b.id).event_offsets[0] == first);
  // Read again with nothing new: nothing lands twice.
  const std::size_t landed = b.landed.size();
  REQUIRE(b.tick.ingest(b.jobs.at(b.id)));
  CHECK(b.landed.size() == landed);
  b.append(":0.9}");
  REQUIRE(b.tick.ingest(b.jobs.at(b.id), /*ended=*/true));
  CHECK(b.rec().run.result == json{{"loss", 0.5}, {"acc", 0.9}});
  CHECK(b.rec().bad_event_lines == 0);
}

TEST_CASE("a read while the job runs takes at most k_events_per_call; the job's end reads the rest") {
  Bench b;
  // 12 MiB of lines the parser refuses (each under the line limit), then one progress event.
  const std::string bad(1000, 'x');
  std::string flood;
  for (int i = 0; i < 12 * 1024; ++i) flood += bad + "\n";
  b.append(flood + "{\"type\":\"progress\",\"step\":7}\n");
  REQUIRE(b.tick.ingest(b.jobs.at(b.id)));
  CHECK(b.tick.reads().reads == 1);
  CHECK(b.tick.reads().max_bytes > 0);
  CHECK(b.tick.reads().max_bytes <= EventTick::k_events_per_call);
  CHECK(b.rec().run.progress.is_null());  // the event lies past the first read
  REQUIRE(b.tick.ingest(b.jobs.at(b.id), /*ended=*/true));
  CHECK(b.rec().run.progress["step"] == 7);
  CHECK(b.rec().bad_event_lines == 12 * 1024);
  CHECK(b.tick.reads().reads == 1);  // the end's read is not one of a running job's
}

TEST_CASE("an events file that is not the job's own regular file is read as empty") {
  Bench b;
  const std::string real = b.dir + "/elsewhere.jsonl";
  std::ofstream(real) << "{\"type\":\"result\",\"secret\":1}\n";
  SUBCASE("a symbolic link") { REQUIRE(::symlink(real.c_str(), b.events_path().c_str()) == 0); }
  SUBCASE("a fifo") { REQUIRE(::mkfifo(b.events_path().c_str(), 0600) == 0); }
  REQUIRE(b.tick.ingest(b.jobs.at(b.id), /*ended=*/true));
  CHECK(b.rec().run.result.is_null());
  CHECK(b.store->event_offset(b.id, 1, 0) == 0);
}

TEST_CASE("the tick reads running jobs' events by itself and stops once none runs") {
  Bench b;
  b.append("{\"type\":\"progress\",\"step\":3}\n");
  b.tick.arm();
  b.io.restart();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (b.rec().run.progress.is_null()) {
    if (std::chrono::steady_clock::now() > give_up) FAIL("no tick read the events within 60 s");
    b.io.run_one_for(std::chrono::milliseconds(100));
  }
  CHECK(b.rec().run.progress["step"] == 3);
  // The job ends: the tick's next round finds no running job and arms no timer, so the loop runs
  // out of work (run_for returns at once; a tick that went on would hold it the whole minute).
  b.end(b.id, JobState::succeeded);
  b.io.run_for(std::chrono::seconds(60));
  CHECK(b.io.stopped());
}
