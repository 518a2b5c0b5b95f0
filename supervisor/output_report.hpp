// Progress and results from a program that does not write $GPUQ_EVENTS (a spec's `report`,
// common/spec.hpp): its supervisor reads the chosen rank's output lines through the job's
// patterns and writes what their named groups catch as events, as the program would have.
//
// The patterns run with the supervisor's privileges (root in lab mode) over whatever the job
// prints, so they are RE2's (linear in the line, no backreferences, memory bounded when compiled)
// and the work a line costs is bounded: at most k_max_line bytes of it are looked at, by one pass
// of all of a job's patterns at once (RE2::Set), and only the patterns that matched run again to
// take their groups. A line ends at '\n' or '\r' (a progress bar redrawn in place is a line each
// time). Built without RE2 (libre2-dev), a job with patterns is refused when submitted.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/spec.hpp"

namespace gpuq::supervisor {

// Whether this build reads patterns at all.
bool have_patterns();

// What is wrong with a job's patterns (each names its field: `report.result[1]: ...`); empty when
// they compile and each has a named group.
std::vector<std::string> pattern_problems(const common::Report& report);

// A captured group's text as an event's value: a number where the whole text is one (finite),
// else the text.
nlohmann::json typed_capture(std::string_view text);

class OutputReport {
 public:
  static constexpr std::size_t k_max_line = 4096;

  // Compiled patterns, or the first problem.
  static Result<std::unique_ptr<OutputReport>> make(const common::Report& report);
  ~OutputReport();
  OutputReport(const OutputReport&) = delete;
  OutputReport& operator=(const OutputReport&) = delete;

  // Feeds output as it comes; the events its complete lines make are appended to `events`
  // (objects with "type": "progress" or "result", and the fields the line's matches caught).
  void feed(const char* data, std::size_t n, std::vector<nlohmann::json>& events);
  // The last line, if the output did not end with one.
  void finish(std::vector<nlohmann::json>& events);
  std::size_t lines() const { return m_lines; }

 private:
  struct Compiled;
  OutputReport();
  void line(std::string_view text, std::vector<nlohmann::json>& events);

  std::unique_ptr<Compiled> m_compiled;
  std::string m_partial;       // the line so far (at most k_max_line bytes of it)
  bool m_partial_cut = false;  // past k_max_line: the rest of the line is not kept
  std::size_t m_lines = 0;
};

}  // namespace gpuq::supervisor
