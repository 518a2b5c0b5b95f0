// Job events: any job (C++, Python, shell) appends JSON lines to the file named by $GPUQ_EVENTS,
// each an object with "type": "progress", "result" or "checkpoint" plus its numbers. These functions turn raw
// file bytes into events and fold them into a job; the daemon's follower feeds them.
// Everything here is input from the job, so it is bounded (json_input.hpp's limits, and these):
//   - a line is at most k_max_event_line bytes; a longer one is one bad line, skipped whole up to
//     its newline however many reads it spans (a line starts only after a newline, so the tail
//     of a dropped line is never taken for a line of its own);
//   - only complete lines are consumed while the job runs; once it has ended, a last line
//     without its newline is read too (`f.write(json.dumps(x))` is a common slip);
//   - a job's merged result is at most k_max_result_bytes of JSON: a result event that would
//     grow it past that is refused and counted as a bad line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/store.hpp"

namespace gpuq::daemon {

constexpr std::size_t k_max_event_line = 1 << 20;
constexpr std::size_t k_max_result_bytes = 1 << 20;

struct ParsedEvents {
  std::vector<EventRow> events;
  std::size_t consumed = 0;   // bytes up to and including the last complete line
  std::int64_t bad_lines = 0; // not JSON, not an object, unknown type, too deep, or over k_max_event_line
  std::string first_bad;      // the first of them, and why (describe_bad_line); "" if none
};

// What `show`, `status` and `wait` say of a bad line: the rank, why, and the line's first bytes
// (at most k_bad_line_excerpt, as JSON text, so a control character or invalid UTF-8 shows escaped).
constexpr std::size_t k_bad_line_excerpt = 120;
std::string describe_bad_line(int rank, std::string_view why, std::string_view line);

// `data` starts where the last read stopped; `mid_line` says that was inside a line (the byte
// before `data` is not a newline), which is then skipped up to its end: it was counted already.
// `ended`: the job has ended, so an unterminated last line is complete.
ParsedEvents parse_events(std::string_view data, int rank, double now, bool mid_line = false, bool ended = false);

// Progress: the job's progress becomes the latest event (with its rank).
// Result: fields merge into the job's result (later values win), up to k_max_result_bytes.
// Returns how many result events were refused for that limit; the first such, where the job has no
// first bad line yet, becomes it.
std::int64_t apply_events(JobRecord& job, const std::vector<EventRow>& events);

}  // namespace gpuq::daemon
