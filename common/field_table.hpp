// The machinery of the request field tables (protocol.cpp, the one includer): a request type's
// fields as rows, each with its type, bounds, default and the words of its refusal, from which
// its decoder (read_value: field-naming errors, bounds held), its encoder (what is not the
// default) and its JSON Schema (value_schema) are all made, so the three cannot disagree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/job_state.hpp"
#include "common/protocol.hpp"
#include "common/schema.hpp"

namespace gpuq::common {

namespace fields {

[[noreturn]] inline void bad(const std::string& field, const std::string& want) {
  throw RequestError(ErrorCode::bad_request, "field `" + field + "` must be " + want);
}
// The same for what a job spec refuses (the jobs, an update's values): invalid_spec.
[[noreturn]] inline void bad_spec(const std::string& field, const std::string& want) {
  throw RequestError(ErrorCode::invalid_spec, "field `" + field + "` must be " + want);
}

constexpr double k_inf = std::numeric_limits<double>::infinity();

// What a field may hold beyond its type: numbers within [min, max]; strings at most `max`
// characters (and, given, one of `one_of`); id lists each within [min, max].
struct Bounds {
  double min = -k_inf, max = k_inf;
  bool required = false;  // absent (or null) is an error, not the default
  std::vector<std::string> one_of = {};
};

}  // namespace fields

// A request type's fields (see protocol.hpp): rows read and written through type-erased
// accessors built by TableOf below, and the rules over several fields (`check`, after them all).
struct FieldTable {
  struct Row {
    std::string name;
    std::string want;  // "a positive job id": the error's words, and the schema's description
    bool required = false;
    json schema;                                                 // of the value: type, bounds, default, description
    std::function<void(const json& value, void* request)> read;  // checks, then stores; throws bad()
    std::function<void(const void* request, json& out)> write;   // where it is not the default
  };
  std::vector<Row> rows;
  std::function<void(void*)> check;  // may also normalise (ids each once)
  json rules;                        // what `check` refuses, as a schema (null: nothing)
};

namespace fields {

// `v` as an integer of type T: in range of T, not wrapped (`attempt: 4294967297` is not attempt 1).
// A whole number written with a fraction (`1.0`, `1e3`) is one, as JSON Schema counts it.
template <class T>
std::optional<T> integer_of(const json& v) {
  if (v.is_number_integer()) return detail::fits_integer<T>(v) ? std::optional<T>(v.get<T>()) : std::nullopt;
  if (!v.is_number_float()) return std::nullopt;
  const double d = v.get<double>();
  // T's range as doubles: its min exactly (a power of two), its max + 1 (the next power of two).
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  const double past = 2.0 * static_cast<double>(std::numeric_limits<T>::max() / 2 + 1);
  if (!(d >= lo && d < past) || d != std::trunc(d)) return std::nullopt;
  return static_cast<T>(d);
}

// The characters of UTF-8 text (the JSON parser has refused what is not UTF-8), as JSON Schema's
// maxLength counts them: each byte that does not continue a character.
inline std::size_t characters(const std::string& text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

template <class T>
void read_value(const json& v, T& out, const std::string& name, const std::string& want, const Bounds& b) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) bad(name, want);
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const auto x = integer_of<T>(v);
    if (!x || static_cast<double>(*x) < b.min || static_cast<double>(*x) > b.max) bad(name, want);
    out = *x;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) bad(name, want);
    const double x = v.get<double>();
    if (!(x >= b.min && x <= b.max)) bad(name, want);
    out = x;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) bad(name, want);
    const auto& text = v.get_ref<const std::string&>();
    // Strings reach C APIs (fnmatch, paths), which would cut them at a NUL byte.
    if (text.find('\0') != std::string::npos || static_cast<double>(characters(text)) > b.max) bad(name, want);
    if (!b.one_of.empty() && std::find(b.one_of.begin(), b.one_of.end(), text) == b.one_of.end()) bad(name, want);
    out = text;
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    if (!v.is_array()) bad(name, want);
    out.clear();
    for (const auto& x : v) {
      const auto id = integer_of<std::int64_t>(x);
      if (!id || static_cast<double>(*id) < b.min || static_cast<double>(*id) > b.max) bad(name, want);
      out.push_back(*id);
    }
  } else if constexpr (std::is_same_v<T, std::vector<JobState>>) {
    if (!v.is_array()) bad(name, want);
    out.clear();
    for (const auto& x : v) {
      const auto state = x.is_string() ? job_state_from_string(x.get_ref<const std::string&>()) : std::nullopt;
      if (!state) bad(name, want);
      out.push_back(*state);
    }
  } else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) {
    if (!v.is_object()) bad(name, want);
    out.clear();
    for (const auto& [k, x] : v.items()) {
      if (!x.is_string()) bad(name + "." + k, "a string");
      out[k] = x.template get<std::string>();
    }
  } else {
    static_assert(std::is_same_v<T, json>, "a request field of a type the table cannot read");
    out = v;
  }
}

