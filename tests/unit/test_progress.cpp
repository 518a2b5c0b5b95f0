// Live progress lines for `gpuq wait`: fraction done, bar, ETA, and the end states.
#include <doctest/doctest.h>

#include "cli/progress.hpp"

using gpuq::cli::fraction_done;
using gpuq::cli::progress_line;
using gpuq::common::JobInfo;
using gpuq::common::json;

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
  j.state = "running";
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
  j.state = "running";
  j.progress = {{"loss", 1.5}};
  CHECK(progress_line(j, 0, 200).rfind("3  script  running  loss 1.5", 0) == 0);
  j.state = "failed";
  j.reason = "rank 0 exited with code 2";
  CHECK(progress_line(j, 0, 200) == "3  script  failed  rank 0 exited with code 2");
  j.state = "queued";
  j.attempt = 1;
  j.reason = "";
  CHECK(progress_line(j, 0, 200) == "3  script  queued (retrying)");
}

TEST_SUITE_END();
