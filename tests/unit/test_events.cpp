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
  // The first is kept, with why: each kind of bad line says its own.
  CHECK(p.first_bad.rfind("rank 0: event line is not valid JSON", 0) == 0);
  CHECK(p.first_bad.find(": \"not json\"") != std::string::npos);
  CHECK(parse_events("[1,2]\n", 2, 0).first_bad == "rank 2: not a JSON object: \"[1,2]\"");
  CHECK(parse_events("{\"type\":3}\n", 0, 0).first_bad == "rank 0: no \"type\" string: \"{\\\"type\\\":3}\"");
  CHECK(parse_events("{\"type\":\"weird\"}\n", 0, 0)
            .first_bad.find("\"type\" is \"weird\", not \"progress\", \"result\" or \"checkpoint\"") !=
        std::string::npos);
  CHECK(parse_events("{\"type\":\"result\"}\n", 0, 0).first_bad.empty());
}

TEST_CASE("what is said of a bad line is its first bytes, escaped: the line is the job's, any bytes, any length") {
  const std::string line = std::string("\x1b[2J\xff") + std::string(1000, 'z');
  auto p = parse_events(line + "\n", 0, 0);
  REQUIRE(p.bad_lines == 1);
  CHECK(p.first_bad.size() < 400);
  CHECK(p.first_bad.find('\x1b') == std::string::npos);  // no terminal escape reaches a screen
  CHECK(p.first_bad.find("\\u001b") != std::string::npos);
  CHECK(p.first_bad.substr(p.first_bad.size() - 3) == "...");
  // Nor in why: the parser's words quote the bytes it last read.
  for (const std::string& bad : {std::string("\xff\xfe\n"), std::string("{\"type\": \"result\", \"x\": \xc3\n")}) {
    const auto said = parse_events(bad, 0, 0).first_bad;
    REQUIRE_FALSE(said.empty());
    for (unsigned char ch : said)
      CHECK((ch >= 0x20 && ch < 0x7f));
  }
  auto big = parse_events(std::string(k_max_event_line + 10, 'x'), 0, 0);
  CHECK(big.first_bad.rfind("rank 0: over 1 MiB: \"xxx", 0) == 0);
}

TEST_CASE("an endless line without a newline is dropped once it exceeds the limit") {
  std::string data(k_max_event_line + 10, 'x');
  auto p = parse_events(data, 0, 0);
  CHECK(p.bad_lines == 1);
  CHECK(p.consumed == data.size());
}

TEST_CASE("a whole line over the limit in one read is one bad line, though it is valid JSON") {
  // {"type":"result","pad":"xxx…"}: an event but for its size; the line after it still counts.
  std::string big = R"({"type":"result","pad":")" + std::string(k_max_event_line, 'x') + "\"}\n";
  std::string data = big + R"({"type":"result","ok":1})" "\n";
  auto p = parse_events(data, 0, 0);
  CHECK(p.bad_lines == 1);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].data == json{{"ok", 1}});
  CHECK(p.consumed == data.size());
}

TEST_CASE("an event line nested 100,000 deep is one bad line, not a crash") {
  std::string line = R"({"type":"progress","x":)" + std::string(100000, '[') + std::string(100000, ']') + "}\n";
  std::string data = line + R"({"type":"progress","step":2})" "\n";
  auto p = parse_events(data, 0, 0);
  CHECK(p.bad_lines == 1);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].data == json{{"step", 2}});
  CHECK(p.consumed == data.size());
}

TEST_CASE("a line with a NUL byte is a bad line, not the part before the NUL") {
  std::string data = std::string(R"({"type":"result","acc":1})") + '\0' + "junk\n";
  auto p = parse_events(data, 0, 0);
  CHECK(p.bad_lines == 1);
  CHECK(p.events.empty());
}

