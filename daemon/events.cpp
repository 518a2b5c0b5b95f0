// Parsing and folding of job event lines (see events.hpp).
#include "daemon/events.hpp"

#include "common/json_input.hpp"

namespace gpuq::daemon {

namespace {

// One line's event, or nothing (a bad line).
bool parse_line(std::string_view line, int rank, double now, ParsedEvents& out) {
  if (line.size() > k_max_event_line) return false;
  auto parsed = common::parse_untrusted(line, "event line");
  if (!parsed) return false;
  json& j = *parsed;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return false;
  std::string type = j["type"].get<std::string>();
  if (type != "progress" && type != "result") return false;
  j.erase("type");
  out.events.push_back({0, rank, type, now, std::move(j)});
  return true;
}

bool blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

}  // namespace

ParsedEvents parse_events(std::string_view data, int rank, double now, bool mid_line, bool ended) {
  ParsedEvents out;
  std::size_t pos = 0;
  if (mid_line) {  // the rest of a line already dropped as too long
    std::size_t nl = data.find('\n');
    out.consumed = pos = nl == std::string_view::npos ? data.size() : nl + 1;
  }
  while (pos < data.size()) {
    std::size_t nl = data.find('\n', pos);
    if (nl == std::string_view::npos) {
      std::string_view tail = data.substr(pos);
      if (tail.size() > k_max_event_line) {
        // Too long to ever be valid: drop it now (its rest is skipped as mid_line next time).
        out.bad_lines++;
        out.consumed = data.size();
      } else if (ended) {
        // The job is gone: no newline will come.
        if (!blank(tail) && !parse_line(tail, rank, now, out)) out.bad_lines++;
        out.consumed = data.size();
      }
      break;  // else an unfinished line: wait for the rest
    }
    std::string_view line = data.substr(pos, nl - pos);
    pos = nl + 1;
    out.consumed = pos;
    if (blank(line)) continue;
    if (!parse_line(line, rank, now, out)) out.bad_lines++;
  }
  return out;
}

std::int64_t apply_events(JobRecord& job, const std::vector<EventRow>& events) {
  std::int64_t refused = 0;
  std::size_t result_bytes = 0;  // measured once, at the first result event
  bool measured = false;
  for (const auto& e : events) {
    if (e.type == "progress") {
      json p = e.data;
      p["rank"] = e.rank;
      p["at"] = e.at;
      job.run.progress = std::move(p);
    } else if (e.type == "result") {
      if (!job.run.result.is_object()) job.run.result = json::object();
      if (!measured) result_bytes = job.run.result.dump().size(), measured = true;
      // The result after the merge: each field replaced adds its new size and drops its old one.
      std::size_t after = result_bytes;
      for (const auto& [k, v] : e.data.items()) {
        after += k.size() + 4 + v.dump().size();  // "k":v,
        if (auto old = job.run.result.find(k); old != job.run.result.end()) after -= k.size() + 4 + old->dump().size();
      }
      if (after > k_max_result_bytes) {
        refused++;
        continue;
      }
      for (const auto& [k, v] : e.data.items()) job.run.result[k] = v;
      result_bytes = after;
    }
  }
  return refused;
}

}  // namespace gpuq::daemon
