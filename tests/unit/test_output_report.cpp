// A job's output read through its report patterns (supervisor/output_report.hpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "supervisor/output_report.hpp"

using gpuq::common::Report;
using gpuq::supervisor::OutputReport;
using gpuq::supervisor::pattern_problems;
using gpuq::supervisor::typed_capture;
using json = nlohmann::json;

namespace {
// pytorch/examples' mnist/main.py, as it prints.
Report mnist() {
  Report r;
  r.progress = {R"(Train Epoch: (?P<epoch>\d+) \[(?P<seen>\d+)/\d+ .*Loss: (?P<loss>[0-9.]+))"};
  r.result = {
      R"(Test set: Average loss: (?P<test_loss>[0-9.]+), Accuracy: (?P<correct>\d+)/\d+ \((?P<test_accuracy>\d+)%\))"};
  return r;
}

std::vector<json> feed(OutputReport& o, const std::string& text) {
  std::vector<json> events;
  o.feed(text.data(), text.size(), events);
  return events;
}
}  // namespace

TEST_CASE("captured text stays a number where it is one") {
  CHECK(typed_capture("42") == json(42));
  CHECK(typed_capture("-7") == json(-7));
  CHECK(typed_capture("0.0335") == json(0.0335));
  CHECK(typed_capture("1e-3") == json(1e-3));
  for (const char* text : {"nan", "inf", "0x10", " 3", "3 ", "9890/10000", "", "abc"})
    CHECK(typed_capture(text) == json(text));
  CHECK(typed_capture(std::string_view("12\0"
                                       "3",
                                       4)) == json(std::string("12\0"
                                                               "3",
                                                               4)));  // not 12
}

TEST_CASE("mnist's lines become progress and result events, numbers kept") {
  if (!gpuq::supervisor::have_patterns()) return;
  auto made = OutputReport::make(mnist());
  REQUIRE(made);
  auto& o = **made;
  auto events = feed(o, "Train Epoch: 1 [0/60000 (0%)]\tLoss: 2.305\nTrain Epoch: 1 [640/60000 (1%)]\tLoss: 1.7\n");
  REQUIRE(events.size() == 2);
  CHECK(events[0] == json({{"type", "progress"}, {"epoch", 1}, {"seen", 0}, {"loss", 2.305}}));
  CHECK(events[1]["seen"] == 640);
  // Lines no pattern matches make nothing; a line split across two reads is one line.
  CHECK(feed(o, "\nUsing device cpu\nTest set: Average loss: 0.0335, Accur").empty());
  events = feed(o, "acy: 9890/10000 (99%)\n");
  REQUIRE(events.size() == 1);
  CHECK(events[0] == json({{"type", "result"}, {"test_loss", 0.0335}, {"correct", 9890}, {"test_accuracy", 99}}));
  // The last line, unended, is read at the end.
  CHECK(feed(o, "Test set: Average loss: 0.03, Accuracy: 9900/10000 (99%)").empty());
  std::vector<json> last;
  o.finish(last);
  REQUIRE(last.size() == 1);
  CHECK(last[0]["test_loss"] == 0.03);
}

TEST_CASE("a carriage return ends a line and only the start of a long line is looked at") {
  if (!gpuq::supervisor::have_patterns()) return;
  Report r;
  r.progress = {R"(step (?P<step>\d+))"};
  auto made = OutputReport::make(r);
  REQUIRE(made);
  auto& o = **made;
  // A progress bar redrawn in place: a line each time.
  auto events = feed(o, "step 1\rstep 2\rstep 3\r\n");
  REQUIRE(events.size() == 3);
  CHECK(events[2]["step"] == 3);
  // What comes past k_max_line bytes of one line is not matched: the work a line costs is bounded.
  const std::string pad(OutputReport::k_max_line, 'x');
  CHECK(feed(o, pad + " step 4\n").empty());
  CHECK(feed(o, std::string(10, 'x') + " step 5\n").size() == 1);  // and the next line is read again
}

TEST_CASE("patterns that cannot be used are named") {
  if (!gpuq::supervisor::have_patterns()) {
    Report r;
    r.result = {"(?P<x>1)"};
    CHECK(!pattern_problems(r).empty());
    return;
  }
  Report r;
  r.progress = {"(?P<ok>1)", "(?P<broken"};
  r.result = {"no groups", "(?P<type>x)", "(?P<x>a{1000}){1000}",
              "(?P<a>(?P<b>(?P<c>(?P<d>(?P<e>(?P<f>(?P<g>(?P<h>(?P<i>(?P<j>(?P<k>(?P<l>(?P<m>(?P<n>(?P<o>(?P<p>(?P<q>.)"
              "))))))))))))))))"};
  const auto problems = pattern_problems(r);
  REQUIRE(problems.size() == 5);
  CHECK(problems[4].find("`report.result[3]`") == 0);  // 17 named groups: more than a pattern may have
  CHECK(problems[4].find("17 groups") != std::string::npos);
  CHECK(problems[0].find("`report.progress[1]`") == 0);
  CHECK(problems[1].find("`report.result[0]`") == 0);
  CHECK(problems[1].find("no named group") != std::string::npos);
  CHECK(problems[2].find("`type`") != std::string::npos);
  CHECK(problems[3].find("`report.result[2]`") == 0);  // too large a program: RE2's memory bound
  CHECK(!OutputReport::make(r));
  // (?<name>...): RE2 from mid-2023 on takes it; an older one's refusal says how to write it.
  Report angle;
  angle.result = {"acc=(?<acc>[0-9.]+)"};
  const auto said = pattern_problems(angle);
  if (!said.empty())
    CHECK(said[0].find("names a group (?P<name>...) only") != std::string::npos);
  else
    CHECK(OutputReport::make(angle));
}
