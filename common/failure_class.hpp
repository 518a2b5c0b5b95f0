// Failure classes: what a failed rank's log says went wrong, in terms a user can act on (CUDA ran
// out of memory, a collective operation timed out, NCCL or CUDA failed), read from the log's last
// lines by the supervisor and named in the job's reason by gpuqd. Pure, for tests.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gpuq::common {

struct FailureClass {
  std::string name;  // one of failure_class_names()
  std::string line;  // the log line that says so, as printable text of at most 400 bytes
};

// The last line of `tail` (a log's last bytes) that names a failure class, or nothing. Classes,
// each from the messages PyTorch, LibTorch, NCCL, Gloo and the CUDA runtime print:
//   cuda_oom            "CUDA out of memory", "CUDA error: out of memory", cudaErrorMemoryAllocation
//   collective_timeout  NCCL's watchdog ("Watchdog caught collective operation timeout"), Gloo's
//                       "Timed out waiting ... for recv/send", "NCCL timeout"
//   nccl_error          "NCCL error" (PyTorch's DistBackendError, ncclCommInitRank's)
//   cuda_error          another "CUDA error: ..." (an illegal address, a launch failure)
std::optional<FailureClass> classify_failure(std::string_view tail);

// Whether `name` is a class classify_failure gives (what gpuqd accepts from an exit record).
bool is_failure_class(std::string_view name);

// What a class means, for a reason: "CUDA out of memory", …; "" for an unknown name.
std::string failure_class_words(std::string_view name);

// A log line as a terminal shows it: what follows its last carriage return, ANSI escapes and
// control characters gone, tabs as spaces, trimmed, at most `max` bytes (cut between UTF-8
// characters, "..." added). "" for a line with nothing printable.
std::string printable_line(std::string_view line, std::size_t max = 400);

}  // namespace gpuq::common
