// Parsing and folding of job event lines (see events.hpp).
#include "daemon/events.hpp"

namespace gpuq::daemon {

ParsedEvents parse_events(std::string_view data, int rank, double now) {
  ParsedEvents out;
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::size_t nl = data.find('\n', pos);
    if (nl == std::string_view::npos) {
      // An unfinished line: wait for the rest, unless it is already too long to ever be valid.
      if (data.size() - pos > k_max_event_line) {
        out.bad_lines++;
        out.consumed = data.size();
      }
      break;
    }
    std::string_view line = data.substr(pos, nl - pos);
    pos = nl + 1;
    out.consumed = pos;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines are fine
    if (line.size() > k_max_event_line) {
      out.bad_lines++;
      continue;
    }
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("type") || !j["type"].is_string()) {
      out.bad_lines++;
      continue;
    }
    std::string type = j["type"].get<std::string>();
    if (type != "progress" && type != "result") {
      out.bad_lines++;
      continue;
    }
    j.erase("type");
    out.events.push_back({0, rank, type, now, std::move(j)});
  }
  return out;
}

void apply_events(JobRecord& job, const std::vector<EventRow>& events) {
  for (const auto& e : events) {
    if (e.type == "progress") {
      json p = e.data;
      p["rank"] = e.rank;
      p["at"] = e.at;
      job.progress = std::move(p);
    } else if (e.type == "result") {
      if (!job.result.is_object()) job.result = json::object();
      for (const auto& [k, v] : e.data.items()) job.result[k] = v;
    }
  }
}

}  // namespace gpuq::daemon