TEST_CASE("an overlong line read in several pieces counts once and its tail is not a line of its own") {
  // The forged result sits at the end of a line far over the limit, after padding.
  const std::string forged = R"(,{"type":"result","acc":1.0})";
  std::string line = std::string(3 * k_max_event_line, ' ') + forged + "\n";
  std::string data = line + R"({"type":"result","real":1})" "\n";
  // As the daemon reads it: chunks of a bit over the limit, each read saying whether the last
  // one stopped inside a line.
  const std::size_t chunk = k_max_event_line + 4096;
  std::size_t offset = 0;
  std::int64_t bad = 0;
  std::vector<EventRow> events;
  while (offset < data.size()) {
    const bool mid_line = offset > 0 && data[offset - 1] != '\n';
    auto p = parse_events(std::string_view(data).substr(offset, chunk), 0, 0, mid_line);
    bad += p.bad_lines;
    events.insert(events.end(), p.events.begin(), p.events.end());
    REQUIRE(p.consumed > 0);
    offset += p.consumed;
  }
  CHECK(bad == 1);
  REQUIRE(events.size() == 1);
  CHECK(events[0].data == json{{"real", 1}});
}

TEST_CASE("a last line without a newline waits while the job runs and is read once it has ended") {
  std::string data = R"({"type":"progress","step":1})" "\n" R"({"type":"result","acc":0.9})";
  auto running = parse_events(data, 0, 0);
  CHECK(running.events.size() == 1);
  CHECK(running.consumed == data.find('\n') + 1);
  auto ended = parse_events(data, 0, 0, false, true);
  REQUIRE(ended.events.size() == 2);
  CHECK(ended.events[1].data == json{{"acc", 0.9}});
  CHECK(ended.consumed == data.size());
  auto broken = parse_events(R"({"type":"result","acc":)", 0, 0, false, true);
  CHECK(broken.bad_lines == 1);
  CHECK(broken.events.empty());
}

TEST_CASE("a result is bounded: an event that would grow it past the limit is refused") {
  JobRecord job;
  const std::string big(k_max_result_bytes / 4, 'x');  // three fit, four do not
  std::vector<EventRow> events;
  for (int i = 0; i < 5; ++i) events.push_back({0, 0, "result", 1, {{"f" + std::to_string(i), big}}});
  events.push_back({0, 0, "result", 1, {{"f0", "small"}}});  // replacing a field frees its room
  events.push_back({0, 0, "result", 1, {{"f9", big}}});
  CHECK(apply_events(job, events) == 2);  // f3 and f4; f9 fits again after f0 shrank
  CHECK(job.run.result.contains("f2"));
  CHECK_FALSE(job.run.result.contains("f3"));
  CHECK(job.run.result["f0"] == "small");
  CHECK(job.run.result.contains("f9"));
  CHECK(job.run.result.dump().size() <= k_max_result_bytes);
  CHECK(job.first_bad_event.rfind("rank 0: a result event that would make the job's result over 1 MiB: ", 0) == 0);
  JobRecord earlier;  // a job with a first bad line keeps it
  earlier.first_bad_event = "rank 0: not a JSON object: \"[]\"";
  apply_events(earlier, events);
  CHECK(earlier.first_bad_event == "rank 0: not a JSON object: \"[]\"");
}

TEST_CASE("progress keeps the latest event; results merge field by field") {
  JobRecord job;
  apply_events(job, {{0, 0, "progress", 1, {{"step", 1}}},
                     {0, 1, "result", 2, {{"acc", 0.5}, {"loss", 1.0}}},
                     {0, 0, "progress", 3, {{"step", 2}}},
                     {0, 0, "result", 4, {{"acc", 0.9}}}});
  CHECK(job.run.progress["step"] == 2);
  CHECK(job.run.progress["rank"] == 0);
  CHECK(job.run.result == json{{"acc", 0.9}, {"loss", 1.0}});
}

TEST_CASE("a checkpoint event records when the job last saved its work, and changes neither progress nor result") {
  const auto p = parse_events("{\"type\":\"checkpoint\",\"step\":40}\n{\"type\":\"progress\",\"step\":41}\n", 0, 50.0);
  REQUIRE(p.events.size() == 2);
  CHECK(p.bad_lines == 0);
  JobRecord job;
  apply_events(job, {p.events[0]});
  CHECK(job.run.checkpoint_at == 50.0);
  CHECK(job.run.progress.is_null());
  CHECK(job.run.result.is_null());
  EventRow older = p.events[0];
  older.at = 20.0;  // a late-read older one does not move it back
  apply_events(job, {older});
  CHECK(job.run.checkpoint_at == 50.0);
}

TEST_SUITE_END();
