// Event lines: complete lines only, bad lines counted not fatal, results merged.
#include <doctest/doctest.h>

#include "daemon/events.hpp"

using namespace gpuq::daemon;

TEST_SUITE_BEGIN("events");

TEST_CASE("complete lines are parsed and an unfinished line is left for later") {
  std::string data = R"({"type":"progress","step":1,"loss":0.9})" "\n" R"({"type":"result","acc":0.8})" "\n" R"({"type":"prog)";
  auto p = parse_events(data, 1, 5.0);
  REQUIRE(p.events.size() == 2);
  CHECK(p.events[0].type == "progress");
  CHECK(p.events[0].rank == 1);
  CHECK(p.events[0].data == json{{"step", 1}, {"loss", 0.9}});
  CHECK(p.consumed == data.rfind("{\"type\":\"prog"));
  CHECK(p.bad_lines == 0);
}

TEST_CASE("bad lines are skipped and counted, never fatal") {
  std::string data = "not json\n[1,2]\n{\"no_type\":1}\n{\"type\":\"weird\"}\n{\"type\":3}\n\n"
                     "{\"type\":\"result\",\"ok\":true}\n";
  auto p = parse_events(data, 0, 0);
  CHECK(p.bad_lines == 5);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].data["ok"] == true);
  CHECK(p.consumed == data.size());
}

TEST_CASE("an endless line without a newline is dropped once it exceeds the limit") {
  std::string data(k_max_event_line + 10, 'x');
  auto p = parse_events(data, 0, 0);
  CHECK(p.bad_lines == 1);
  CHECK(p.consumed == data.size());
}

TEST_CASE("progress keeps the latest event; results merge field by field") {
  JobRecord job;
  apply_events(job, {{0, 0, "progress", 1, {{"step", 1}}},
                     {0, 1, "result", 2, {{"acc", 0.5}, {"loss", 1.0}}},
                     {0, 0, "progress", 3, {{"step", 2}}},
                     {0, 0, "result", 4, {{"acc", 0.9}}}});
  CHECK(job.progress["step"] == 2);
  CHECK(job.progress["rank"] == 0);
  CHECK(job.result == json{{"acc", 0.9}, {"loss", 1.0}});
}

TEST_SUITE_END();
