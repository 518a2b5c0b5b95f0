// Strict job-spec parsing and batch validation (see docs/job-spec.md).
#include "common/spec.hpp"

#include "common/field_reader.hpp"
#include "common/matrix.hpp"
#include "common/train_spec.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <csignal>
#include <functional>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

namespace gpuq::common {

namespace {

constexpr std::array<std::string_view, 32> k_fields{"name",
                                                    "command",
                                                    "shell",
                                                    "train",
                                                    "gpus",
                                                    "mode",
                                                    "ranks",
                                                    "cpus",
                                                    "mem_bind",
                                                    "gpu_memory_mb",
                                                    "shared",
                                                    "priority",
                                                    "after",
                                                    "retries",
                                                    "timeout_s",
                                                    "env",
                                                    "cwd",
                                                    "labels",
                                                    "comment",
                                                    "matrix",
                                                    "nodes",
                                                    "on_finish",
                                                    "memory_mb",
                                                    "retry_on_oom",
                                                    "report",
                                                    "placement",
                                                    "preemptible",
                                                    "preempt_signal",
                                                    "preempt_grace_s",
                                                    "on_preempt",
                                                    "preempt_mode",
                                                    "gpu_memory_policy"};

constexpr std::array<std::string_view, 19> k_reserved_env{
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RANK",
    "LOCAL_RANK",           "WORLD_SIZE",        "LOCAL_WORLD_SIZE",
    "GROUP_RANK",           "ROLE_RANK",         "MASTER_ADDR",
    "MASTER_PORT",          "GPUQ_JOB_ID",       "GPUQ_JOB_DIR",
    "GPUQ_EVENTS",          "GPUQ_ATTEMPT",      "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",  "GPUQ_CPUS",         "TORCHELASTIC_USE_AGENT_STORE",
    "GPUQ_PREEMPT_FILE"};

// The signals a preemption may send first (`preempt_signal`): those a program can catch and
// that mean "stop" or "checkpoint" by convention (Slurm's --signal takes any; SIGKILL and SIGSTOP
// could not be handled, and the rest mean faults).
constexpr std::array<std::pair<std::string_view, int>, 6> k_preempt_signals{{{"SIGTERM", SIGTERM},
                                                                             {"SIGINT", SIGINT},
                                                                             {"SIGHUP", SIGHUP},
                                                                             {"SIGUSR1", SIGUSR1},
                                                                             {"SIGUSR2", SIGUSR2},
                                                                             {"SIGQUIT", SIGQUIT}}};

}  // namespace

std::string_view to_string(MemoryPolicy p) {
  switch (p) {
    case MemoryPolicy::requeue:
      return "requeue";
    case MemoryPolicy::warn:
      return "warn";
    case MemoryPolicy::default_:
      break;
  }
  return "";
}

std::string_view to_string(PreemptMode m) {
  switch (m) {
    case PreemptMode::requeue:
      return "requeue";
    case PreemptMode::suspend:
      return "suspend";
    case PreemptMode::auto_:
      break;
  }
  return "auto";
}

int preempt_signal_number(std::string_view name) {
  if (name.empty()) return SIGTERM;
  for (const auto& [n, number] : k_preempt_signals)
    if (name == n || name == n.substr(3)) return number;
  return 0;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  if (std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); }))
    return false;  // all-digit names would be ambiguous with job ids
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

namespace {

// The path of the first string (or key) in `v` that holds a NUL byte, or "" when none does.
// Such a string is cut at the NUL by exec and every C API, so the job would run something other
// than its stored spec. Depth is bounded by the parser (json_input.hpp).
std::string nul_path(const json& v, const std::string& path) {
  if (v.is_string()) return v.get_ref<const std::string&>().find('\0') != std::string::npos ? path : "";
  if (v.is_array())
    for (std::size_t i = 0; i < v.size(); ++i)
      if (auto p = nul_path(v[i], path + "[" + std::to_string(i) + "]"); !p.empty()) return p;
  if (v.is_object())
    for (const auto& [k, item] : v.items()) {
      const std::string at = path.empty() ? k : path + "." + k;
      if (k.find('\0') != std::string::npos) return path.empty() ? "(a key)" : path + " (a key)";
      if (auto p = nul_path(item, at); !p.empty()) return p;
    }
  return "";
}

// Collects the problems of one job; every message is prefixed with the job's position and name.
class JobParser {
 public:
  JobParser(const json& obj, std::size_t index, std::vector<std::string>& errors)
      : m_errors(errors),
        m_prefix(prefix_of(obj, index)),
        m_reader(obj, m_prefix, "", errors, {k_fields.begin(), k_fields.end()}) {
    if (auto at = nul_path(obj, ""); !at.empty())
      fail("field `" + at.substr(0, 128) + "` contains a NUL byte (\\u0000), which would cut it short at exec");
  }

