// Strict reading of one JSON object's fields, shared by every spec parser: unknown fields are
// errors with a did-you-mean, wrong types and out-of-range values name the field (with its full
// path, e.g. `train.optimizer.lr`) and what was received. Problems are collected, not thrown, so
// a user sees all of them at once.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuq::common {

class FieldReader {
 public:
  // `who` prefixes every message (e.g. "job[2] (mnist)"); `path` prefixes field names (e.g.
  // "train.optimizer"). Unknown fields of `obj` are reported here.
  FieldReader(const nlohmann::json& obj, std::string who, std::string path, std::vector<std::string>& errors,
              const std::vector<std::string_view>& known);

  void fail(const std::string& message);
  std::string field(std::string_view key) const;  // the full dotted name, for messages
  const nlohmann::json* get(std::string_view key) const;

  // Each returns true when the field is present and valid (then `out` is set).
  bool integer(std::string_view key, long long lo, long long hi, long long& out);
  bool number(std::string_view key, double lo, double hi, double& out);
  bool string(std::string_view key, std::string& out);
  bool boolean(std::string_view key, bool& out);
  bool choice(std::string_view key, std::initializer_list<std::string_view> allowed, std::string& out);
  bool integers(std::string_view key, long long lo, long long hi, std::vector<int>& out);
  bool numbers(std::string_view key, double lo, double hi, std::vector<double>& out);
  // A nested object: returns it, or null (and an error when present but not an object).
  const nlohmann::json* object(std::string_view key);

  std::vector<std::string>& errors() { return m_errors; }
  const std::string& who() const { return m_who; }

 private:
  const nlohmann::json& m_obj;
  std::string m_who, m_path;
  std::vector<std::string>& m_errors;
};

std::string json_type_name(const nlohmann::json& v);  // "an integer", "a string", ...
std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace gpuq::common
