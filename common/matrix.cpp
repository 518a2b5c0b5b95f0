// Job matrices (see matrix.hpp).
#include "common/matrix.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "common/field_reader.hpp"
#include "common/spec.hpp"

namespace gpuq::common {

namespace {

using json = nlohmann::json;

constexpr std::size_t k_max_values = 10000;                // per key
constexpr std::size_t k_max_expanded_bytes = 16ULL << 20;  // per matrix job, its jobs' specs as JSON

bool is_key(const std::string& k) {
  if (k.empty() || k.size() > 64 || std::isdigit(static_cast<unsigned char>(k[0]))) return false;
  for (unsigned char c : k)
    if (!std::isalnum(c) && c != '_') return false;
  return true;
}

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// One job's values, and which keys its strings used.
struct Values {
  std::map<std::string, json> of;
  std::set<std::string>& used;

  const json* find(const std::string& key) {
    const auto it = of.find(key);
    if (it == of.end()) return nullptr;
    used.insert(key);
    return &it->second;
  }

  json substitute(const std::string& s, bool typed) {
    if (typed && s.size() > 2 && s.front() == '{' && s.back() == '}' && s.find('{', 1) == std::string::npos)
      if (const json* v = find(s.substr(1, s.size() - 2))) return *v;  // typed: "{lr}" -> 0.1
    std::string out;
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t close = s[i] == '{' && (i == 0 || s[i - 1] != '$') ? s.find('}', i) : std::string::npos;
      if (close != std::string::npos)
        if (const json* v = find(s.substr(i + 1, close - i - 1))) {
          out += text_of(*v);
          i = close + 1;
          continue;
        }
      out += s[i++];
    }
    return out;
  }

  json walk(const json& v, bool typed) {
    if (v.is_string()) return substitute(v.get<std::string>(), typed);
    if (v.is_array()) {
      json out = json::array();
      for (const auto& e : v) out.push_back(walk(e, typed));
      return out;
    }
    if (v.is_object()) {
      json out = json::object();
      for (const auto& [k, e] : v.items()) out[k] = walk(e, typed);
      return out;
    }
    return v;
  }

  // A job: fields made of strings get the values' text; the others (train, gpus, priority, …)
  // get a value itself where a string is only its placeholder.
  json walk_job(const json& job) {
    json out = json::object();
    for (const auto& [k, v] : job.items()) {
      const bool text = k == "name" || k == "command" || k == "shell" || k == "env" || k == "labels" ||
                        k == "cwd" || k == "after";
      out[k] = walk(v, !text);
    }
    return out;
  }
};

// A value as part of a job name: letters, digits, '-', '_' and '.' kept, anything else '_'; a
// list's items joined by 'x' ([256, 128] -> "256x128").
std::string name_part(const json& v) {
  if (v.is_array()) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "" : "x") + name_part(e);
    return s;
  }
  std::string s = text_of(v);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return s;
}

// Checks a job's `matrix` and fills `out` with its keys and values; returns how many jobs it
// makes, or 0 after reporting why it is wrong.
std::size_t read_matrix(const json& m, const std::string& who, std::size_t max_jobs, std::vector<std::string>& errors,
                        std::vector<std::pair<std::string, std::vector<json>>>& out) {
  if (!m.is_object() || m.empty()) {
    errors.push_back(who + ": field `matrix` must be an object of value lists, e.g. {\"lr\": [0.1, 0.3]}, got " +
                     json_type_name(m));
    return 0;
  }
  std::size_t product = 1;
  bool ok = true;
  for (const auto& [key, values] : m.items()) {
    const std::string field = "field `matrix." + key.substr(0, 64) + "`";
    if (!is_key(key)) {
      errors.push_back(who + ": " + field + ": a matrix key is 1-64 letters, digits and '_', not starting with a digit");
      ok = false;
      continue;
    }
    if (!values.is_array() || values.empty() || values.size() > k_max_values) {
      errors.push_back(who + ": " + field + " must be a list of 1-" + std::to_string(k_max_values) + " values, got " +
                       (values.is_array() ? std::to_string(values.size()) + " values" : json_type_name(values)));
      ok = false;
      continue;
    }
    for (const auto& v : values)
      if (v.is_null() || v.is_object()) {
        errors.push_back(who + ": " + field + " values must be strings, numbers, booleans or lists of them, got " +
                         json_type_name(v));
        ok = false;
        break;
      }
    product = std::min(product * values.size(), max_jobs + 1);
    out.emplace_back(key, std::vector<json>(values.begin(), values.end()));
  }
  if (ok && product > max_jobs) {
    errors.push_back(who + ": field `matrix` makes more than " + std::to_string(max_jobs) + " jobs");
    ok = false;
  }
  return ok ? product : 0;
}

}  // namespace