  void fail(const std::string& msg) { m_reader.fail(msg); }
  const json* get(std::string_view key) { return m_reader.get(key); }
  bool int_field(std::string_view key, long long lo, long long hi, long long& out) {
    return m_reader.integer(key, lo, hi, out);
  }
  bool string_field(std::string_view key, std::string& out) { return m_reader.string(key, out); }

  void string_map(std::string_view key, std::map<std::string, std::string>& out) {
    const json* v = get(key);
    if (!v) return;
    if (!v->is_object()) {
      fail("field `" + std::string(key) + "` must be an object of strings, got " + json_type_name(*v));
      return;
    }
    for (const auto& [k, val] : v->items()) {
      if (!val.is_string()) {
        fail("field `" + std::string(key) + "." + k + "` must be a string, got " + json_type_name(val));
        continue;
      }
      out[k] = val.get<std::string>();
    }
  }

  // `labels`: each a string, a number or a boolean, kept as typed: a sweep's "lr": 0.3 is a number
  // its results table sorts by as one.
  void label_map(std::map<std::string, json>& out) {
    const json* v = get("labels");
    if (!v) return;
    if (!v->is_object()) {
      fail("field `labels` must be an object of strings, numbers or booleans, got " + json_type_name(*v));
      return;
    }
    for (const auto& [k, val] : v->items()) {
      if (!val.is_string() && !val.is_number() && !val.is_boolean()) {
        fail("field `labels." + k.substr(0, 64) + "` must be a string, a number or a boolean, got " +
             json_type_name(val));
        continue;
      }
      out[k] = val;
    }
  }

  // `report`: {"progress": [pattern...], "result": [pattern...], "rank": R, "file": "path"}. The
  // patterns are RE2's; gpuqd compiles them when the batch comes (submit_check.cpp), this checks
  // their shape.
  void parse_report(const json& r, Report& out) {
    if (!r.is_object()) {
      fail(
          "field `report` must be an object ({\"progress\": [...], \"result\": [...], \"rank\": 0, \"file\": "
          "\"results.json\"}), got " +
          json_type_name(r));
      return;
    }
    for (const auto& [key, value] : r.items()) {
      const std::string at = "report." + key;
      if (key == "progress" || key == "result") {
        auto& list = key == "progress" ? out.progress : out.result;
        if (!value.is_array() || value.size() > k_max_report_patterns) {
          fail("field `" + at + "` must be an array of at most " + std::to_string(k_max_report_patterns) +
               " patterns (strings)");
          continue;
        }
        for (std::size_t i = 0; i < value.size(); ++i) {
          const std::string where = at + "[" + std::to_string(i) + "]";
          if (!value[i].is_string() || value[i].get_ref<const std::string&>().empty()) {
            fail("field `" + where + "` must be a non-empty string (an RE2 pattern)");
            continue;
          }
          const auto& pattern = value[i].get_ref<const std::string&>();
          if (pattern.size() > k_max_report_pattern_bytes) {
            fail("field `" + where + "` is " + std::to_string(pattern.size()) + " bytes; a pattern may have " +
                 std::to_string(k_max_report_pattern_bytes));
            continue;
          }
          // (?P<name>...) and, in RE2 from mid-2023 on, (?<name>...) as Python 3.12 and PCRE write it;
          // gpuqd's RE2 says which it takes. (?<= and (?<! are look-behinds, which RE2 has not.
          bool named = pattern.find("(?P<") != std::string::npos;
          for (auto p = pattern.find("(?<"); !named && p != std::string::npos; p = pattern.find("(?<", p + 1))
            named = p + 3 < pattern.size() && pattern[p + 3] != '=' && pattern[p + 3] != '!';
          if (!named)
            fail("field `" + where +
                 "` has no named group, so a match would report nothing: name what to keep, "
                 "(?P<loss>[0-9.]+)");
          list.push_back(pattern);
        }
      } else if (key == "rank") {
        if (!value.is_number_integer() || value.get<long long>() < 0 || value.get<long long>() >= k_max_gpus) {
          fail("field `" + at + "` must be a rank number (0 is the first)");
          continue;
        }
        out.rank = value.get<int>();
      } else if (key == "file") {
        if (!value.is_string() || value.get_ref<const std::string&>().empty() ||
            value.get_ref<const std::string&>().size() > 4096) {
          fail("field `" + at + "` must be a file's path (relative to the job's cwd), at most 4096 bytes");
          continue;
        }
        out.file = value.get<std::string>();
      } else {
        fail("field `" + at + "` is not one of report's: progress, result, rank, file");
      }
    }
    if (out.empty()) fail("field `report` names nothing to read: give `progress` or `result` patterns, or a `file`");
  }

