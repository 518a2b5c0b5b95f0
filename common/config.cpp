// Configuration file and environment defaults; see config.hpp.
#include "common/config.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "common/protocol.hpp"

namespace gpuq::common {

using json = nlohmann::json;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

Error bad(const std::string& origin, const std::string& what) { return {ErrorCode::bad_request, origin + ": " + what}; }

// "~/x" -> $HOME/x; other paths must be absolute (a daemon's working directory is not the user's).
std::optional<std::string> path_value(const std::string& v) {
  if (v.rfind("~/", 0) == 0 && !env("HOME").empty()) return env("HOME") + v.substr(1);
  if (!v.empty() && v[0] == '/') return v;
  return std::nullopt;
}

// Numbers from JSON or from an environment variable's text, with the same range checks.
template <class T>
std::optional<T> in_range(double v, double lo, double hi) {
  if (!std::isfinite(v) || v < lo || v > hi) return std::nullopt;
  if (std::is_integral_v<T> && v != std::floor(v)) return std::nullopt;
  return static_cast<T>(v);
}

using Member = std::variant<std::optional<std::string> Settings::*, std::optional<std::int64_t> Settings::*,
                            std::optional<int> Settings::*, std::optional<double> Settings::*,
                            std::optional<bool> Settings::*, std::optional<SlurmOptions> Settings::*,
                            std::optional<std::vector<std::string>> Settings::*,
                            std::optional<std::map<std::string, UserLimit>> Settings::*>;

// Every key: the one list that parsing, the environment, the known-keys message, `gpuq config`
// and gpuqd's --help are made from.
struct Rule {
  const char* key;
  const char* variable;  // nullptr: file only
  const char* kind;      // how the value is checked: "path", "text", "int", "number", or a key of its own
  double lo, hi;         // "int" and "number"
  Member member;         // where it lands in Settings
};
const Rule k_rules[] = {
    {"socket", "GPUQ_SOCKET", "path", 0, 0, &Settings::socket},
    {"state_dir", "GPUQ_STATE_DIR", "path", 0, 0, &Settings::state_dir},
    {"gpus", "GPUQ_GPUS", "text", 0, 0, &Settings::gpus},
    {"log_limit_mb", "GPUQ_LOG_LIMIT_MB", "int", 0, 1 << 30, &Settings::log_limit_mb},
    {"retries", "GPUQ_RETRIES", "int", 0, 100, &Settings::retries},
    {"grace_s", nullptr, "number", 0, 86400, &Settings::grace_s},
    {"retry_backoff_s", nullptr, "number", 0, 86400, &Settings::retry_backoff_s},
    {"idle_timeout_s", nullptr, "number", 0.1, 86400 * 7, &Settings::idle_timeout_s},
    {"cpu_slots", nullptr, "int", 1, 1 << 20, &Settings::cpu_slots},
    {"health_interval_s", nullptr, "number", 0, 86400, &Settings::health_interval_s},
    {"forget_after_s", nullptr, "number", 0, 86400 * 3660, &Settings::forget_after_s},
    {"gpu_process_interval_s", nullptr, "number", 0, 86400, &Settings::gpu_process_interval_s},
    {"reconnect_s", "GPUQ_RECONNECT_S", "number", 0, 86400, &Settings::reconnect_s},
    {"reply_timeout_s", "GPUQ_REPLY_TIMEOUT_S", "number", 0, 86400 * 7, &Settings::reply_timeout_s},
    {"executor", nullptr, "executor", 0, 0, &Settings::executor},
    {"slurm", nullptr, "slurm", 0, 0, &Settings::slurm},
    {"multi_user", nullptr, "bool", 0, 0, &Settings::multi_user},
    {"admin_group", nullptr, "text", 0, 0, &Settings::admin_group},
    {"socket_group", nullptr, "text", 0, 0, &Settings::socket_group},
    {"metrics_listen", nullptr, "text", 0, 0, &Settings::metrics_listen},
    {"metrics_textfile", nullptr, "path", 0, 0, &Settings::metrics_textfile},
    {"user_limits", nullptr, "user_limits", 0, 0, &Settings::user_limits},
    {"usage_half_life_s", nullptr, "number", 60, 86400 * 366, &Settings::usage_half_life_s},
    {"max_priority", nullptr, "int", -1000000, 1000000, &Settings::max_priority},
    {"hang_after_s", nullptr, "number", 0, 86400 * 30, &Settings::hang_after_s},
    {"hang_action", nullptr, "hang_action", 0, 0, &Settings::hang_action},
    {"on_finish", nullptr, "argv", 0, 0, &Settings::on_finish},
    {"hook_timeout_s", nullptr, "number", 1, 86400, &Settings::hook_timeout_s},
};

// Stores `value` where the rule says; an integer is narrowed to the member's width (the rule's
// range has been checked).
template <class T>
void store(Settings& s, const Rule& r, T value) {
  std::visit(
      [&](auto member) {
        using Field = typename std::remove_reference_t<decltype(s.*member)>::value_type;
        if constexpr (std::is_same_v<Field, T>) s.*member = std::move(value);
        else if constexpr (std::is_arithmetic_v<Field> && std::is_arithmetic_v<T>) s.*member = static_cast<Field>(value);
      },
      r.member);
}

std::string known_keys() {
  std::string out;
  for (const auto& r : k_rules) out += (out.empty() ? "" : ", ") + std::string(r.key);
  return out;
}

// "user_limits": {"*": {"max_running": 8, "max_gpus": 4, "max_queued": 10000}, "alice": {"max_gpus": 8}}
std::optional<std::string> set_user_limits(Settings& s, const Rule& r, const json& v) {
  const char* want = "`user_limits` must be an object of user names (or \"*\" for everyone else), each an object of "
                     "max_running, max_gpus and max_queued (whole numbers, 0 for no limit)";
  if (!v.is_object() || v.size() > 10000) return std::string(want);
  std::map<std::string, UserLimit> out;
  for (const auto& [user, limits] : v.items()) {
    if (user.empty() || user.size() > 64 || !limits.is_object()) return std::string(want);
    UserLimit l;
    for (const auto& [key, n] : limits.items()) {
      if (!n.is_number_integer() || n.get<std::int64_t>() < 0 || n.get<std::int64_t>() > 100'000'000)
        return "`user_limits." + user + "." + key.substr(0, 64) + "` must be a whole number from 0 (no limit) to 100000000";
      if (key == "max_running") l.max_running = static_cast<int>(n.get<std::int64_t>());
      else if (key == "max_gpus") l.max_gpus = static_cast<int>(n.get<std::int64_t>());
      else if (key == "max_queued") l.max_queued = n.get<std::int64_t>();
      else return "unknown limit `user_limits." + user + "." + key.substr(0, 64) + "`; known: max_running, max_gpus, max_queued";
    }
    out[user] = l;
  }
  store(s, r, std::move(out));
  return std::nullopt;
}

// "slurm": {"partition": "gpu", "account": "lab", "qos": "normal", "extra_args": ["--constraint=a100"]}
std::optional<std::string> set_slurm(Settings& s, const Rule& r, const json& v) {
  if (!v.is_object()) return std::string("`slurm` must be an object of partition, account, qos and extra_args");
  SlurmOptions o;
  for (const auto& [key, value] : v.items()) {
    if (key == "partition" || key == "account" || key == "qos") {
      if (!value.is_string() || value.get<std::string>().size() > 256 ||
          value.get<std::string>().find_first_of(" \t\n\r") != std::string::npos)
        return "`slurm." + key + "` must be a Slurm name (a string without spaces, at most 256 characters)";
      (key == "partition" ? o.partition : key == "account" ? o.account : o.qos) = value.get<std::string>();
    } else if (key == "extra_args") {
      if (!value.is_array() || value.size() > 64)
        return std::string("`slurm.extra_args` must be an array of at most 64 sbatch options");
      for (const auto& a : value) {
        if (!a.is_string() || a.get<std::string>().rfind("--", 0) != 0 || a.get<std::string>().size() > 1000 ||
            a.get<std::string>().find_first_of("\n\r") != std::string::npos)
          return std::string("`slurm.extra_args` holds sbatch options, each a string like \"--constraint=a100\"");
        o.extra_args.push_back(a.get<std::string>());
      }
    } else {
      return "unknown setting `slurm." + key.substr(0, 64) + "`; known: partition, account, qos, extra_args";
    }
  }
  store(s, r, std::move(o));
  return std::nullopt;
}

// Stores one value (a JSON string or number) under its rule; an error message otherwise.
std::optional<std::string> set(Settings& s, const Rule& r, const json& v, const std::string& source) {
  const std::string key = r.key;
  auto range = [&] {
    std::ostringstream o;
    o.precision(15);  // 316224000, not 3.16224e+08
    o << "must be " << (std::string(r.kind) == "int" ? "an integer" : "a number") << " from " << r.lo << " to " << r.hi;
    return o.str();
  };
  const std::string kind = r.kind;
  if (kind == "executor") {
    if (!v.is_string() || (v.get<std::string>() != "local" && v.get<std::string>() != "slurm"))
      return std::string("`executor` must be \"local\" (this machine) or \"slurm\"");
    store(s, r, v.get<std::string>());
  } else if (kind == "argv") {
    if (v.is_array() && v.size() > k_max_on_finish_args)
      return "`" + key + "` has " + std::to_string(v.size()) + " arguments; at most " +
             std::to_string(k_max_on_finish_args);
    const bool ok = v.is_array() && !v.empty() &&
                    std::all_of(v.begin(), v.end(), [](const json& a) { return a.is_string(); }) &&
                    !v[0].get<std::string>().empty();
    if (!ok) return "`" + key + "` must be a non-empty array of strings, a command as a job's `command`";
    store(s, r, v.get<std::vector<std::string>>());
  } else if (kind == "hang_action") {
    if (!v.is_string() || (v.get<std::string>() != "flag" && v.get<std::string>() != "retry"))
      return std::string("`hang_action` must be \"flag\" (say so in status) or \"retry\" (stop the job and retry it)");
    store(s, r, v.get<std::string>());
  } else if (kind == "user_limits") {
    if (auto err = set_user_limits(s, r, v)) return err;
  } else if (kind == "bool") {
    if (!v.is_boolean()) return "`" + key + "` must be true or false";
    store(s, r, v.get<bool>());
  } else if (kind == "slurm") {
    if (auto err = set_slurm(s, r, v)) return err;
  } else if (kind == "path" || kind == "text") {
    if (!v.is_string() || v.get<std::string>().empty()) return "`" + key + "` must be a non-empty string";
    std::string text = v.get<std::string>();
    if (kind == "path") {
      auto p = path_value(text);
      if (!p) return "`" + key + "` must be an absolute path or start with ~/, got \"" + text.substr(0, 64) + "\"";
      text = *p;
    }
    store(s, r, std::move(text));
  } else {
    if (!v.is_number()) return "`" + key + "` " + range();
    const double x = v.get<double>();
    if (kind == "int") {
      auto i = in_range<std::int64_t>(x, r.lo, r.hi);
      if (!i) return "`" + key + "` " + range();
      store(s, r, *i);
    } else {
      auto d = in_range<double>(x, r.lo, r.hi);
      if (!d) return "`" + key + "` " + range();
      store(s, r, *d);
    }
  }
  s.source[key] = source;
  return std::nullopt;
}

}  // namespace

