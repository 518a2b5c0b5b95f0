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

using Member = std::variant<std::string Settings::*, std::int64_t Settings::*, int Settings::*, double Settings::*,
                            bool Settings::*, SlurmOptions Settings::*, std::vector<std::string> Settings::*,
                            std::map<std::string, UserLimit> Settings::*, std::optional<int> Settings::*>;

// Every key: the one list that parsing, the environment, gpuqd's options and --help, the
// known-keys message and `gpuq config` are made from. A key added here reaches all of them.
struct Rule {
  const char* key;
  const char* variable;  // nullptr: no environment variable
  const char* option;    // gpuqd's command-line option; nullptr: none
  const char* value_name;  // what the option takes, for --help; "" for a flag
  // How the value is checked: "path", "text", "int", "number", "duration" (a number of seconds;
  // an option's text may say "12h"), "bool", or a key of its own.
  const char* kind;
  double lo, hi;         // "int", "number" and "duration"
  Member member;         // where it lands in Settings
  const char* help;
};
const Rule k_rules[] = {
    {"socket", "GPUQ_SOCKET", "--socket", "PATH", "path", 0, 0, &Settings::socket_path,
     "The Unix socket gpuqd listens on and gpuq talks to"},
    {"state_dir", "GPUQ_STATE_DIR", "--state-dir", "PATH", "path", 0, 0, &Settings::state_dir,
     "The state directory: the store, jobs' logs, events and results"},
    {"gpus", "GPUQ_GPUS", "--gpus", "GPUS", "text", 0, 0, &Settings::gpus,
     "GPUs: auto, nvml, none, or fake:N[:MiB[:NODES]]"},
    {"log_limit_mb", "GPUQ_LOG_LIMIT_MB", "--log-limit-mb", "MIB", "int", 0, 1 << 30, &Settings::log_limit_mb,
     "Cap on each rank's log file; past it the log rotates to <log>.1 (0: no cap)"},
    {"retries", "GPUQ_RETRIES", "--default-retries", "N", "int", 0, 100, &Settings::default_retries,
     "Retries for jobs whose spec names none"},
    {"grace_s", nullptr, "--grace", "SECONDS", "number", 0, 86400, &Settings::grace_s,
     "Seconds between SIGTERM and SIGKILL when stopping a job"},
    {"pids_per_attempt", nullptr, "--pids-per-attempt", "N", "int", 0, 1 << 22, &Settings::pids_per_attempt,
     "Processes and threads one attempt of a job may have at once, held by the kernel where gpuqd has the pids "
     "controller: a fork bomb ends there (0: no limit)"},
    {"cgroup_parent", nullptr, "--cgroup-parent", "DIR", "path", 0, 0, &Settings::cgroup_parent,
     "A cgroup v2 directory of the admin's (no process in it, or the root) to make attempts' cgroups under instead "
     "of below gpuqd's own; gpuqd hands it the controllers of the limits it holds jobs to (docs/reliability.md)"},
    {"retry_backoff_s", nullptr, "--retry-backoff", "SECONDS", "number", 0, 86400, &Settings::retry_backoff_s,
     "First retry delay in seconds (doubles per attempt)"},
    {"idle_timeout_s", nullptr, "--idle-timeout", "SECONDS", "number", 0.1, 86400 * 7, &Settings::idle_timeout_s,
     "Close client connections silent for this many seconds"},
    {"connections_per_user", nullptr, "--connections-per-user", "N", "int", 1, 1 << 20, &Settings::connections_per_user,
     "Connections one user may hold open at once; the next is refused, saying so (root and admins: no limit, and "
     "room kept for them when gpuqd's descriptors run low)"},
    {"cpu_slots", nullptr, "--cpu-slots", "N", "int", 0, 1 << 20, &Settings::cpu_slots,
     "CPU slots: ranks of jobs without GPUs, or cores of jobs with `cpus`, that may run at once (0, the default: "
     "the cores gpuqd may run on)"},
    {"health_interval_s", nullptr, "--health-interval", "SECONDS", "number", 0, 86400, &Settings::health_interval_s,
     "Seconds between NVML health checks of the GPUs; a GPU found lost, with failed row remapping or with new "
     "uncorrectable ECC errors is drained (0: no checks)"},
    {"forget_after_s", nullptr, "--forget-after", "DURATION", "duration", 0, 86400 * 3660, &Settings::forget_after_s,
     "Forget ended jobs (their records and files, as `gpuq clean --forget`) this long after they end: 12h, 30d, … "
     "(0: keep them)"},
    {"gpu_process_interval_s", nullptr, "--gpu-process-interval", "SECONDS", "number", 0, 86400,
     &Settings::gpu_process_interval_s,
     "Seconds between looks at the processes NVML lists on the GPUs: memory held by processes gpuq did not start "
     "counts as used when packing shared jobs, a job's peak GPU memory is kept, and shared jobs are held to their "
     "GPU memory budgets (0: none)"},
    {"gpu_memory_policy", nullptr, "--gpu-memory-policy", "requeue|warn", "gpu_memory_policy", 0, 0,
     &Settings::gpu_memory_policy,
     "A shared job found holding more GPU memory than its budget while its GPU's other jobs need the room, for "
     "specs that name none: requeue (stopped and put back in line with a larger budget, no retry spent) or warn "
     "(its budget raised, said in status); with room beside it, its budget is raised either way (docs/job-spec.md)"},
    {"reconnect_s", "GPUQ_RECONNECT_S", nullptr, "", "number", 0, 86400, &Settings::reconnect_s,
     "gpuq wait and logs -f: how long to keep reconnecting to a gpuqd that went away"},
    {"reply_timeout_s", "GPUQ_REPLY_TIMEOUT_S", nullptr, "", "number", 0, 86400 * 7, &Settings::reply_timeout_s,
     "gpuq: how long to wait for one reply"},
    {"executor", nullptr, "--executor", "local|slurm", "executor", 0, 0, &Settings::executor,
     "Where jobs run: local (this machine's GPUs) or slurm (each attempt an sbatch job; Slurm places it; the state "
     "dir must be on a filesystem the compute nodes see; docs/slurm.md)"},
    {"slurm", nullptr, nullptr, "", "slurm", 0, 0, &Settings::slurm,
     "The Slurm executor's sbatch options: partition, account, qos, extra_args"},
    {"multi_user", nullptr, "--multi-user", "", "bool", 0, 0, &Settings::multi_user,
     "Lab mode: one gpuqd, run as root, for every user of this machine; jobs run as the user who submitted them, "
     "and only they or an admin may change them (docs/lab.md)"},
    {"admin_group", nullptr, "--admin-group", "GROUP", "text", 0, 0, &Settings::admin_group,
     "Lab mode: members of this group may act on every job, drain GPUs and stop gpuqd, as root may"},
    {"socket_group", nullptr, "--socket-group", "GROUP", "text", 0, 0, &Settings::socket_group,
     "Lab mode: only members of this group may reach the socket (default: every local user)"},
    {"metrics_listen", nullptr, "--metrics-listen", "HOST:PORT", "text", 0, 0, &Settings::metrics_listen,
     "Serve Prometheus metrics at http://HOST:PORT/metrics (127.0.0.1:9464; docs/monitoring.md)"},
    {"metrics_textfile", nullptr, "--metrics-textfile", "PATH", "path", 0, 0, &Settings::metrics_textfile,
     "Write the metrics to this file every 10 s, atomically, for node_exporter's textfile collector"},
    {"user_limits", nullptr, nullptr, "", "user_limits", 0, 0, &Settings::user_limits,
     "Lab mode: per-user limits, {\"*\": {...}, \"alice\": {...}}"},
    {"usage_half_life_s", nullptr, "--usage-half-life", "DURATION", "duration", 60, 86400 * 366,
     &Settings::usage_half_life_s, "Lab mode: fair share forgets GPU use at this pace: 1d, 7d, …"},
    {"max_priority", nullptr, "--max-priority", "N", "int", -1000000, 1000000, &Settings::max_priority,
     "Lab mode: priorities above this are an admin's (default: none)"},
    {"hang_after_s", nullptr, "--hang-after", "DURATION", "duration", 0, 86400 * 30, &Settings::hang_after_s,
     "A running job that reported progress and then nothing for this long (its GPUs idle, where NVML says) is "
     "flagged as maybe hung: 30m, 2h, … (0: never)"},
    {"placement", nullptr, "--placement", "pack|spread", "placement", 0, 0, &Settings::placement,
     "Where shared jobs go among the GPUs they fit on, for specs that name none: pack (best fit, the default: whole "
     "GPUs stay free for exclusive jobs) or spread (the GPU with the fewest jobs first)"},
    {"hang_action", nullptr, "--hang-action", "flag|retry", "hang_action", 0, 0, &Settings::hang_action,
     "What a maybe hung job gets: flag (said in status and why) or retry (stopped, and retried as a failure)"},
    {"preemptible", nullptr, "--preemptible", "", "bool", 0, 0, &Settings::preemptible,
     "Jobs whose spec does not say `preemptible` are preemptible: a queued job of higher priority may stop them "
     "to start, and they go back in line (docs/preemption.md)"},
    {"preempt_grace_s", nullptr, "--preempt-grace", "SECONDS", "number", 0, 86400, &Settings::preempt_grace_s,
     "Seconds a preempted job has to checkpoint between its signal and SIGKILL, for specs that name none"},
    {"preempt_grace_max_s", nullptr, "--preempt-grace-max", "SECONDS", "number", 0, 86400,
     &Settings::preempt_grace_max_s,
     "The longest grace a spec's preempt_grace_s may ask (a job asking more is refused at submit; one submitted "
     "before the ceiling was lowered gets the ceiling): a job of one user cannot hold GPUs another's urgent job "
     "preempts it for longer than this"},
    {"preempt_protect_after", nullptr, "--preempt-protect-after", "N", "int", 0, 1000000,
     &Settings::preempt_protect_after,
     "A job preempted this many times is not preempted again until it has run preempt_min_run_s (0: every job "
     "is protected so from each start)"},
    {"preempt_min_run_s", nullptr, "--preempt-min-run", "DURATION", "duration", 0, 86400 * 366,
     &Settings::preempt_min_run_s, "How long a protected job runs before it may be preempted again: 5m, 1h, …"},
    {"preempt_across_users", nullptr, "--preempt-across-users", "never|fair_share", "preempt_across_users", 0, 0,
     &Settings::preempt_across_users,
     "Lab mode: whether one user's job may preempt another's: never (the default), or fair_share (only a user "
     "who holds less than their fair share of the GPUs, from a user who holds more)"},
    {"on_finish", nullptr, nullptr, "", "argv", 0, 0, &Settings::on_finish,
     "A command run after every job ends, as an array (docs/cli.md)"},
    {"on_preempt", nullptr, nullptr, "", "argv", 0, 0, &Settings::on_preempt,
     "A command run after every job is preempted, as an array (docs/cli.md)"},
    {"hook_timeout_s", nullptr, "--hook-timeout", "SECONDS", "number", 1, 86400, &Settings::hook_timeout_s,
     "A hook still running after this many seconds is killed"},
};