  JobSpec parse(const std::string& default_cwd) {
    JobSpec s;
    if (string_field("name", s.name) && !valid_name(s.name))
      fail("field `name` must be 1-128 characters of letters, digits, '-', '_' or '.', and not "
           "all digits, got \"" + s.name.substr(0, 64) + "\"");

    if (get("matrix")) fail("field `matrix` is expanded when a batch is submitted; a stored job has none");
    // What to run: exactly one of command, shell, train.
    int what = (get("command") ? 1 : 0) + (get("shell") ? 1 : 0) + (get("train") ? 1 : 0);
    if (what == 0) fail("needs one of `command` (an argv array) or `shell` (a string)");
    if (what > 1) fail("give only one of `command`, `shell` and `train`");
    int gpus_per_rank = 1;  // a ddp rank of a model-parallel train job holds one GPU per stage
    if (const json* t = get("train")) {
      TrainSpec train = parse_train(*t, m_prefix, m_errors);
      if (!train.stages.empty()) gpus_per_rank = static_cast<int>(train.stages.size());
      s.train = to_json(train);
      s.command = {k_worker_placeholder, "--train", s.train.dump()};
    }
    if (const json* c = get("command")) {
      if (!c->is_array() || c->empty()) {
        fail("field `command` must be a non-empty array of strings, e.g. [\"python3\", "
             "\"train.py\"]; for a shell command line use `shell`");
      } else {
        for (std::size_t i = 0; i < c->size(); ++i) {
          if (!(*c)[i].is_string()) {
            fail("field `command[" + std::to_string(i) + "]` must be a string, got " + json_type_name((*c)[i]));
            continue;
          }
          s.command.push_back((*c)[i].get<std::string>());
        }
        if (!s.command.empty() && s.command[0].empty()) fail("field `command[0]` is empty");
      }
    }
    for (auto [key, out, when] :
         {std::tuple{"on_finish", &s.on_finish, "ends"}, {"on_preempt", &s.on_preempt, "is preempted"}}) {
      const json* h = get(key);
      if (!h) continue;
      const std::string field = key;
      if (h->is_array() && h->size() > k_max_on_finish_args) {
        fail("field `" + field + "` has " + std::to_string(h->size()) + " arguments; at most " +
             std::to_string(k_max_on_finish_args));
      } else if (!h->is_array() || h->empty()) {
        fail("field `" + field + "` must be a non-empty array of strings (a command run when the job " + when +
             ", as `command`), e.g. [\"notify-send\", \"job done\"]");
      } else {
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < h->size(); ++i) {
          if (!(*h)[i].is_string()) {
            fail("field `" + field + "[" + std::to_string(i) + "]` must be a string, got " + json_type_name((*h)[i]));
            continue;
          }
          out->push_back((*h)[i].get<std::string>());
          bytes += out->back().size() + 1;
          if (out->back().size() + 1 > k_max_exec_string)
            fail("field `" + field + "[" + std::to_string(i) + "]` is longer than exec allows (" +
                 std::to_string(k_max_exec_string - 1) + " bytes)");
        }
        if (!out->empty() && (*out)[0].empty()) fail("field `" + field + "[0]` is empty");
        if (bytes > k_max_on_finish_bytes)
          fail("field `" + field + "` is " + std::to_string(bytes) + " bytes; at most " +
               std::to_string(k_max_on_finish_bytes) + " in all");
      }
    }
    if (const json* r = get("report")) parse_report(*r, s.report);
    std::string placement;
    if (string_field("placement", placement)) {
      if (placement == "spread")
        s.placement = Placement::spread;
      else if (placement != "pack")
        fail("field `placement` must be \"pack\" or \"spread\", got \"" + placement.substr(0, 64) + "\"");
    }
    m_reader.boolean("preemptible", s.preemptible);
    std::string signal;
    if (string_field("preempt_signal", signal)) {
      if (preempt_signal_number(signal) != 0 && !signal.empty())
        s.preempt_signal = signal.rfind("SIG", 0) == 0 ? signal : "SIG" + signal;
      else
        fail(
            "field `preempt_signal` must be one of SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT (the SIG may "
            "be left out), got \"" +
            signal.substr(0, 64) + "\"");
    }
    m_reader.number("preempt_grace_s", 0, k_max_preempt_grace_s, s.preempt_grace_s);
    std::string preempt_mode;
    if (string_field("preempt_mode", preempt_mode)) {
      if (preempt_mode == "requeue")
        s.preempt_mode = PreemptMode::requeue;
      else if (preempt_mode == "suspend")
        s.preempt_mode = PreemptMode::suspend;
      else if (preempt_mode != "auto")
        fail("field `preempt_mode` must be \"auto\", \"requeue\" or \"suspend\", got \"" + preempt_mode.substr(0, 64) +
             "\"");
    }
    std::string memory_policy;
    if (string_field("gpu_memory_policy", memory_policy)) {
      if (memory_policy == "requeue")
        s.gpu_memory_policy = MemoryPolicy::requeue;
      else if (memory_policy == "warn")
        s.gpu_memory_policy = MemoryPolicy::warn;
      else
        fail("field `gpu_memory_policy` must be \"requeue\" or \"warn\", got \"" + memory_policy.substr(0, 64) + "\"");
    }
    if (string_field("shell", s.shell)) {
      if (s.shell.empty()) fail("field `shell` is empty");
      s.command = {"/bin/sh", "-c", s.shell};
    }

