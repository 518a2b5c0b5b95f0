// The one parser for JSON that gpuq did not write itself: a client's request line, a job's event
// lines, exit record and pid file, a spec or config file, a reply read by the CLI. Every such
// byte is untrusted, so every one goes through the same limits, listed here and in
// docs/reliability.md:
//   - nesting at most k_max_json_depth levels: the parser itself is iterative, but a deeper value
//     costs recursion later (copy, dump, compare, destroy) and pretty-printing it is quadratic;
//   - no NUL byte: nlohmann's lexer ends the text at one, so `{...}\0junk` would pass as `{...}`;
//   - valid UTF-8 JSON, numbers within double's range;
//   - a size cap chosen by the caller (k_max_request_bytes, k_max_event_line, ...), checked first.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace gpuq::common {

using json = nlohmann::json;

constexpr int k_max_json_depth = 64;  // a job spec needs ~8, an event 2-3

// Parses JSON nested at most `max_depth` deep: sets `too_deep` (and returns a discarded
// value) for deeper documents; throws json::exception on invalid JSON (parse_error, or
// out_of_range for a number beyond double's range), whose message says where. Callers that
// want one Result use parse_untrusted.
json parse_depth_limited(std::string_view text, bool& too_deep, int max_depth = k_max_json_depth);

// `text` as JSON within the limits above, or a bad_request error that names `what` and the
// problem: "request contains a NUL byte (at byte 12)", "event line nests deeper than 64 levels",
// "job.json is not valid JSON: syntax error while parsing value - invalid literal; last read: 'x'".
// `max_depth` is larger only for gpuqd's replies, which wrap values accepted at the usual depth.
Result<json> parse_untrusted(std::string_view text, std::string_view what, int max_depth = k_max_json_depth);

// A file in a directory a job can write, opened for reading as such a file must be: not through a
// symlink (O_NOFOLLOW), never waiting on a fifo put in its place (O_NONBLOCK, then fstat refuses
// anything but a regular file; the descriptor is blocking again once it is known to be one), and,
// with `owner`, only if that user owns it. Returns the descriptor (O_CLOEXEC), or not_found (missing),
// internal (there, but unreadable for now: permissions, I/O), bad_request (a symlink, or not a
// regular file) or forbidden (another user's), naming `what`.
Result<int> open_job_file(const std::string& path, std::string_view what, std::optional<uid_t> owner = std::nullopt);
// Such a file's text, up to `max_bytes` (a larger one is refused unread: too_large).
Result<std::string> read_job_file(const std::string& path, std::size_t max_bytes, std::string_view what,
                                  std::optional<uid_t> owner = std::nullopt);

// The file at `path`, read up to `max_bytes` (a larger one is refused unread) and parsed as above.
// A symlink or anything but a regular file in its place is refused: these files lie in job
// directories, which the job can write.
// A missing or unreadable file is not_found. With `owner`, a file that belongs to another user is
// refused too (forbidden): a root gpuqd reads only what the job's owner could have written, never
// a hard link to a file of root's.
Result<json> read_untrusted_file(const std::string& path, std::size_t max_bytes, std::string_view what,
                                 std::optional<uid_t> owner = std::nullopt);

}  // namespace gpuq::common
