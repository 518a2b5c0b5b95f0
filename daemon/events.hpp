// Job events: any job (C++, Python, shell) appends JSON lines to the file named by $GPUQ_EVENTS,
// each an object with "type": "progress" or "result" plus its numbers. These functions turn raw
// file bytes into events and fold them into a job; the daemon's follower feeds them.
// Only complete lines are consumed, so a line being written is read on the next pass.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "daemon/store.hpp"

namespace gpuq::daemon {

constexpr std::size_t k_max_event_line = 1 << 20;

struct ParsedEvents {
  std::vector<EventRow> events;
  std::size_t consumed = 0;   // bytes up to and including the last complete line
  std::int64_t bad_lines = 0; // not JSON, not an object, unknown type, or over k_max_event_line
};

ParsedEvents parse_events(std::string_view data, int rank, double now);

// Progress: the job's progress becomes the latest event (with its rank).
// Result: fields merge into the job's result (later values win).
void apply_events(JobRecord& job, const std::vector<EventRow>& events);

}  // namespace gpuq::daemon