std::vector<SettingKey> setting_keys() {
  std::vector<SettingKey> out;
  for (const auto& r : k_rules) out.push_back({r.key, r.variable ? r.variable : ""});
  return out;
}

json settings_json(const Settings& s) {
  json out = json::object();
  for (const auto& r : k_rules)
    std::visit(
        [&](auto member) {
          const auto& field = s.*member;
          if (!field) return;
          using Field = typename std::remove_cvref_t<decltype(field)>::value_type;
          json value;
          if constexpr (std::is_same_v<Field, SlurmOptions>) {
            value = {{"partition", field->partition}, {"account", field->account}, {"qos", field->qos},
                     {"extra_args", field->extra_args}};
          } else if constexpr (std::is_same_v<Field, std::map<std::string, UserLimit>>) {
            value = json::object();
            for (const auto& [user, l] : *field)
              value[user] = {{"max_running", l.max_running}, {"max_gpus", l.max_gpus}, {"max_queued", l.max_queued}};
          } else {
            value = *field;
          }
          const auto from = s.source.find(r.key);
          out[r.key] = {{"value", std::move(value)}, {"from", from == s.source.end() ? "" : from->second}};
        },
        r.member);
  return out;
}

std::optional<double> parse_duration(const std::string& text) {
  static const std::map<std::string, double> k_units{{"", 1}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400},
                                                     {"w", 604800}};
  std::size_t used = 0;
  double n = 0;
  try {
    n = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  auto unit = k_units.find(text.substr(used));
  if (unit == k_units.end() || !(n >= 0) || std::isinf(n) || !std::isdigit(static_cast<unsigned char>(text[0])))
    return std::nullopt;
  return n * unit->second;
}

