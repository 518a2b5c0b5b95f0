// Parsing and folding of job event lines (see events.hpp).
#include "daemon/events.hpp"

#include <algorithm>

#include "common/json_input.hpp"

namespace gpuq::daemon {

namespace {

// One line's event, or why it is not one ("" when it is).
std::string parse_line(std::string_view line, int rank, double now, ParsedEvents& out) {
  if (line.size() > k_max_event_line) return "over " + std::to_string(k_max_event_line >> 20) + " MiB";
  auto parsed = common::parse_untrusted(line, "event line");
  if (!parsed) return parsed.error().message;
  json& j = *parsed;
  if (!j.is_object()) return "not a JSON object";
  if (!j.contains("type") || !j["type"].is_string()) return "no \"type\" string";
  std::string type = j["type"].get<std::string>();
  if (type != "progress" && type != "result" && type != "checkpoint")
    return "\"type\" is " + json(type.substr(0, 32)).dump(-1, ' ', true, json::error_handler_t::replace) +
           ", not \"progress\", \"result\" or \"checkpoint\"";
  j.erase("type");
  out.events.push_back({0, rank, type, now, std::move(j)});
  return "";
}

void bad(ParsedEvents& out, int rank, std::string_view why, std::string_view line) {
  if (out.bad_lines++ == 0) out.first_bad = describe_bad_line(rank, why, line);
}

void take(std::string_view line, int rank, double now, ParsedEvents& out) {
  if (auto why = parse_line(line, rank, now, out); !why.empty()) bad(out, rank, why, line);
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
        bad(out, rank, "over " + std::to_string(k_max_event_line >> 20) + " MiB", tail);
        out.consumed = data.size();
      } else if (ended) {
        // The job is gone: no newline will come.
        if (!blank(tail)) take(tail, rank, now, out);
        out.consumed = data.size();
      }
      break;  // else an unfinished line: wait for the rest
    }
    std::string_view line = data.substr(pos, nl - pos);
    pos = nl + 1;
    out.consumed = pos;
    if (blank(line)) continue;
    take(line, rank, now, out);
  }
  return out;
}

std::string describe_bad_line(int rank, std::string_view why, std::string_view line) {
  const bool cut = line.size() > k_bad_line_excerpt;
  const std::string excerpt(line.substr(0, k_bad_line_excerpt));
  // The parser's words quote bytes of the line too ("last read: ..."): any byte that is not
  // printable ASCII is written \xNN, so what a job wrote reaches no terminal raw.
  std::string reason;
  for (unsigned char ch : why.substr(0, 200)) {
    if (ch >= 0x20 && ch < 0x7f) {
      reason += static_cast<char>(ch);
    } else {
      static constexpr char k_hex[] = "0123456789abcdef";
      reason += {'\\', 'x', k_hex[ch >> 4], k_hex[ch & 15]};
    }
  }
  return "rank " + std::to_string(rank) + ": " + reason + ": " +
         json(excerpt).dump(-1, ' ', true, json::error_handler_t::replace) + (cut ? "..." : "");
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
    } else if (e.type == "checkpoint") {
      job.run.checkpoint_at = std::max(job.run.checkpoint_at, e.at);  // preemption counts work lost from here
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
        if (refused++ == 0 && job.first_bad_event.empty())
          job.first_bad_event = describe_bad_line(e.rank,
                                                  "a result event that would make the job's result over " +
                                                      std::to_string(k_max_result_bytes >> 20) + " MiB",
                                                  e.data.dump().substr(0, k_bad_line_excerpt));
        continue;
      }
      for (const auto& [k, v] : e.data.items()) job.run.result[k] = v;
      result_bytes = after;
    }
  }
  return refused;
}

}  // namespace gpuq::daemon