    // exec refuses any one argument or environment string longer than the kernel's MAX_ARG_STRLEN
    // (E2BIG): say so now rather than fail the launch. A train job's spec is one such argument.
    for (std::size_t i = 0; i < s.command.size(); ++i)
      if (s.command[i].size() + 1 > k_max_exec_string)
        fail((get("train")   ? "field `train` (given to gpuq-worker as one argument) is "
              : get("shell") ? "field `shell` is "
                             : "field `command[" + std::to_string(i) + "]` is ") +
             std::to_string(s.command[i].size()) + " bytes; exec takes at most 128 KiB in one argument");

    long long x = 0;
    if (int_field("gpus", 0, k_max_gpus, x)) s.gpus = static_cast<int>(x);
    std::string mode;
    if (string_field("mode", mode)) {
      if (mode == "independent") s.mode = Mode::independent;
      else if (mode == "ddp") s.mode = Mode::ddp;
      else fail("field `mode` must be \"independent\" or \"ddp\", got \"" + mode.substr(0, 32) + "\"");
    }
    bool has_ranks = int_field("ranks", 1, 4096, x);
    if (has_ranks) s.ranks = static_cast<int>(x);
    if (s.mode == Mode::ddp) {
      if (s.gpus > 0 && gpus_per_rank > 1 && s.gpus % gpus_per_rank != 0)
        fail("field `gpus` (" + std::to_string(s.gpus) + ") must be a multiple of the " +
             std::to_string(gpus_per_rank) + " `train.stages` for a ddp job of model-parallel replicas");
      else if (s.gpus > 0 && has_ranks && s.ranks * gpus_per_rank != s.gpus)
        fail("field `ranks` (" + std::to_string(s.ranks) + ") must equal `gpus` (" + std::to_string(s.gpus) + ")" +
             (gpus_per_rank > 1 ? " / " + std::to_string(gpus_per_rank) + " stages" : std::string()) +
             " for a ddp job on GPUs: " + (gpus_per_rank > 1 ? "one rank per replica" : "one rank per GPU"));
      if (s.gpus > 0) s.ranks = s.gpus / gpus_per_rank;
      if (s.gpus == 0 && !has_ranks)
        fail("a ddp job without GPUs needs `ranks` (the number of CPU processes, e.g. 2)");
    } else if (has_ranks && s.ranks != 1) {
      fail("field `ranks` needs \"mode\": \"ddp\"; an independent job is one process");
    }