std::string config_path() {
  if (const char* c = std::getenv("GPUQ_CONFIG")) return c;
  if (!env("XDG_CONFIG_HOME").empty()) return env("XDG_CONFIG_HOME") + "/gpuq/config.json";
  if (!env("HOME").empty()) return env("HOME") + "/.config/gpuq/config.json";
  return "";
}

Result<Settings> parse_settings(const std::string& text, const std::string& origin) {
  Settings s;
  auto parsed = parse_untrusted(text, "the file");
  if (!parsed) return bad(origin, parsed.error().message);
  json doc = std::move(*parsed);
  if (!doc.is_object()) return bad(origin, "must be a JSON object of settings (" + known_keys() + ")");
  for (const auto& [key, value] : doc.items()) {
    const Rule* rule = nullptr;
    for (const auto& r : k_rules)
      if (key == r.key) rule = &r;
    if (!rule) return bad(origin, "unknown setting `" + key.substr(0, 64) + "`; known: " + known_keys());
    if (auto err = set(s, *rule, value, origin)) return bad(origin, *err);
  }
  s.file = origin;
  return s;
}

Result<bool> apply_environment(Settings& s) {
  for (const auto& r : k_rules) {
    if (!r.variable) continue;
    const std::string text = env(r.variable);
    if (text.empty()) continue;
    json v = text;
    if (std::string(r.kind) == "int" || std::string(r.kind) == "number") {  // the whole text must be a number
      char* end = nullptr;
      errno = 0;
      const double x = std::strtod(text.c_str(), &end);
      v = (*end == 0 && errno == 0) ? json(x) : json(nullptr);
    }
    if (auto err = set(s, r, v, std::string("$") + r.variable))
      return Error{ErrorCode::bad_request, std::string("$") + r.variable + ": " + err->substr(err->find('`', 1) + 2)};
  }
  return true;
}

Result<Settings> load_settings() {
  Settings s;
  const std::string path = config_path();
  if (!path.empty()) {
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      auto parsed = parse_settings(text.str(), path);
      if (!parsed) return parsed.error();
      s = std::move(*parsed);
    } else if (errno != ENOENT) {
      return Error{ErrorCode::bad_request, path + ": cannot be read"};
    }
  }
  if (auto e = apply_environment(s); !e) return e.error();
  return s;
}

}  // namespace gpuq::common
