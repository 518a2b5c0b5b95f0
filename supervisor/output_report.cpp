#include "supervisor/output_report.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#ifdef GPUQ_HAVE_RE2
#include <re2/re2.h>
#include <re2/set.h>
#endif

namespace gpuq::supervisor {

using json = nlohmann::json;

namespace {
// Each pattern's compiled program, and the set of them all, may take this much memory.
constexpr std::int64_t k_pattern_memory = 256 << 10;
constexpr std::size_t k_max_groups = 16;          // named groups in one pattern
constexpr std::size_t k_max_capture_bytes = 256;  // of a captured text kept as a field
}  // namespace

json typed_capture(std::string_view text) {
  const std::string s(text);
  if (s.empty() || s.size() > 64 || std::isspace(static_cast<unsigned char>(s.front())) ||
      s.find('\0') != std::string::npos)
    return s;
  char* end = nullptr;
  errno = 0;
  const long long whole = std::strtoll(s.c_str(), &end, 10);
  if (*end == '\0' && errno == 0) return whole;
  errno = 0;
  const double number = std::strtod(s.c_str(), &end);
  // "nan", "inf" and hex floats read as numbers to strtod; a report's number is decimal.
  if (*end == '\0' && errno == 0 && std::isfinite(number) && s.find_first_of("xXnN") == std::string::npos)
    return number;
  return s;
}

#ifdef GPUQ_HAVE_RE2

bool have_patterns() {
  return true;
}

namespace {
RE2::Options pattern_options() {
  RE2::Options o;
  o.set_max_mem(k_pattern_memory);
  o.set_log_errors(false);
  return o;
}

// What is wrong with one pattern, compiled; "" when nothing is.
std::string problem_of(const RE2& re) {
  if (!re.ok()) {
    const auto& p = re.pattern();
    const auto angle = p.find("(?<");
    if (angle != std::string::npos && angle + 3 < p.size() && p[angle + 3] != '=' && p[angle + 3] != '!')
      return re.error() + " (this RE2 names a group (?P<name>...) only)";
    return re.error();
  }
  const auto& names = re.NamedCapturingGroups();
  if (names.empty()) return "it has no named group, so a match would report nothing: (?P<loss>[0-9.]+)";
  if (names.size() > k_max_groups || static_cast<std::size_t>(re.NumberOfCapturingGroups()) > 2 * k_max_groups)
    return "it has " + std::to_string(re.NumberOfCapturingGroups()) + " groups; a pattern may have " +
           std::to_string(k_max_groups) + " named ones (and as many unnamed)";
  if (names.count("type")) return "a group named `type` would be the event's type: name it otherwise";
  return "";
}
}  // namespace

std::vector<std::string> pattern_problems(const common::Report& report) {
  std::vector<std::string> out;
  RE2::Set set(pattern_options(), RE2::UNANCHORED);  // all of them at once, as the supervisor runs them
  for (const auto& [what, list] : {std::pair{"progress", &report.progress}, std::pair{"result", &report.result}})
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::string at = std::string("`report.") + what + "[" + std::to_string(i) + "]`";
      const RE2 re((*list)[i], pattern_options());
      std::string error;
      if (auto why = problem_of(re); !why.empty())
        out.push_back(at + " is not a pattern gpuq can use: " + why);
      else if (set.Add((*list)[i], &error) < 0)
        out.push_back(at + ": " + error);
    }
  if (out.empty() && !(report.progress.empty() && report.result.empty()) && !set.Compile())
    out.push_back("`report`'s patterns together take more memory than a job's may: fewer or simpler ones");
  return out;
}

struct OutputReport::Compiled {
  Compiled() : set(pattern_options(), RE2::UNANCHORED) {}
  RE2::Set set;
  std::vector<std::unique_ptr<RE2>> patterns;  // in the set's order: progress, then result
  std::size_t progress = 0;                    // how many of them are progress patterns
};