    // Machines: a ddp gang split evenly over them, each with the same number of ranks and GPUs.
    // Only an executor that places work on several machines (Slurm) runs such a job.
    if (int_field("nodes", 1, k_max_nodes, x)) s.nodes = static_cast<int>(x);
    if (s.nodes > 1) {
      const std::string n = std::to_string(s.nodes);
      if (s.mode != Mode::ddp)
        fail("field `nodes` (" + n + ") needs \"mode\": \"ddp\": an independent job is one process on one machine");
      else if (s.gpus > 0 && (s.gpus % s.nodes != 0 || (s.gpus / s.nodes) % gpus_per_rank != 0))
        fail("field `gpus` (" + std::to_string(s.gpus) + ") must split evenly over `nodes` (" + n + ")" +
             (gpus_per_rank > 1 ? ", whole replicas of " + std::to_string(gpus_per_rank) + " stages on each" : ""));
      else if (s.ranks % s.nodes != 0)
        fail("field `ranks` (" + std::to_string(s.ranks) + ") must split evenly over `nodes` (" + n + ")");
    }

    if (int_field("cpus", 1, k_max_cpus, x)) s.cpus = static_cast<int>(x);
    std::string mem_bind;
    if (string_field("mem_bind", mem_bind)) {
      if (mem_bind == "none") s.mem_bind = MemBind::none;
      else if (mem_bind == "local") s.mem_bind = MemBind::local;
      else if (mem_bind == "prefer") s.mem_bind = MemBind::prefer;
      else fail("field `mem_bind` must be \"local\", \"prefer\" or \"none\", got \"" + mem_bind.substr(0, 32) + "\"");
      if (s.mem_bind != MemBind::none && s.cpus == 0)
        fail("field `mem_bind` needs `cpus`: memory is bound to the NUMA nodes of each rank's pinned cores");
    }

    if (int_field("gpu_memory_mb", 1, 1LL << 40, x)) s.gpu_memory_mb = x;
    m_reader.boolean("shared", s.shared);
    if (s.shared) {
      if (s.gpu_memory_mb == 0)
        fail("a shared job needs `gpu_memory_mb` so gpuq can pack it next to others");
      if (s.gpus == 0) fail("field `shared` needs `gpus` >= 1");
      if (s.mode == Mode::ddp) fail("a ddp job cannot be shared: its ranks need whole GPUs");
    }
    if (s.gpu_memory_mb > 0 && s.gpus == 0)
      fail("field `gpu_memory_mb` needs `gpus` >= 1");
    if (s.gpu_memory_policy != MemoryPolicy::default_ && !s.shared)
      fail("field `gpu_memory_policy` needs `shared`: a job with GPUs of its own has no budget to keep to");

    // Host memory per rank: at least 4 MiB (a limit under what a process needs to start is an OOM
    // kill before its first line).
    if (int_field("memory_mb", 4, 1LL << 40, x)) s.memory_mb = x;

    if (int_field("priority", -k_max_priority, k_max_priority, x)) s.priority = static_cast<int>(x);
    if (int_field("retries", 0, k_max_retries, x)) s.retries = static_cast<int>(x);
    m_reader.boolean("retry_on_oom", s.retry_on_oom);
    if (const json* v = get("timeout_s")) {
      if (!v->is_number()) fail("field `timeout_s` must be a number of seconds, got " + json_type_name(*v));
      else if (v->get<double>() <= 0)
        fail("field `timeout_s` must be > 0 (leave it out for no timeout)");
      else if (v->get<double>() > k_max_timeout_s)
        fail("field `timeout_s` must be at most 1e9 seconds (31 years; leave it out for no timeout)");
      else s.timeout_s = v->get<double>();
    }

    if (const json* v = get("after")) {
      if (!v->is_array()) {
        fail("field `after` must be an array of job names (same batch) or job ids");
      } else {
        for (const auto& d : *v) {
          if (d.is_string() && !d.get<std::string>().empty()) s.after.push_back({d.get<std::string>(), 0});
          else if (d.is_number_integer() && d.get<long long>() > 0) s.after.push_back({"", d.get<std::int64_t>()});
          else fail("field `after` entries must be job names or positive job ids, got " + d.dump().substr(0, 64));
        }
      }
    }

