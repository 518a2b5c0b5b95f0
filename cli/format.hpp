// Human output for the CLI: aligned tables and compact durations, values and progress.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/protocol.hpp"

namespace gpuq::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : m_rows{std::move(header)} {}
  void add(std::vector<std::string> row) { m_rows.push_back(std::move(row)); }
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
