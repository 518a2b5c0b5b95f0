// The hang watch (daemon/hang_watch.hpp): which running jobs it flags, which it stops, what it says.
// Pure: records made here, GPUs busy or not as each test says.
#include <doctest/doctest.h>

#include "daemon/hang_watch.hpp"

using namespace gpuq::daemon;

namespace {

// Running since t=100; its last progress event at `at` (none when negative), on GPUs `gpus`.
JobRecord running_job(std::int64_t id, double at, std::vector<int> gpus = {}) {
  JobRecord r;
  r.id = id;
  r.spec.name = "train";
  r.state = gpuq::JobState::running;
  r.run.started_at = 100;
  r.run.gpus = std::move(gpus);
  if (at >= 0) r.run.progress = {{"at", at}, {"epoch", 3}, {"step", 120}};
  return r;
}

const auto idle = [](const JobRecord&) { return false; };

}  // namespace

TEST_SUITE_BEGIN("hang watch");

TEST_CASE("a job silent past hang_after_s since its last progress is flagged, with where it stopped") {
  HangWatch watch(60, false);
  const JobRecord quiet = running_job(1, 150), chatty = running_job(2, 200), mute = running_job(3, -1);
  CHECK(watch.check(211, {&quiet, &chatty, &mute}, idle).empty());  // no retry: flagged, not stopped
  CHECK(watch.hung(1));
  CHECK_FALSE(watch.hung(2));
  CHECK_FALSE(watch.hung(3));  // never said how it progresses: not judged
  CHECK(watch.note(quiet, 211) ==
        "no progress for 61 s since its last progress event at epoch 3, step 120 (hang_after_s 60): it may be hung");
  CHECK(watch.note(chatty, 211).empty());
}

TEST_CASE("progress from an earlier attempt does not count against this one") {
  HangWatch watch(60, true);
  const JobRecord retried = running_job(1, 50);  // reported at 50, before this attempt began at 100
  CHECK(watch.check(500, {&retried}, idle).empty());
  CHECK_FALSE(watch.hung(1));
}

TEST_CASE("busy GPUs clear a silent job, and are asked only of silent jobs on GPUs") {
  HangWatch watch(60, true);
  const JobRecord on_gpu = running_job(1, 150, {0}), on_cpu = running_job(2, 150), talking = running_job(3, 400, {1});
  int asked = 0;
  const auto busy = [&](const JobRecord& r) {
    ++asked;
    return r.id == 1;
  };
  CHECK(watch.check(400, {&on_gpu, &on_cpu, &talking}, busy) == std::vector<std::int64_t>{2});
  CHECK(asked == 1);
  CHECK_FALSE(watch.hung(1));
  CHECK(watch.hung(2));
}

TEST_CASE("with retry a hung job is stopped once, unless being cancelled, and its end says so") {
  HangWatch watch(60, true);
  JobRecord hung = running_job(1, 150), cancelling = running_job(2, 150);
  cancelling.run.cancel_requested = true;
  CHECK(watch.check(300, {&hung, &cancelling}, idle) == std::vector<std::int64_t>{1});
  CHECK(watch.check(301.5, {&hung, &cancelling}, idle).empty());  // flagged already: not stopped twice
  CHECK(watch.ended(hung, 302).rfind("stopped: no progress for 152 s", 0) == 0);
  CHECK_FALSE(watch.hung(1));
  CHECK(watch.ended(cancelling, 302).empty());  // flagged, not stopped by the watch: a cancel's end
  CHECK(watch.ended(hung, 303).empty());        // said once
}

TEST_CASE("a job that speaks again is cleared; checks come at most once a second; 0 turns the watch off") {
  HangWatch watch(60, false);
  JobRecord j = running_job(1, 150);
  watch.check(300, {&j}, idle);
  REQUIRE(watch.hung(1));
  j.run.progress["at"] = 300.2;
  watch.check(300.5, {&j}, idle);  // within a second of the last check: not looked at
  CHECK(watch.hung(1));
  watch.check(301, {&j}, idle);
  CHECK_FALSE(watch.hung(1));

  HangWatch off(0, true);
  CHECK(off.check(10000, {&j}, idle).empty());
  CHECK_FALSE(off.hung(1));
}

TEST_CASE("a job frozen for another is silent by design: not hung, and its silence counts from its thaw") {
  HangWatch watch(60, true);
  JobRecord frozen = running_job(1, 150);
  frozen.run.suspended_for = 9;
  CHECK(watch.check(300, {&frozen}, idle).empty());
  CHECK_FALSE(watch.hung(1));
  JobRecord thawed = running_job(1, 150);
  thawed.run.resumed_at = 290;
  CHECK(watch.check(320, {&thawed}, idle).empty());  // 30 s since its thaw
  CHECK_FALSE(watch.hung(1));
  CHECK(watch.check(351, {&thawed}, idle) == std::vector<std::int64_t>{1});  // 61 s since
}

TEST_SUITE_END();