    string_map("env", s.env);
    for (const auto& [k, v] : s.env) {
      // A name a shell can export: what gpuq export --slurm writes as `export NAME=...` must not
      // turn into a command (a newline in a name did), nor confuse what reads the environment.
      bool identifier = !k.empty() && k.size() <= 256 && !std::isdigit(static_cast<unsigned char>(k[0]));
      for (char c : k) identifier = identifier && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
      if (!identifier)
        fail("field `env` has an invalid variable name " + json(k.substr(0, 64)).dump(-1, ' ', true, json::error_handler_t::replace) +
             ": a name is letters, digits and '_', not starting with a digit");
      else if (is_reserved_env(k))
        fail("field `env." + k + "` is set by gpuq for every job and cannot be overridden");
      else if (k.size() + 1 + v.size() + 1 > k_max_exec_string)
        fail("field `env." + k.substr(0, 64) + "` is " + std::to_string(v.size()) +
             " bytes; exec takes at most 128 KiB in one environment variable");
    }
    label_map(s.labels);

    if (string_field("cwd", s.cwd)) {
      if (s.cwd.empty() || s.cwd[0] != '/') fail("field `cwd` must be an absolute path, got \"" + s.cwd.substr(0, 128) + "\"");
    } else {
      s.cwd = default_cwd;
    }
    if (!s.report.empty() && s.report.rank >= s.ranks)
      fail("field `report.rank` is " + std::to_string(s.report.rank) + ", and the job has " + std::to_string(s.ranks) +
           " rank" + (s.ranks == 1 ? "" : "s") + " (0 is the first)");
    return s;
  }

 private:
  static std::string prefix_of(const json& obj, std::size_t index) {
    std::string prefix = "job[" + std::to_string(index) + "]";
    if (auto it = obj.find("name"); it != obj.end() && it->is_string())
      prefix += " (" + it->get<std::string>().substr(0, 64) + ")";
    return prefix;
  }

  std::vector<std::string>& m_errors;
  std::string m_prefix;
  FieldReader m_reader;
};

}  // namespace

Error invalid_spec_error(const std::vector<std::string>& errors) {
  std::ostringstream out;
  out << "invalid job spec (" << errors.size() << (errors.size() == 1 ? " problem" : " problems") << "):";
  for (std::size_t i = 0; i < errors.size() && i < 50; ++i) out << "\n  " << errors[i];
  if (errors.size() > 50) out << "\n  ... and " << errors.size() - 50 << " more";
  return {ErrorCode::invalid_spec, out.str()};
}

bool is_reserved_env(const std::string& key) {
  return std::find(k_reserved_env.begin(), k_reserved_env.end(), key) != k_reserved_env.end();
}

std::string_view to_string(Mode mode) { return mode == Mode::ddp ? "ddp" : "independent"; }

std::string_view to_string(MemBind bind) {
  return bind == MemBind::local ? "local" : bind == MemBind::prefer ? "prefer" : "none";
}

Result<JobSpec> parse_job(const json& obj, const std::string& default_cwd) {
  if (!obj.is_object()) return Error{ErrorCode::invalid_spec, "invalid job spec: expected an object, got " + json_type_name(obj)};
  std::vector<std::string> errors;
  JobParser p(obj, 0, errors);
  JobSpec spec = p.parse(default_cwd);
  if (!errors.empty()) return invalid_spec_error(errors);
  return spec;
}

namespace {
std::vector<std::string> dependency_problems(const std::vector<JobSpec>& batch,
                                             std::vector<std::vector<std::size_t>>& edges);
}  // namespace

Result<BatchParse> parse_batch_all(const json& submitted, const std::string& default_cwd) {
  auto expanded = expand_matrices(submitted, k_max_batch);
  if (!expanded) return expanded.error();
  const json& doc = *expanded;
  BatchParse out;
  auto& errors = out.problems;
  auto one = [&](const json& job, std::size_t i) {
    const std::size_t before = errors.size();
    if (job.is_object()) {
      JobParser p(job, i, errors);
      out.specs.push_back(p.parse(default_cwd));
    } else {
      errors.push_back("job[" + std::to_string(i) + "]: must be an object, got " + json_type_name(job));
      out.specs.emplace_back();
    }
    out.ok.push_back(errors.size() == before);
  };
  if (doc.is_object()) {
    one(doc, 0);
  } else if (doc.is_array()) {
    if (doc.empty()) return Error{ErrorCode::invalid_spec, "invalid job spec: the batch is empty"};
    if (doc.size() > k_max_batch)
      return Error{ErrorCode::invalid_spec, "invalid job spec: a batch holds at most " +
                                                std::to_string(k_max_batch) + " jobs"};
    for (std::size_t i = 0; i < doc.size(); ++i)
      one(doc[i], i);
  } else {
    return Error{ErrorCode::invalid_spec,
                 "invalid job spec: expected a job object or an array of jobs, got " + json_type_name(doc)};
  }
  // Names and `after` are only sure once every spec read whole: a job whose name did not parse
  // would make each job naming it look wrong too.
  if (errors.empty()) errors = dependency_problems(out.specs, out.local_deps);
  return out;
}