// A bound as the schema writes it: 2000, not 2000.0.
inline json bound(double x) {
  if (x == std::trunc(x) && std::fabs(x) <= 9007199254740992.0) return static_cast<std::int64_t>(x);  // 2^53
  return x;
}

// The range an integer field of type T takes: its bounds, else T's own (what integer_of holds).
template <class T>
void integer_range(json& s, const Bounds& b) {
  s["type"] = "integer";
  s["minimum"] = b.min > -k_inf ? bound(b.min) : json(std::numeric_limits<T>::min());
  s["maximum"] = b.max < k_inf ? bound(b.max) : json(std::numeric_limits<T>::max());
}

// Built key by key into one object, never assigned over: clang 14 leaks the object a braced
// list is assigned over here (`s = {{"type", "string"}}` after `json s = json::object()`; the
// fuzzers' LeakSanitizer found it), which gcc does not.
template <class T>
json value_schema(const Bounds& b) {
  json s = json::object();  // any JSON value: {}
  if constexpr (std::is_same_v<T, bool>) {
    s["type"] = "boolean";
  } else if constexpr (std::is_integral_v<T>) {
    integer_range<T>(s, b);
  } else if constexpr (std::is_floating_point_v<T>) {
    s["type"] = "number";
    if (b.min > -k_inf) s["minimum"] = bound(b.min);
    if (b.max < k_inf) s["maximum"] = bound(b.max);
  } else if constexpr (std::is_same_v<T, std::string>) {
    s["type"] = "string";
    if (b.max < k_inf) s["maxLength"] = bound(b.max);
    if (!b.one_of.empty()) s["enum"] = b.one_of;
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    s["type"] = "array";
    integer_range<std::int64_t>(s["items"], b);
  } else if constexpr (std::is_same_v<T, std::vector<JobState>>) {
    s["type"] = "array";
    s["items"]["enum"] = schema::state_names();
  } else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) {
    s["type"] = "object";
    s["additionalProperties"]["type"] = "string";
  }
  return s;
}

// A field that may be left out may also be sent as null, which reads as left out.
inline void allow_null(json& s) {
  if (s.contains("type")) s["type"] = json::array({s["type"], "null"});
  if (s.contains("enum")) s["enum"].push_back(nullptr);
}

// The rows of request type R, each a field of R reached through `at` (a lambda R& -> T&).
template <class R>
class TableOf {
 public:
  template <class At>
  TableOf& field(std::string name, At at, std::string want, Bounds b = {}) {
    using T = std::remove_reference_t<std::invoke_result_t<At, R&>>;
    FieldTable::Row row;
    row.name = name;
    row.want = want;
    row.required = b.required;
    row.schema = value_schema<T>(b);
    if (!b.required) allow_null(row.schema);
    row.schema["description"] = want;
    R fallback{};
    if (!b.required) row.schema["default"] = json(at(fallback));
    row.read = [at, name, want, b](const json& v, void* r) { read_value(v, at(*static_cast<R*>(r)), name, want, b); };
    row.write = [at, name, required = b.required](const void* r, json& out) {
      R& request = *static_cast<R*>(const_cast<void*>(r));  // `at` only reads here
      R unset{};
      if (required || !(at(request) == at(unset))) out[name] = at(request);
    };
    m_table.rows.push_back(std::move(row));
    return *this;
  }
  // A field read and written by hand (a value of several shapes), with its schema.
  TableOf& custom(std::string name, std::string want, bool required, json schema,
                  std::function<void(const json&, R&)> read, std::function<void(const R&, json&)> write) {
    schema["description"] = want;
    m_table.rows.push_back({std::move(name), std::move(want), required, std::move(schema),
                            [read](const json& v, void* r) { read(v, *static_cast<R*>(r)); },
                            [write](const void* r, json& out) { write(*static_cast<const R*>(r), out); }});
    return *this;
  }
  // The rules over several fields, after each field is read; `says` is what they refuse, as a
  // schema the request must also match (null where they only normalise).
  TableOf& check(void (*rule)(R&), json says = nullptr) {
    m_table.check = [rule](void* r) { rule(*static_cast<R*>(r)); };
    m_table.rules = std::move(says);
    return *this;
  }
  FieldTable done() { return std::move(m_table); }

 private:
  FieldTable m_table;
};

}  // namespace fields

}  // namespace gpuq::common
