// Live progress: lines for `gpuq wait` (fraction done, bar, ETA, end states) and the `gpuq top` screen.
#include <doctest/doctest.h>

#include "cli/progress.hpp"
#include "cli/top.hpp"

using gpuq::cli::fraction_done;
using gpuq::cli::progress_line;
using gpuq::cli::top_screen;
using gpuq::cli::wait_screen;
using gpuq::cli::TopSnapshot;
using gpuq::common::JobInfo;
using gpuq::common::json;
using gpuq::JobState;

TEST_SUITE_BEGIN("progress");

TEST_CASE("the fraction done comes from steps, else epochs, else is unknown") {
  CHECK(*fraction_done(json{{"step", 250}, {"total_steps", 1000}, {"epoch", 1}, {"epochs", 10}}) == doctest::Approx(0.25));
  CHECK(*fraction_done(json{{"epoch", 3}, {"epochs", 4}}) == doctest::Approx(0.75));
  CHECK_FALSE(fraction_done(json{{"loss", 0.3}}).has_value());
  CHECK_FALSE(fraction_done(json{{"step", 5}, {"total_steps", 0}}).has_value());
  CHECK_FALSE(fraction_done(nullptr).has_value());
  CHECK(*fraction_done(json{{"step", 1200}, {"total_steps", 1000}}) == 1.0);  // clamped
}

TEST_CASE("a running job shows a bar, its position, loss, rate and an ETA from its pace") {
  JobInfo j;
  j.id = 7;
  j.name = "mnist";
  j.state = JobState::running;
  j.started_at = 1000;
  j.progress = {{"epoch", 2}, {"epochs", 4}, {"step", 500}, {"total_steps", 2000}, {"loss", 0.4123}, {"samples_per_s", 2345.0}};
  const auto line = progress_line(j, 1060, 200);  // a quarter done in 60 s: 3 minutes to go
  CHECK(line.rfind("7  mnist  [#####---------------] 25%  ", 0) == 0);
  CHECK(line.find("epoch 2/4") != std::string::npos);
  CHECK(line.find("step 500") != std::string::npos);
  CHECK(line.find("loss 0.4123") != std::string::npos);
  CHECK(line.find("2.3k samples/s") != std::string::npos);
  CHECK(line.find("ETA 3m00s") != std::string::npos);
  CHECK(progress_line(j, 1060, 30).size() == 30);  // cut to the terminal's width
}

TEST_CASE("jobs without totals, and finished jobs, get a line too") {
  JobInfo j;
  j.id = 3;
  j.name = "script";
  j.state = JobState::running;
  j.progress = {{"loss", 1.5}};
  CHECK(progress_line(j, 0, 200).rfind("3  script  running  loss 1.5", 0) == 0);
  j.state = JobState::failed;
  j.reason = "rank 0 exited with code 2";
  CHECK(progress_line(j, 0, 200) == "3  script  failed  rank 0 exited with code 2");
  j.state = JobState::queued;
  j.attempt = 1;
  j.reason = "";
  CHECK(progress_line(j, 0, 200) == "3  script  queued (retrying)");
}

