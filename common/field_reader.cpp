// Strict JSON field reading with messages that name the field (see field_reader.hpp).
#include "common/field_reader.hpp"

#include <algorithm>
#include <cstdio>

namespace gpuq::common {

using json = nlohmann::json;

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string json_type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

namespace {
std::string show(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}
}  // namespace

FieldReader::FieldReader(const json& obj, std::string who, std::string path, std::vector<std::string>& errors,
                         const std::vector<std::string_view>& known)
    : m_obj(obj), m_who(std::move(who)), m_path(std::move(path)), m_errors(errors) {
  if (!obj.is_object()) return;
  for (const auto& [key, _] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string_view best;
    std::size_t best_d = 3;
    for (auto f : known) {
      std::size_t d = edit_distance(key, f);
      if (d < best_d) best_d = d, best = f;
    }
    std::string msg = "unknown field `" + field(key.substr(0, 64)) + "`";
    if (!best.empty()) msg += " (did you mean `" + field(best) + "`?)";
    fail(msg);
  }
}

void FieldReader::fail(const std::string& message) { m_errors.push_back(m_who + ": " + message); }

std::string FieldReader::field(std::string_view key) const {
  return m_path.empty() ? std::string(key) : m_path + "." + std::string(key);
}

const json* FieldReader::get(std::string_view key) const {
  if (!m_obj.is_object()) return nullptr;
  auto it = m_obj.find(key);
  return it == m_obj.end() ? nullptr : &*it;
}

bool FieldReader::integer(std::string_view key, long long lo, long long hi, long long& out) {
  const json* v = get(key);
  if (!v) return false;
  if (!v->is_number_integer()) {
    fail("field `" + field(key) + "` must be an integer, got " + json_type_name(*v));
    return false;
  }
  long long x = v->get<long long>();
  if (x < lo || x > hi) {
    fail("field `" + field(key) + "` must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
         ", got " + std::to_string(x));
    return false;
  }
  out = x;
  return true;
}

bool FieldReader::number(std::string_view key, double lo, double hi, double& out) {
  const json* v = get(key);
  if (!v) return false;
  if (!v->is_number()) {
    fail("field `" + field(key) + "` must be a number, got " + json_type_name(*v));
    return false;
  }
  double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    fail("field `" + field(key) + "` must be between " + show(lo) + " and " + show(hi) + ", got " + show(x));
    return false;
  }
  out = x;
  return true;
}

bool FieldReader::string(std::string_view key, std::string& out) {
  const json* v = get(key);
  if (!v) return false;
  if (!v->is_string()) {
    fail("field `" + field(key) + "` must be a string, got " + json_type_name(*v));
    return false;
  }
  out = v->get<std::string>();
  return true;
}

bool FieldReader::boolean(std::string_view key, bool& out) {
  const json* v = get(key);
  if (!v) return false;
  if (!v->is_boolean()) {
    fail("field `" + field(key) + "` must be true or false, got " + json_type_name(*v));
    return false;
  }
  out = v->get<bool>();
  return true;
}

bool FieldReader::choice(std::string_view key, std::initializer_list<std::string_view> allowed, std::string& out) {
  std::string s;
  if (!string(key, s)) return false;
  if (std::find(allowed.begin(), allowed.end(), s) != allowed.end()) {
    out = s;
    return true;
  }
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "\"" : ", \"") + std::string(a) + "\"";
  fail("field `" + field(key) + "` must be one of " + list + ", got \"" + s.substr(0, 32) + "\"");
  return false;
}

bool FieldReader::integers(std::string_view key, long long lo, long long hi, std::vector<int>& out) {
  const json* v = get(key);
  if (!v) return false;
  bool ok = v->is_array();
  for (std::size_t i = 0; ok && i < v->size(); ++i)
    ok = (*v)[i].is_number_integer() && (*v)[i].get<long long>() >= lo && (*v)[i].get<long long>() <= hi;
  if (!ok) {
    fail("field `" + field(key) + "` must be an array of integers between " + std::to_string(lo) + " and " +
         std::to_string(hi) + ", got " + v->dump().substr(0, 64));
    return false;
  }
  out = v->get<std::vector<int>>();
  return true;
}

bool FieldReader::numbers(std::string_view key, double lo, double hi, std::vector<double>& out) {
  const json* v = get(key);
  if (!v) return false;
  bool ok = v->is_array();
  for (std::size_t i = 0; ok && i < v->size(); ++i)
    ok = (*v)[i].is_number() && (*v)[i].get<double>() >= lo && (*v)[i].get<double>() <= hi;
  if (!ok) {
    fail("field `" + field(key) + "` must be an array of numbers between " + show(lo) + " and " + show(hi) +
         ", got " + v->dump().substr(0, 64));
    return false;
  }
  out = v->get<std::vector<double>>();
  return true;
}

const json* FieldReader::object(std::string_view key) {
  const json* v = get(key);
  if (!v) return nullptr;
  if (!v->is_object()) {
    fail("field `" + field(key) + "` must be an object, got " + json_type_name(*v));
    return nullptr;
  }
  return v;
}

}  // namespace gpuq::common
