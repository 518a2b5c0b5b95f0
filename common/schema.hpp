// The JSON Schema of a reply type, written from the list GPUQ_JSON_TYPE keeps of its fields
// (gpuq_describe): each field's C++ type gives its JSON type, a record type becomes a $ref to its
// own schema under $defs, and each field's default is said (a missing field takes it, so an older
// gpuqd's reply reads). protocol.cpp's protocol_schema() puts these beside the request schemas the
// field tables write. Included only where a schema is written.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/protocol.hpp"

namespace gpuq::common::schema {

namespace detail {
template <class T>
struct is_map : std::false_type {};
template <class V>
struct is_map<std::map<std::string, V>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
}  // namespace detail

// The names of the job states, as the protocol writes them.
inline json state_names() {
  json names = json::array();
  for (JobState s : k_job_states)
    names.push_back(std::string(to_string(s)));
  return names;
}

template <class T>
json of(json& defs);

// What gpuq_describe writes to: the record's name and its fields.
class Writer {
 public:
  explicit Writer(json& defs) : m_defs(defs) {}
  void name(const char* n) { m_name = n; }
  const std::string& name() const { return m_name; }
  template <class T>
  void field(const char* field, const T& fallback) {
    json s = of<T>(m_defs);
    if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string> || std::is_same_v<T, JobState> ||
                  std::is_same_v<T, json> || common::detail::is_vector<T>::value || detail::is_map<T>::value)
      s["default"] = json(fallback);
    m_fields[field] = std::move(s);
  }
  json object() const { return {{"type", "object"}, {"properties", m_fields}}; }

 private:
  json& m_defs;
  std::string m_name;
  json m_fields = json::object();
};

// The schema of a value of type T; records are written once into `defs` and referred to.
template <class T>
json of(json& defs) {
  if constexpr (std::is_same_v<T, bool>) {
    return {{"type", "boolean"}};
  } else if constexpr (std::is_integral_v<T>) {
    return {{"type", "integer"}};
  } else if constexpr (std::is_floating_point_v<T>) {
    return {{"type", "number"}};
  } else if constexpr (std::is_same_v<T, std::string>) {
    return {{"type", "string"}};
  } else if constexpr (std::is_same_v<T, JobState>) {
    return {{"enum", state_names()}};
  } else if constexpr (std::is_same_v<T, json>) {
    return json::object();  // any JSON value: what a job wrote, or null
  } else if constexpr (common::detail::is_vector<T>::value) {
    return {{"type", "array"}, {"items", of<typename T::value_type>(defs)}};
  } else if constexpr (detail::is_map<T>::value) {
    return {{"type", "object"}, {"additionalProperties", of<typename T::mapped_type>(defs)}};
  } else if constexpr (detail::is_optional<T>::value) {
    return of<typename T::value_type>(defs);  // present or left out
  } else {
    Writer w(defs);
    gpuq_describe(w, static_cast<const T*>(nullptr));
    if (!defs.contains(w.name())) defs[w.name()] = w.object();
    return {{"$ref", "#/$defs/" + w.name()}};
  }
}

}  // namespace gpuq::common::schema
