// The life cycle of a job. queued -> running -> one of the terminal states; a failed attempt with
// retries left goes back to queued (with a backoff), so "retrying" is queued with attempt > 0.
// out_of_memory: an OOM killer (its memory limit's or the machine's) killed a process of an attempt
// that then failed (as Slurm's OUT_OF_MEMORY); retried only if the spec asks (retry_on_oom).
#pragma once

#include <array>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace gpuq {

enum class JobState { queued, running, succeeded, failed, cancelled, timed_out, out_of_memory };

constexpr std::string_view to_string(JobState s) {
  switch (s) {
    case JobState::queued: return "queued";
    case JobState::running: return "running";
    case JobState::succeeded: return "succeeded";
    case JobState::failed: return "failed";
    case JobState::cancelled: return "cancelled";
    case JobState::timed_out: return "timed_out";
    case JobState::out_of_memory:
      return "out_of_memory";
  }
  return "failed";
}

// Every state, in the order of the life cycle.
constexpr std::array<JobState, 7> k_job_states{JobState::queued,       JobState::running,   JobState::succeeded,
                                               JobState::failed,       JobState::cancelled, JobState::timed_out,
                                               JobState::out_of_memory};

inline std::optional<JobState> job_state_from_string(std::string_view s) {
  for (auto st : k_job_states)
    if (to_string(st) == s) return st;
  return std::nullopt;
}

inline std::string name_of(JobState s) { return std::string(to_string(s)); }
inline std::ostream& operator<<(std::ostream& out, JobState s) { return out << to_string(s); }

constexpr bool is_terminal(JobState s) { return s != JobState::queued && s != JobState::running; }

}  // namespace gpuq
