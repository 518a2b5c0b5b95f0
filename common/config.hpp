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

struct Settings {
  std::optional<std::string> socket;     // "socket"          $GPUQ_SOCKET
  std::optional<std::string> state_dir;  // "state_dir"       $GPUQ_STATE_DIR
  std::optional<std::string> gpus;       // "gpus"            $GPUQ_GPUS
  std::optional<std::int64_t> log_limit_mb;  // "log_limit_mb" $GPUQ_LOG_LIMIT_MB
  std::optional<int> retries;            // "retries"         $GPUQ_RETRIES (jobs that name none)
  std::optional<double> grace_s;         // "grace_s"
  std::optional<double> retry_backoff_s; // "retry_backoff_s"
  std::optional<double> idle_timeout_s;  // "idle_timeout_s"
  std::optional<int> cpu_slots;          // "cpu_slots"
  std::optional<double> health_interval_s;  // "health_interval_s"
  std::optional<double> gpu_process_interval_s;  // "gpu_process_interval_s": NVML's process lists, this often
  std::optional<double> forget_after_s;  // "forget_after_s"
  std::optional<double> reconnect_s;     // "reconnect_s"     $GPUQ_RECONNECT_S (gpuq wait, logs -f)
  std::optional<double> reply_timeout_s;  // "reply_timeout_s" $GPUQ_REPLY_TIMEOUT_S (gpuq: common::Client)
  std::optional<std::string> executor;   // "executor": "local" or "slurm" (gpuqd)
  std::optional<SlurmOptions> slurm;     // "slurm": {"partition", "account", "qos", "extra_args": [...]}
  std::optional<bool> multi_user;        // "multi_user": lab mode (gpuqd; docs/lab.md)
  std::optional<std::string> admin_group;   // "admin_group": its members may act on every job
  std::optional<std::string> socket_group;  // "socket_group": only its members reach the socket
  std::optional<std::string> metrics_listen;    // "metrics_listen": HOST:PORT serving /metrics (Prometheus)
  std::optional<std::string> metrics_textfile;  // "metrics_textfile": the same, written for node_exporter
  std::optional<std::vector<std::string>> on_finish;  // "on_finish": argv run after every job ends
  std::optional<double> hook_timeout_s;               // "hook_timeout_s": a hook is killed after this long
  std::optional<std::map<std::string, UserLimit>> user_limits;  // "user_limits": {"*": {...}, "alice": {...}}
  std::optional<double> usage_half_life_s;  // "usage_half_life_s": fair share's memory of GPU use
  std::optional<int> max_priority;          // "max_priority": higher priorities are an admin's
  std::optional<double> hang_after_s;       // "hang_after_s": a job silent this long after progress may be hung
  std::optional<std::string> hang_action;   // "hang_action": "flag" (say so) or "retry" (stop it, retry it)
  std::string file;                      // the file read, empty if none
  std::map<std::string, std::string> source;  // key -> the file's path or "$VARIABLE"
};

// Every key the file takes, in the order of the table they are parsed by, each with its
// environment variable ("" for none).
struct SettingKey {
  std::string key, variable;
};
std::vector<SettingKey> setting_keys();

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