Result<std::vector<JobSpec>> parse_batch(const json& submitted, const std::string& default_cwd) {
  auto parsed = parse_batch_all(submitted, default_cwd);
  if (!parsed) return parsed.error();
  if (!parsed->problems.empty()) return invalid_spec_error(parsed->problems);
  return std::move(parsed->specs);
}

namespace {
// The batch's own dependencies (`after` by name) as edges, or the problems that keep them from
// being resolved: unknown or repeated names, a job depending on itself, a cycle.
std::vector<std::string> dependency_problems(const std::vector<JobSpec>& batch,
                                             std::vector<std::vector<std::size_t>>& edges) {
  std::vector<std::string> errors;
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].name.empty()) continue;
    auto [it, inserted] = by_name.emplace(batch[i].name, i);
    if (!inserted)
      errors.push_back("job[" + std::to_string(i) + "] (" + batch[i].name + "): name also used by job[" +
                       std::to_string(it->second) + "]; names in a batch must be unique");
  }
  edges.assign(batch.size(), {});
  for (std::size_t i = 0; i < batch.size(); ++i) {
    for (const auto& d : batch[i].after) {
      if (d.name.empty()) continue;
      auto it = by_name.find(d.name);
      if (it == by_name.end()) {
        errors.push_back("job[" + std::to_string(i) + "]" +
                         (batch[i].name.empty() ? "" : " (" + batch[i].name + ")") +
                         ": `after` names \"" + d.name.substr(0, 64) +
                         "\", which is not a job in this batch");
      } else if (it->second == i) {
        errors.push_back("job[" + std::to_string(i) + "] (" + batch[i].name + "): depends on itself");
      } else {
        edges[i].push_back(it->second);
      }
    }
  }
  if (!errors.empty()) return errors;

  // Cycle check: iterative DFS with colours; report one cycle by its names.
  std::vector<int> colour(batch.size(), 0);
  std::vector<std::size_t> parent(batch.size(), SIZE_MAX);
  for (std::size_t root = 0; root < batch.size(); ++root) {
    if (colour[root]) continue;
    std::vector<std::pair<std::size_t, std::size_t>> stack{{root, 0}};
    colour[root] = 1;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next == edges[node].size()) {
        colour[node] = 2;
        stack.pop_back();
        continue;
      }
      std::size_t to = edges[node][next++];
      if (colour[to] == 1) {
        // The stack holds the path from `to` down to `node`; closing the loop names the cycle.
        std::vector<std::size_t> path;
        for (std::size_t n = node;; n = parent[n]) {
          path.push_back(n);
          if (n == to) break;
        }
        std::string cycle;
        for (auto it = path.rbegin(); it != path.rend(); ++it) cycle += batch[*it].name + " -> ";
        return {"dependency cycle: " + cycle + batch[to].name};
      }
      if (colour[to] == 0) {
        colour[to] = 1;
        parent[to] = node;
        stack.push_back({to, 0});
      }
    }
  }
  return {};
}
}  // namespace

Result<std::vector<std::vector<std::size_t>>> resolve_batch_dependencies(const std::vector<JobSpec>& batch) {
  std::vector<std::vector<std::size_t>> edges;
  if (auto problems = dependency_problems(batch, edges); !problems.empty()) return invalid_spec_error(problems);
  return edges;
}

