// Human output for the CLI: aligned tables and compact durations, values and progress.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/protocol.hpp"

namespace gpuq::cli {

// `text` as a terminal may show it: what a job or another user wrote (results, progress, reasons,
// log lines) can hold escape sequences that rewrite the screen, set the window title or plant
// input. C0 controls become \n, \r, \t or \xNN, DEL \x7f, C1 controls (U+0080-U+009F) and the
// bidirectional overrides that reorder a line (U+200E/F, U+202A-E, U+2066-9) \uNNNN, and bytes
// that are not UTF-8 \xNN. Every human line the CLI prints goes through it; --json output is
// exact (JSON escapes C0 itself) and `gpuq logs` prints the job's output as it is, as cat does.
std::string printable(std::string_view text);
// The length of the UTF-8 sequence at text[i] and its code point in `cp`, or 0 where none starts
// there (overlong forms, surrogates and values past U+10FFFF are none).
std::size_t utf8_decode(std::string_view text, std::size_t i, char32_t& cp);
// printable() line by line, the newlines kept: a message of several lines (a refusal listing its
// problems).
std::string printable_lines(std::string_view text);
// Job ids for a human: runs of consecutive ids as ranges ("1-3 7 9-12"), and past `max_parts`
// ranges the first few and a count ("1 3 5 ... (50,000 in all)"): a 100,000-job sweep is one
// short line, not 600 KB.
std::string id_ranges(const std::vector<std::int64_t>& ids, std::size_t max_parts = 12);

class Table {
 public:
  // Each cell, the header's too, is made printable().
  explicit Table(std::vector<std::string> header) { add(std::move(header)); }
  void add(std::vector<std::string> row);
  // The rows as lines with aligned columns, trailing blanks trimmed; every column but a row's
  // last is cut to `max_column` characters ("~" marks a cut).
  std::vector<std::string> lines(std::size_t max_column = std::string::npos) const;
  void print(std::ostream& out) const;
  std::size_t width() const;  // of the widest line

 private:
  std::vector<std::vector<std::string>> m_rows;
};

std::string format_duration(double seconds);              // 4s, 2m05s, 3h02m, 2d04h
using common::parse_duration;  // "90", "30m", "7d", … in seconds
// A whole string of decimal digits from `lo` to `hi` ("3"); nullopt otherwise ("3x", "-1", "").
std::optional<int> parse_int(const std::string& text, int lo, int hi);
std::string format_bytes(std::int64_t bytes);             // 512 B, 3.4 KiB, 12.0 MiB, 1.5 GiB
std::string format_value(const nlohmann::json& v);        // numbers to 4 significant digits
// What a person looks for first in results and progress: 0 quality metrics (accuracy, loss, …),
// 1 other numbers, 2 the rest (paths, names).
int field_rank(const std::string& key, const nlohmann::json& value);
std::string format_fields(const nlohmann::json& obj, std::size_t max_fields);  // "loss=0.41 epoch=2", metrics first
std::string format_gpus(const std::vector<int>& gpus);    // "0,1" or "-"
std::string format_time(double unix_seconds);             // local time, "2026-11-22 10:41:07"
// A job's try in its current run (since it was submitted or last restarted), of the tries its
// retries allow: "2/3".
std::string format_try(const common::JobInfo& j);
// The state as people read it: a queued job is "held" while held, "retrying" when queued again
// after a failed attempt of this run (not after a restart); other states as they are.
std::string display_state(const common::JobInfo& j);

}  // namespace gpuq::cli