Result<std::unique_ptr<OutputReport>> OutputReport::make(const common::Report& report) {
  if (auto problems = pattern_problems(report); !problems.empty())
    return Error{ErrorCode::invalid_spec, problems.front()};
  std::unique_ptr<OutputReport> out(new OutputReport());
  out->m_compiled = std::make_unique<Compiled>();
  auto& c = *out->m_compiled;
  for (const auto* list : {&report.progress, &report.result})
    for (const auto& p : *list) {
      std::string error;
      if (c.set.Add(p, &error) < 0) return Error{ErrorCode::invalid_spec, "a report pattern: " + error};
      c.patterns.push_back(std::make_unique<RE2>(p, pattern_options()));
    }
  c.progress = report.progress.size();
  if (!c.patterns.empty() && !c.set.Compile())
    return Error{ErrorCode::invalid_spec, "the report's patterns together take more memory than a job's may"};
  return out;
}

void OutputReport::line(std::string_view text, std::vector<json>& events) {
  ++m_lines;
  auto& c = *m_compiled;
  if (c.patterns.empty()) return;
  std::vector<int> matched;
  if (!c.set.Match(re2::StringPiece(text.data(), text.size()), &matched)) return;
  json progress = json::object(), result = json::object();
  std::vector<re2::StringPiece> groups;
  std::sort(matched.begin(), matched.end());
  for (int i : matched) {
    const RE2& re = *c.patterns[static_cast<std::size_t>(i)];
    groups.assign(static_cast<std::size_t>(re.NumberOfCapturingGroups()) + 1, re2::StringPiece());
    if (!re.Match(re2::StringPiece(text.data(), text.size()), 0, text.size(), RE2::UNANCHORED, groups.data(),
                  static_cast<int>(groups.size())))
      continue;
    json& into = static_cast<std::size_t>(i) < c.progress ? progress : result;
    for (const auto& [name, at] : re.NamedCapturingGroups()) {
      const auto& g = groups[static_cast<std::size_t>(at)];
      if (g.data() == nullptr) continue;  // an optional group that took no part
      into[name] = typed_capture(std::string_view(g.data(), std::min(g.size(), k_max_capture_bytes)));
    }
  }
  // gpuqd merges each result event into the job's result, so a field caught later replaces it.
  for (const auto& [event, type] : {std::pair{&progress, "progress"}, std::pair{&result, "result"}})
    if (!event->empty()) {
      (*event)["type"] = type;
      events.push_back(std::move(*event));
    }
}

#else  // without RE2: no patterns

bool have_patterns() {
  return false;
}

std::vector<std::string> pattern_problems(const common::Report& report) {
  if (report.progress.empty() && report.result.empty()) return {};
  return {
      "`report` patterns need RE2, which this gpuq was built without (install libre2-dev and rebuild); "
      "a `report.file` alone works"};
}

struct OutputReport::Compiled {};

Result<std::unique_ptr<OutputReport>> OutputReport::make(const common::Report& report) {
  if (auto problems = pattern_problems(report); !problems.empty())
    return Error{ErrorCode::invalid_spec, problems.front()};
  std::unique_ptr<OutputReport> out(new OutputReport());
  out->m_compiled = std::make_unique<Compiled>();
  return out;
}

void OutputReport::line(std::string_view, std::vector<json>&) {
  ++m_lines;
}

#endif

OutputReport::OutputReport() = default;
OutputReport::~OutputReport() = default;

void OutputReport::feed(const char* data, std::size_t n, std::vector<json>& events) {
  const char* end = data + n;
  while (data < end) {
    const char* stop = data;
    while (stop < end && *stop != '\n' && *stop != '\r')
      ++stop;
    if (!m_partial_cut) {
      const std::size_t room = k_max_line - m_partial.size();
      const std::size_t take = std::min(room, static_cast<std::size_t>(stop - data));
      m_partial.append(data, take);
      m_partial_cut = take < static_cast<std::size_t>(stop - data);
    }
    if (stop == end) return;                          // the line goes on in the next output
    if (!m_partial.empty()) line(m_partial, events);  // an empty line reports nothing ("\r\n" is one end)
    m_partial.clear();
    m_partial_cut = false;
    data = stop + 1;
  }
}

void OutputReport::finish(std::vector<json>& events) {
  if (!m_partial.empty()) line(m_partial, events);
  m_partial.clear();
  m_partial_cut = false;
}

}  // namespace gpuq::supervisor
