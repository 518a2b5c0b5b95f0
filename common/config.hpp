// Defaults from a configuration file and the environment, shared by gpuqd and gpuq.
// Precedence, lowest first: built-in defaults < the file < environment variables < command line.
// The file is $GPUQ_CONFIG (empty: none), else $XDG_CONFIG_HOME/gpuq/config.json, else
// ~/.config/gpuq/config.json; a missing file is no settings, a bad one an error naming the key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/slurm_script.hpp"
#include "common/users.hpp"

namespace gpuq::common {

// Every setting, with its built-in default. gpuqd's daemon::Config is one of these (plus what only
// it knows), so a value read here reaches the daemon with no copy by hand. Which keys were given,
// and where, is in `source`; has(key) asks.
struct Settings {
  std::string socket_path;               // "socket"          $GPUQ_SOCKET (empty: the default)
  std::string state_dir;                 // "state_dir"       $GPUQ_STATE_DIR (empty: the default)
  std::string gpus = "auto";             // "gpus"            $GPUQ_GPUS
  std::int64_t log_limit_mb = 1024;      // "log_limit_mb"    $GPUQ_LOG_LIMIT_MB: per rank log before it rotates (0: no cap)
  int default_retries = 0;               // "retries"         $GPUQ_RETRIES: for jobs whose spec names none
  double grace_s = 10;                   // "grace_s": SIGTERM -> SIGKILL for a job's processes
  std::int64_t pids_per_attempt = 32768;  // "pids_per_attempt": processes and threads of one attempt (0: no limit)
  std::string
      cgroup_parent;  // "cgroup_parent": the cgroup v2 directory attempts' cgroups go under (empty: gpuqd's own)
  double retry_backoff_s = 1;            // "retry_backoff_s": first retry delay; doubles per attempt
  double idle_timeout_s = 300;           // "idle_timeout_s": silent client connections are closed
  int connections_per_user = 256;        // "connections_per_user": open at once (admins: no limit)
  int cpu_slots = 0;                     // "cpu_slots": the CPU pool (scheduler.hpp); 0: the cores gpuqd may use
  double health_interval_s = 60;         // "health_interval_s": NVML health checks; 0: none
  double gpu_process_interval_s = 2;     // "gpu_process_interval_s": NVML's process lists; 0: not read
  double forget_after_s = 0;             // "forget_after_s": ended jobs forgotten this long after; 0: kept
  double reconnect_s = 60;               // "reconnect_s"     $GPUQ_RECONNECT_S (gpuq wait, logs -f)
  double reply_timeout_s = 120;          // "reply_timeout_s" $GPUQ_REPLY_TIMEOUT_S (gpuq: common::Client)
  std::string executor = "local";        // "executor": "local" (this machine) or "slurm" (executor.hpp)
  SlurmOptions slurm;                    // "slurm": {"partition", "account", "qos", "extra_args": [...]}
  bool multi_user = false;               // "multi_user": lab mode (docs/lab.md)
  std::string admin_group;               // "admin_group": its members may act on every job
  std::string socket_group;              // "socket_group": only its members reach the socket
  std::string metrics_listen;            // "metrics_listen": HOST:PORT serving /metrics (Prometheus)
  std::string metrics_textfile;          // "metrics_textfile": the same, written for node_exporter
  std::vector<std::string> on_finish;    // "on_finish": argv run after every job ends (hooks.cpp)
  std::vector<std::string> on_preempt;   // "on_preempt": argv run after every job is preempted
  double hook_timeout_s = 60;            // "hook_timeout_s": a hook still running then is killed
  std::map<std::string, UserLimit> user_limits;  // "user_limits": {"*": {...}, "alice": {...}}
  double usage_half_life_s = 7 * 86400;  // "usage_half_life_s": fair share forgets GPU use at this pace
  std::optional<int> max_priority;       // "max_priority": higher priorities are an admin's
  double hang_after_s = 0;               // "hang_after_s": silent this long after progress: maybe hung; 0: never
  std::string placement = "pack";        // "placement": shared jobs' default, "pack" or "spread" (spec.hpp)
  std::string gpu_memory_policy = "requeue";  // "gpu_memory_policy": a shared job over its budget (gpu_budgets.hpp)
  std::string hang_action = "flag";      // "hang_action": "flag" (say so) or "retry" (stop it, retry it)
  bool preemptible = false;              // "preemptible": for specs that name none (daemon/preemption.hpp)
  double preempt_grace_s = 30;           // "preempt_grace_s": for specs that name none
  double preempt_grace_max_s = 600;      // "preempt_grace_max_s": the most a spec may ask (refused above it at submit)
  int preempt_protect_after = 1;         // "preempt_protect_after": preemptions after which a job is protected...
  double preempt_min_run_s = 300;        // "preempt_min_run_s": ...for this long from each start
  std::string preempt_across_users = "never";  // "preempt_across_users": "never" or "fair_share" (lab mode)
  std::string file;                      // the file read, empty if none
  std::map<std::string, std::string> source;  // key given -> the file's path, "$VARIABLE" or "--option"

  bool has(const std::string& key) const { return source.count(key) != 0; }
};

// Every key the file takes, in the order of the table they are parsed by, each with its
// environment variable and gpuqd's option ("" for none), what it takes, and what it sets.
struct SettingKey {
  std::string key, variable, option;
  std::string value_name;  // "SECONDS", "PATH", …; "" for a flag (the option takes no value)
  std::string help;
};
std::vector<SettingKey> setting_keys();

// Sets `key` from a command-line option's text (`option` names it in errors and in `source`),
// checked as the file's value is: a number's whole text, a duration ("90s", "30m", "12h", "7d")
// where the key is in seconds and documents one; "" for a flag. An error names the option.
Result<bool> apply_option(Settings& s, const std::string& key, const std::string& text);

// The value a key has in `s` (set or default), as JSON.
nlohmann::json setting_value(const Settings& s, const std::string& key);

// The settings that are set, each as {"value": ..., "from": the file's path or "$VARIABLE"}, by
// key: what `gpuq config` shows.
nlohmann::json settings_json(const Settings& s);

// "90", "90s", "30m", "12h", "7d", "2w" (a number and one unit) in seconds; nullopt if malformed.
std::optional<double> parse_duration(const std::string& text);

// The configuration file's path ("" when $GPUQ_CONFIG is set empty).
std::string config_path();

// Parses a configuration document; `origin` names it in errors.
Result<Settings> parse_settings(const std::string& text, const std::string& origin);
// Applies the environment's variables over `s` (an unset or empty variable changes nothing).
Result<bool> apply_environment(Settings& s);
// The file (if any), then the environment.
Result<Settings> load_settings();

}  // namespace gpuq::common