TEST_CASE("a wait on more jobs than the terminal has rows shows a summary, then running and failed jobs") {
  std::vector<JobInfo> jobs;
  for (int id = 1; id <= 100; ++id) {
    JobInfo j;
    j.id = id;
    j.name = "sweep-" + std::to_string(id);
    j.state = id <= 40 ? JobState::succeeded : id <= 42 ? JobState::failed : id <= 45 ? JobState::running : JobState::queued;
    j.started_at = id <= 45 ? 1000 : 0;
    j.ended_at = id <= 42 ? 1000 + id : 0;  // 42 ended, all after the wait began at 1000
    if (id == 41) j.reason = "rank 0 exited with code 1";
    jobs.push_back(j);
  }
  // 42 of 100 ended in 100 s since the wait began: 58 left take 138 s more.
  auto lines = wait_screen(jobs, 1100, 1000, 200, 10);
  REQUIRE(lines.size() == 6);  // the summary, 3 running, 2 failed
  CHECK(lines[0] == "100 jobs  [########------------] 42%  40 succeeded  2 failed  3 running  55 queued  ETA 2m18s");
  CHECK(lines[1].rfind("43  sweep-43  running", 0) == 0);
  CHECK(lines[3].rfind("45  sweep-45  running", 0) == 0);
  CHECK(lines[4] == "42  sweep-42  failed");  // the newest failure first
  CHECK(lines[5] == "41  sweep-41  failed  rank 0 exited with code 1");

  // Fewer rows than running and failed jobs: as many as fit, then how many more.
  lines = wait_screen(jobs, 1100, 1000, 200, 4);
  REQUIRE(lines.size() == 4);
  CHECK(lines[3] == "... and 3 more running or failed");
  // Jobs that fit get a line each, as before; no ETA before anything ended since the wait began.
  CHECK(wait_screen(std::vector<JobInfo>(jobs.begin(), jobs.begin() + 5), 1100, 1000, 200, 10).size() == 5);
  CHECK(wait_screen(jobs, 1100, 2000, 200, 10)[0].find("ETA") == std::string::npos);
  CHECK(wait_screen(jobs, 1100, 1000, 30, 10)[0].size() == 30);
}

TEST_SUITE_END();

TEST_CASE("top: the screen fills the terminal exactly and shows GPUs, holders and job progress") {
  TopSnapshot s;
  s.socket = "/tmp/x.sock";
  s.daemon_version = "0.1.0";
  s.gpus.source = "fake:2:81920";
  s.gpus.gpus.resize(2);
  s.gpus.gpus[0] = {0, "GPU-0", "Fake GPU", 81920, nullptr, nullptr, 81920, true, {7}, nullptr, false, "", nullptr, 0};
  s.gpus.gpus[1] = {1, "GPU-1", "Fake GPU", 81920, 40960, 97, 0, false, {}, 1, false, "", nullptr, 0};
  gpuq::common::JobInfo run;
  run.id = 7, run.name = "mnist", run.state = JobState::running, run.gpus = {0}, run.attempt = 1, run.started_at = 100;
  run.progress = {{"epoch", 1}, {"epochs", 4}, {"step", 50}, {"total_steps", 200}, {"loss", 0.5}};
  gpuq::common::JobInfo done;
  done.id = 3, done.name = "old", done.state = JobState::succeeded, done.attempt = 1, done.started_at = 10, done.ended_at = 70;
  done.result = {{"test_accuracy", 0.91}, {"backend", "gloo"}};
  gpuq::common::JobInfo queued;
  queued.id = 9, queued.name = "next", queued.state = JobState::queued, queued.reason = "waiting for 1 free GPU";
  s.jobs.jobs = {done, run, queued};
  s.jobs.total = 3;

  auto lines = top_screen(s, 150, 100, 30);
  REQUIRE(lines.size() == 30);
  for (const auto& l : lines) CHECK(l.size() == 100);
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  CHECK(all.find("1 running, 1 queued, 3 in history") != std::string::npos);
  CHECK(all.find("exclusive  7 mnist") != std::string::npos);
  CHECK(all.find("40/80 GiB") != std::string::npos);  // NVML's reading, when there is one
  CHECK(all.find("97%") != std::string::npos);
  CHECK(all.find("25%  epoch 1/4") != std::string::npos);
  CHECK(all.find("test_accuracy=0.91") != std::string::npos);
  // running before queued before finished
  CHECK(all.find("7   mnist") < all.find("9   next"));
  CHECK(all.find("9   next") < all.find("3   old"));

  auto narrow = top_screen(s, 150, 40, 5);
  REQUIRE(narrow.size() == 5);
  for (const auto& l : narrow) CHECK(l.size() == 40);

  TopSnapshot down;
  down.socket = "/tmp/x.sock";
  down.error = "gpuqd is not running";
  auto d = top_screen(down, 150, 80, 0);
  REQUIRE(d.size() == 3);
  CHECK(d[2].find("gpuqd is not running (retrying every second)") == 0);
}