Result<json> expand_matrices(const json& doc, std::size_t max_jobs) {
  if (!doc.is_object() && !doc.is_array()) return doc;  // parse_batch says what is wrong
  const json in = doc.is_object() ? json::array({doc}) : doc;
  bool any = false;
  for (const auto& j : in) any = any || (j.is_object() && j.contains("matrix"));
  if (!any) return doc;

  std::vector<std::string> errors;
  json out = json::array();
  std::map<std::string, std::vector<std::string>> names_of;  // a matrix job's name -> its jobs' names
  for (std::size_t i = 0; i < in.size(); ++i) {
    const json& job = in[i];
    if (!job.is_object() || !job.contains("matrix")) {
      out.push_back(job);
      continue;
    }
    const auto name_it = job.find("name");
    const std::string base = name_it != job.end() && name_it->is_string() ? name_it->get<std::string>() : "";
    const std::string who = "job[" + std::to_string(i) + "]" + (base.empty() ? "" : " (" + base.substr(0, 64) + ")");
    std::vector<std::pair<std::string, std::vector<json>>> keys;
    const std::size_t product = read_matrix(job["matrix"], who, max_jobs, errors, keys);
    if (product == 0) continue;

    json body = job;
    body.erase("matrix");
    const json comment = body.contains("comment") ? body["comment"] : json();
    body.erase("comment");  // free text: never substituted
    // A small request must not expand into gigabytes: bound what the jobs add up to.
    const std::size_t bytes = (body.dump().size() + (comment.is_null() ? 0 : comment.dump().size())) * product;
    if (bytes > k_max_expanded_bytes) {
      errors.push_back(who + ": field `matrix` makes " + std::to_string(product) + " jobs of " +
                       std::to_string(bytes / product) + " bytes each, over " +
                       std::to_string(k_max_expanded_bytes >> 20) + " MiB of specs in all");
      continue;
    }
    std::set<std::string> used;
    std::vector<std::size_t> at(keys.size(), 0);
    for (bool more = true; more;) {
      Values values{{}, used};
      std::string suffix;
      for (std::size_t k = 0; k < keys.size(); ++k) {
        const json& v = keys[k].second[at[k]];
        values.of[keys[k].first] = v;
        suffix += "-" + name_part(v);
      }
      json one = values.walk_job(body);
      if (!base.empty() && one["name"] == base) one["name"] = base + suffix;  // no placeholder in it
      if (!one.contains("labels")) one["labels"] = json::object();
      if (one["labels"].is_object())
        for (const auto& [key, v] : values.of)
          if (!one["labels"].contains(key))  // as typed ("lr": 0.3); a list or an object as its text
            one["labels"][key] = v.is_primitive() && !v.is_null() ? v : json(text_of(v));
      if (!comment.is_null()) one["comment"] = comment;
      if (!base.empty() && one["name"].is_string()) names_of[base].push_back(one["name"].get<std::string>());
      out.push_back(std::move(one));
      if (out.size() > max_jobs)
        return invalid_spec_error({"the batch makes more than " + std::to_string(max_jobs) + " jobs"});
      // The next combination: the last key varies fastest.
      more = false;
      for (std::size_t k = keys.size(); k-- > 0;) {
        if (++at[k] < keys[k].second.size()) {
          more = true;
          break;
        }
        at[k] = 0;
      }
    }
    for (const auto& [key, _] : keys)
      if (!used.count(key))
        errors.push_back(who + ": field `matrix." + key + "` is used nowhere: put {" + key +
                         "} in a string of the spec (command, shell, env, train, name)");
  }
  if (!errors.empty()) return invalid_spec_error(errors);

  // `after` naming a matrix job: all of its jobs.
  for (auto& job : out) {
    if (!job.is_object() || !job.contains("after") || !job["after"].is_array()) continue;
    json after = json::array();
    for (const auto& d : job["after"]) {
      const auto it = d.is_string() ? names_of.find(d.get<std::string>()) : names_of.end();
      if (it == names_of.end()) {
        after.push_back(d);
        continue;
      }
      for (const auto& n : it->second) after.push_back(n);
    }
    job["after"] = std::move(after);
  }
  return out;
}

}  // namespace gpuq::common