const Rule* rule_of(const std::string& key) {
  for (const auto& r : k_rules)
    if (key == r.key) return &r;
  return nullptr;
}

// The member's own type, or what its optional holds.
template <class Field>
struct value_of {
  using type = Field;
};
template <class Field>
struct value_of<std::optional<Field>> {
  using type = Field;
};

// Stores `value` where the rule says; an integer is narrowed to the member's width (the rule's
// range has been checked).
template <class T>
void store(Settings& s, const Rule& r, T value) {
  std::visit(
      [&](auto member) {
        using Field = typename value_of<std::remove_reference_t<decltype(s.*member)>>::type;
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
  } else if (kind == "placement") {
    if (!v.is_string() || (v.get<std::string>() != "pack" && v.get<std::string>() != "spread"))
      return std::string("`placement` must be \"pack\" (best fit) or \"spread\" (the GPU with the fewest jobs first)");
    store(s, r, v.get<std::string>());
  } else if (kind == "preempt_across_users") {
    if (!v.is_string() || (v.get<std::string>() != "never" && v.get<std::string>() != "fair_share"))
      return std::string(
          "`preempt_across_users` must be \"never\" or \"fair_share\" (from a user under their "
          "fair share of the GPUs to one over it)");
    store(s, r, v.get<std::string>());
  } else if (kind == "gpu_memory_policy") {
    if (!v.is_string() || (v.get<std::string>() != "requeue" && v.get<std::string>() != "warn"))
      return std::string(
          "`gpu_memory_policy` must be \"requeue\" (stop the job, requeue it with a larger budget) or \"warn\" "
          "(raise its budget and say so)");
    store(s, r, v.get<std::string>());
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
  for (const auto& r : k_rules)
    out.push_back({r.key, r.variable ? r.variable : "", r.option ? r.option : "", r.value_name, r.help});
  return out;
}

json setting_value(const Settings& s, const std::string& key) {
  const Rule* r = rule_of(key);
  if (!r) return nullptr;
  return std::visit(
      [&](auto member) -> json {
        const auto& field = s.*member;
        using Field = std::remove_cvref_t<decltype(field)>;
        if constexpr (std::is_same_v<Field, SlurmOptions>) {
          return {{"partition", field.partition}, {"account", field.account}, {"qos", field.qos},
                  {"extra_args", field.extra_args}};
        } else if constexpr (std::is_same_v<Field, std::map<std::string, UserLimit>>) {
          json value = json::object();
          for (const auto& [user, l] : field)
            value[user] = {{"max_running", l.max_running}, {"max_gpus", l.max_gpus}, {"max_queued", l.max_queued}};
          return value;
        } else if constexpr (std::is_same_v<Field, std::optional<int>>) {
          return field ? json(*field) : json(nullptr);
        } else {
          return field;
        }
      },
      r->member);
}

json settings_json(const Settings& s) {
  json out = json::object();
  for (const auto& r : k_rules) {
    const auto from = s.source.find(r.key);
    if (from != s.source.end()) out[r.key] = {{"value", setting_value(s, r.key)}, {"from", from->second}};
  }
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
    const Rule* rule = rule_of(key);
    if (!rule) return bad(origin, "unknown setting `" + key.substr(0, 64) + "`; known: " + known_keys());
    if (auto err = set(s, *rule, value, origin)) return bad(origin, *err);
  }
  s.file = origin;
  return s;
}

namespace {
// A value given as text (an environment variable, an option), as the file would give it: a
// number's whole text must be a number; a duration may say its unit ("12h"). Errors name `origin`.
Result<bool> set_text(Settings& s, const Rule& r, const std::string& text, const std::string& origin) {
  const std::string kind = r.kind;
  json v = text;
  // A number's text: digits, a point, an exponent, signs; no spaces, hex, "inf" or "nan".
  const bool numeric = !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string::npos;
  if (kind == "bool") {
    if (text.empty() || text == "true" || text == "1") v = true;  // "": a flag given
    else if (text == "false" || text == "0") v = false;
    else return Error{ErrorCode::bad_request, origin + ": must be true or false"};
  } else if (kind == "duration") {
    auto d = numeric || (text.size() > 1 && text.find_first_not_of("0123456789.smhdw") == std::string::npos)
                 ? parse_duration(text)
                 : std::nullopt;
    if (!d) return Error{ErrorCode::bad_request, origin + ": " + (text.empty() ? std::string("\"\"") : text.substr(0, 64)) +
                                                     " is not a duration like 90s, 30m, 12h, 7d or 2w"};
    v = *d;
  } else if (kind == "int" || kind == "number") {
    char* end = nullptr;
    errno = 0;
    const double x = numeric ? std::strtod(text.c_str(), &end) : 0;
    v = (numeric && *end == 0 && errno == 0) ? json(x) : json(nullptr);
  }
  if (auto err = set(s, r, v, origin)) {
    const auto tick = err->find('`', 1);  // "`key` must be …" is said as "origin: must be …"
    return Error{ErrorCode::bad_request,
                 origin + ": " + (err->front() == '`' && tick != std::string::npos ? err->substr(tick + 2) : *err)};
  }
  return true;
}
}  // namespace

Result<bool> apply_environment(Settings& s) {
  for (const auto& r : k_rules) {
    if (!r.variable) continue;
    const std::string text = env(r.variable);
    if (text.empty()) continue;
    if (auto e = set_text(s, r, text, std::string("$") + r.variable); !e) return e;
  }
  return true;
}

Result<bool> apply_option(Settings& s, const std::string& key, const std::string& text) {
  const Rule* r = rule_of(key);
  if (!r || !r->option) return Error{ErrorCode::bad_request, "no option sets `" + key + "`"};
  return set_text(s, *r, text, r->option);
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