std::string format_cpu_list(const std::vector<int>& cores) {
  std::vector<int> c(cores);
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  std::string out;
  for (std::size_t i = 0; i < c.size();) {
    std::size_t j = i;
    while (j + 1 < c.size() && c[j + 1] == c[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(c[i]);
    if (j > i) out += "-" + std::to_string(c[j]);
    i = j + 1;
  }
  return out;
}

std::optional<std::vector<int>> parse_cpu_list(const std::string& text) {
  std::set<int> out;
  std::stringstream parts(text);
  for (std::string part; std::getline(parts, part, ',');) {
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.back()))) part.pop_back();
    if (part.empty()) continue;
    const auto dash = part.find('-');
    const std::string lo_text = part.substr(0, dash), hi_text = dash == std::string::npos ? lo_text : part.substr(dash + 1);
    auto number = [](const std::string& t) -> std::optional<int> {
      if (t.empty() || t.size() > 7 || t.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
      return std::stoi(t);
    };
    const auto lo = number(lo_text), hi = number(hi_text);
    if (!lo || !hi || *hi < *lo) return std::nullopt;
    for (int c = *lo; c <= *hi; ++c) out.insert(c);
  }
  return std::vector<int>(out.begin(), out.end());
}

json to_json(const JobSpec& s) {
  json j;
  if (!s.name.empty()) j["name"] = s.name;
  if (!s.train.is_null()) j["train"] = s.train;
  else if (!s.shell.empty()) j["shell"] = s.shell;
  else j["command"] = s.command;
  j["gpus"] = s.gpus;
  j["mode"] = to_string(s.mode);
  j["ranks"] = s.ranks;
  if (s.nodes > 1) j["nodes"] = s.nodes;
  if (s.cpus) j["cpus"] = s.cpus;
  if (s.mem_bind != MemBind::none) j["mem_bind"] = to_string(s.mem_bind);
  if (s.gpu_memory_mb) j["gpu_memory_mb"] = s.gpu_memory_mb;
  if (s.memory_mb) j["memory_mb"] = s.memory_mb;
  j["shared"] = s.shared;
  j["priority"] = s.priority;
  json after = json::array();
  for (const auto& d : s.after) after.push_back(d.name.empty() ? json(d.id) : json(d.name));
  j["after"] = after;
  j["retries"] = s.retries;
  if (s.retry_on_oom) j["retry_on_oom"] = true;
  if (s.timeout_s > 0) j["timeout_s"] = s.timeout_s;
  j["env"] = s.env;
  j["labels"] = s.labels;
  j["cwd"] = s.cwd;
  if (!s.on_finish.empty()) j["on_finish"] = s.on_finish;
  if (!s.on_preempt.empty()) j["on_preempt"] = s.on_preempt;
  if (s.placement == Placement::spread) j["placement"] = "spread";
  if (s.preemptible) j["preemptible"] = true;
  if (!s.preempt_signal.empty()) j["preempt_signal"] = s.preempt_signal;
  if (s.preempt_grace_s >= 0) j["preempt_grace_s"] = s.preempt_grace_s;
  if (s.preempt_mode != PreemptMode::auto_) j["preempt_mode"] = std::string(to_string(s.preempt_mode));
  if (s.gpu_memory_policy != MemoryPolicy::default_)
    j["gpu_memory_policy"] = std::string(to_string(s.gpu_memory_policy));
  if (!s.report.empty()) {
    json r = {{"rank", s.report.rank}};
    if (!s.report.progress.empty()) r["progress"] = s.report.progress;
    if (!s.report.result.empty()) r["result"] = s.report.result;
    if (!s.report.file.empty()) r["file"] = s.report.file;
    j["report"] = r;
  }
  return j;
}

namespace {
std::size_t exec_string_bytes(std::size_t length) { return length + 1 + sizeof(char*); }
}  // namespace

std::size_t exec_bytes(const std::map<std::string, std::string>& env) {
  std::size_t bytes = 0;
  for (const auto& [k, v] : env) bytes += exec_string_bytes(k.size() + 1 + v.size());
  return bytes;
}

std::string exec_size_problem(const JobSpec& s, std::size_t base_env_bytes) {
  std::size_t bytes = base_env_bytes + k_env_reserve_bytes;
  for (const auto& a : s.command) bytes += exec_string_bytes(a.size());
  bytes += exec_bytes(s.env);
  const long arg_max = ::sysconf(_SC_ARG_MAX);
  if (arg_max <= 0 || bytes <= static_cast<std::size_t>(arg_max)) return "";
  return "its command and environment come to " + std::to_string(bytes >> 10) + " KiB; exec takes at most " +
         std::to_string(arg_max >> 10) + " KiB in all (the submitter's environment is " +
         std::to_string(base_env_bytes >> 10) + " KiB of it)";
}

}  // namespace gpuq::common
