// Table and value formatting for human output.
#include "cli/format.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <stdexcept>

namespace gpuq::cli {

// The length of the UTF-8 sequence at s[i] and its code point, or 0 where it is not one
// (overlong forms, surrogates and values past U+10FFFF are not).
std::size_t utf8_decode(std::string_view s, std::size_t i, char32_t& cp) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  static constexpr char32_t k_min[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < k_min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

namespace {

bool reorders_text(char32_t cp) {
  return cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const std::size_t n = utf8_decode(text, i, cp);
    if (n == 0) {  // not UTF-8: the byte, escaped
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(text[i]));
      out += buf;
      ++i;
      continue;
    }
    if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (cp < 0x20 || cp == 0x7F) std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp)), out += buf;
    else if ((cp >= 0x80 && cp <= 0x9F) || reorders_text(cp))
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp)), out += buf;
    else out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

std::string printable_lines(std::string_view text) {
  std::string out;
  for (std::size_t begin = 0;;) {
    const std::size_t nl = text.find('\n', begin);
    out += printable(text.substr(begin, nl == std::string_view::npos ? std::string_view::npos : nl - begin));
    if (nl == std::string_view::npos) return out;
    out += '\n';
    begin = nl + 1;
  }
}

void Table::add(std::vector<std::string> row) {
  for (auto& cell : row) cell = printable(cell);
  m_rows.push_back(std::move(row));
}

std::vector<std::string> Table::lines(std::size_t max_column) const {
  std::vector<std::size_t> width;
  for (const auto& row : m_rows)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      const bool last = c + 1 == row.size();
      width[c] = std::max(width[c], last ? row[c].size() : std::min(row[c].size(), std::max<std::size_t>(max_column, 2)));
    }
  std::vector<std::string> out;
  for (const auto& row : m_rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (c + 1 == row.size()) {
        line += row[c];
      } else {
        std::string cell = row[c].size() > width[c] ? row[c].substr(0, width[c] - 1) + "~" : row[c];
        line += cell + std::string(width[c] - cell.size() + 2, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out.push_back(std::move(line));
  }
  return out;
}

void Table::print(std::ostream& out) const {
  for (const auto& l : lines()) out << l << "\n";
}

std::size_t Table::width() const {
  std::size_t w = 0;
  for (const auto& l : lines()) w = std::max(w, l.size());
  return w;
}

std::string format_duration(double s) {
  if (s < 0) s = 0;
  long long t = static_cast<long long>(s);
  char buf[32];
  if (t < 60) std::snprintf(buf, sizeof(buf), "%llds", t);
  else if (t < 3600) std::snprintf(buf, sizeof(buf), "%lldm%02llds", t / 60, t % 60);
  else if (t < 86400) std::snprintf(buf, sizeof(buf), "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  else std::snprintf(buf, sizeof(buf), "%lldd%02lldh", t / 86400, (t % 86400) / 3600);
  return buf;
}

std::string format_value(const nlohmann::json& v) {
  if (v.is_number_float()) {
    double d = v.get<double>();
    char buf[32];
    if (d != 0 && (std::fabs(d) < 1e-3 || std::fabs(d) >= 1e12)) std::snprintf(buf, sizeof(buf), "%.3e", d);
    else if (std::fabs(d) >= 1e4) std::snprintf(buf, sizeof(buf), "%.0f", d);  // 16070, not 1.607e+04
    else std::snprintf(buf, sizeof(buf), "%.4g", d);
    return buf;
  }
  if (v.is_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + format_value(v[i]);
    return out + "]";
  }
  if (v.is_string()) return printable(v.get<std::string>());
  if (v.is_null()) return "-";
  return v.dump();
}

int field_rank(const std::string& key, const nlohmann::json& value) {
  for (const char* m : {"acc", "loss", "score", "f1", "error", "perplexity"})
    if (key.find(m) != std::string::npos) return 0;
  return value.is_number() ? 1 : 2;
}

std::string format_fields(const nlohmann::json& obj, std::size_t max_fields) {
  if (!obj.is_object()) return "";
  std::vector<std::pair<int, std::string>> shown;
  for (const auto& [k, v] : obj.items())
    if (k != "rank" && k != "at" && k != "type" && !v.is_object() && !v.is_array()) shown.push_back({field_rank(k, v), k});
  std::stable_sort(shown.begin(), shown.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (std::size_t n = 0; n < shown.size(); ++n) {
    if (n == max_fields) {
      out += " ...";
      break;
    }
    out += (out.empty() ? "" : " ") + printable(shown[n].second) + "=" + format_value(obj[shown[n].second]);
  }
  return out;
}

std::optional<int> parse_int(const std::string& text, int lo, int hi) {
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < lo || n > hi) return std::nullopt;
  return n;
}

std::string format_bytes(std::int64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  return buf;
}

std::string format_gpus(const std::vector<int>& gpus) {
  if (gpus.empty()) return "-";
  std::string out;
  for (std::size_t i = 0; i < gpus.size(); ++i) out += (i ? "," : "") + std::to_string(gpus[i]);
  return out;
}

std::string format_try(const common::JobInfo& j) {
  return std::to_string(j.attempt - j.attempt_base) + "/" + std::to_string(j.retries + 1);
}

std::string display_state(const common::JobInfo& j) {
  if (j.state == JobState::queued && j.held) return "held";
  if (j.state == JobState::queued && !j.preempted_by.empty()) return "preempted";
  if (j.state == JobState::running && j.preempting) return "preempting";
  if (j.state == JobState::running && !j.suspended_for.empty()) return "suspended";
  if (j.state == JobState::queued && j.attempt > j.attempt_base) return "retrying";
  return name_of(j.state);
}

std::string format_time(double t) {
  if (t <= 0) return "-";
  std::time_t secs = static_cast<std::time_t>(t);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string id_ranges(const std::vector<std::int64_t>& ids, std::size_t max_parts) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ids[i]) : std::to_string(ids[i]) + "-" + std::to_string(ids[j]));
    i = j + 1;
  }
  std::string out;
  for (std::size_t k = 0; k < parts.size() && k < max_parts; ++k) out += (k ? " " : "") + parts[k];
  if (parts.size() > max_parts) out += " ... (" + std::to_string(ids.size()) + " in all)";
  return out;
}

}  // namespace gpuq::cli
