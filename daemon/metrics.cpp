// Prometheus metrics (metrics.hpp): the exposition writer, and metrics_text, which reads
// gpuqd's state at a scrape. Everything here is in memory but the NVML readings (as `gpuq gpus`
// takes them) and the store's size (a stat), so a scrape costs the daemon's thread little
// whatever the queue's depth: one walk over the jobs in line and running.
#include "daemon/metrics.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "daemon/config.hpp"
#include "daemon/hooks.hpp"
#include "daemon/reads.hpp"

namespace gpuq::daemon {

void Histogram::observe(double v) {
  for (std::size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) {
      ++counts[i];
      break;
    }
  sum += v;
  ++count;
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_sample_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  m_text.append("# HELP ").append(name).append(" ").append(help).append("\n");
  m_text.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void Exposition::sample(std::string_view name, const Labels& labels, double value) {
  m_text.append(name);
  if (!labels.empty()) {
    m_text += '{';
    for (std::size_t i = 0; i < labels.size(); ++i)
      m_text.append(i ? "," : "").append(labels[i].first).append("=\"").append(escape_label_value(labels[i].second)).append("\"");
    m_text += '}';
  }
  m_text.append(" ").append(format_sample_value(value)).append("\n");
}

void Exposition::histogram(std::string_view name, const Labels& labels, const Histogram& h) {
  const std::string base(name);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= h.bounds.size(); ++i) {
    cumulative += i < h.bounds.size() ? h.counts[i] : 0;
    Labels l = labels;
    l.emplace_back("le", i < h.bounds.size() ? format_sample_value(h.bounds[i]) : "+Inf");
    sample(base + "_bucket", l, static_cast<double>(i < h.bounds.size() ? cumulative : h.count));
  }
  sample(base + "_sum", labels, h.sum);
  sample(base + "_count", labels, static_cast<double>(h.count));
}

std::string metrics_text(const Reads& r, const MetricCounters& c, const Hooks& hooks) {
  Exposition e;
  e.family("gpuq_build_info", "gauge", "gpuqd's version and mode (always 1)");
  e.sample("gpuq_build_info", {{"version", GPUQ_VERSION}, {"multi_user", r.config.multi_user ? "true" : "false"},
                               {"executor", r.config.executor}},
           1);
  e.family("gpuq_start_time_seconds", "gauge", "When this gpuqd started (unix seconds)");
  e.sample("gpuq_start_time_seconds", {}, c.started_at);

  // Jobs in line and running, by state and user (held jobs and those waiting for a retry's
  // backoff or a dependency count as queued).
  std::map<std::pair<std::string, uid_t>, int> jobs;
  std::map<std::int64_t, std::pair<int, int>> batches;  // batch -> (queued, running)
  for (const auto& [id, a] : r.jobs.all()) {
    const bool running = a.rec.state == JobState::running;
    ++jobs[{running ? "running" : "queued", a.rec.uid}];
    if (a.rec.batch != 0) ++(running ? batches[a.rec.batch].second : batches[a.rec.batch].first);
  }
  // Both states of gpuqd's own user always: an empty queue is 0, not no data.
  jobs[{"queued", ::geteuid()}] += 0;
  jobs[{"running", ::geteuid()}] += 0;
  e.family("gpuq_jobs", "gauge", "Jobs queued (held, waiting or retrying included) and running, by user");
  for (const auto& [key, n] : jobs) e.sample("gpuq_jobs", {{"state", key.first}, {"user", r.users.name_of(key.second)}}, n);
  // Batches with jobs in line or running: the 50 largest, so a thousand sweeps make no thousand series.
  constexpr std::size_t k_max_batch_series = 50;
  std::vector<std::pair<std::int64_t, std::pair<int, int>>> big(batches.begin(), batches.end());
  std::stable_sort(big.begin(), big.end(), [](const auto& a, const auto& b) {
    return a.second.first + a.second.second > b.second.first + b.second.second;
  });
  if (big.size() > k_max_batch_series) big.resize(k_max_batch_series);
  e.family("gpuq_batch_jobs", "gauge", "Jobs queued and running of each batch with some (the 50 largest)");
  for (const auto& [batch, n] : big) {
    e.sample("gpuq_batch_jobs", {{"batch", std::to_string(batch)}, {"state", "queued"}}, n.first);
    e.sample("gpuq_batch_jobs", {{"batch", std::to_string(batch)}, {"state", "running"}}, n.second);
  }

  e.family("gpuq_attempts_started_total", "counter", "Job attempts started");
  e.sample("gpuq_attempts_started_total", {}, static_cast<double>(c.attempts_started));
  e.family("gpuq_jobs_finished_total", "counter", "Jobs that reached a terminal state, by state and user");
  std::set<uid_t> finishers{::geteuid()};  // every state of each user with any, and of gpuqd's own
  for (const auto& [key, n] : c.finished)
    finishers.insert(key.second);
  for (uid_t uid : finishers)
    for (const char* s : {"succeeded", "failed", "cancelled", "timed_out", "out_of_memory"}) {
      const auto it = c.finished.find({s, uid});
      e.sample("gpuq_jobs_finished_total", {{"state", s}, {"user", r.users.name_of(uid)}},
               it == c.finished.end() ? 0.0 : static_cast<double>(it->second));
    }
  e.family("gpuq_retries_total", "counter", "Failed attempts put back in line to be tried again");
  e.sample("gpuq_retries_total", {}, static_cast<double>(c.retries));
  e.family("gpuq_preemptions_total", "counter", "Running jobs asked to stop for a preemption, by their owner");
  std::set<uid_t> preempted{::geteuid()};  // gpuqd's own user always: the family has a sample from the start
  for (const auto& [uid, _] : c.preemptions)
    preempted.insert(uid);
  for (uid_t uid : preempted) {
    const auto it = c.preemptions.find(uid);
    e.sample("gpuq_preemptions_total", {{"user", r.users.name_of(uid)}},
             it == c.preemptions.end() ? 0.0 : static_cast<double>(it->second));
  }
  e.family("gpuq_gpu_budget_overruns_total", "counter",
           "Shared jobs found over their GPU memory budget (NVML), by what they got: stopped and requeued for the "
           "room their neighbours were owed, raised in place, or requeued after CUDA ran out of memory");
  e.sample("gpuq_gpu_budget_overruns_total", {{"action", "requeued"}}, static_cast<double>(c.budget_stops));
  e.sample("gpuq_gpu_budget_overruns_total", {{"action", "raised"}}, static_cast<double>(c.budget_raises));
  e.sample("gpuq_gpu_budget_overruns_total", {{"action", "cuda_oom"}}, static_cast<double>(c.budget_oom_requeues));
  e.family("gpuq_queue_wait_seconds", "histogram", "Time from queued to started, per attempt");
  e.histogram("gpuq_queue_wait_seconds", {}, c.queue_wait);
  e.family("gpuq_attempt_run_seconds", "histogram", "Run time of each attempt that ended");
  e.histogram("gpuq_attempt_run_seconds", {}, c.run_time);
  e.family("gpuq_schedule_pass_seconds", "histogram", "Duration of a scheduling pass on gpuqd's thread");
  e.histogram("gpuq_schedule_pass_seconds", {}, c.pass);

  // GPUs: gpuq's bookkeeping, NVML's readings, memory held outside gpuq: what `gpuq gpus` shows.
  const common::GpusReply gpus = queries::gpus(r);
  const bool nvml = r.inventory.source().rfind("nvml", 0) == 0;
  constexpr double mib = 1024.0 * 1024.0;
  struct Row {
    const char* name;
    const char* help;
  };
  const Row rows[] = {
      {"gpuq_gpu_memory_total_bytes", "GPU memory"},
      {"gpuq_gpu_memory_allocated_bytes", "GPU memory gpuq gave to jobs (declared by shared jobs, whole for exclusive ones)"},
      {"gpuq_gpu_memory_used_bytes", "GPU memory in use, as NVML reads it"},
      {"gpuq_gpu_memory_foreign_bytes", "GPU memory held by processes gpuq did not start (NVML)"},
      {"gpuq_gpu_utilization_ratio", "GPU busy fraction, as NVML reads it"},
      {"gpuq_gpu_jobs", "Jobs holding the GPU"},
      {"gpuq_gpu_drained", "1 while the GPU is out of service"},
  };
  for (std::size_t k = 0; k < std::size(rows); ++k) {
    e.family(rows[k].name, "gauge", rows[k].help);
    for (const auto& g : gpus.gpus) {
      const Labels l{{"gpu", std::to_string(g.index)}, {"uuid", g.uuid}};
      switch (k) {
        case 0: e.sample(rows[k].name, l, static_cast<double>(g.memory_total_mb) * mib); break;
        case 1: e.sample(rows[k].name, l, static_cast<double>(g.allocated_mb) * mib); break;
        case 2:
          if (g.memory_used_mb.is_number()) e.sample(rows[k].name, l, g.memory_used_mb.get<double>() * mib);
          break;
        case 3:
          if (nvml) e.sample(rows[k].name, l, static_cast<double>(g.foreign_mb) * mib);
          break;
        case 4:
          if (g.utilization.is_number()) e.sample(rows[k].name, l, g.utilization.get<double>() / 100.0);
          break;
        case 5: e.sample(rows[k].name, l, static_cast<double>(g.jobs.size())); break;
        default: e.sample(rows[k].name, l, g.drained ? 1 : 0);
      }
    }
  }
  e.family("gpuq_cpu_slots", "gauge", "CPU slots in the pool");
  e.sample("gpuq_cpu_slots", {}, gpus.cpu_slots);
  e.family("gpuq_cpu_slots_used", "gauge", "CPU slots held by running jobs");
  e.sample("gpuq_cpu_slots_used", {}, gpus.cpu_slots_used);

  // The store: its database and write-ahead log on disk.
  double bytes = 0;
  for (const char* suffix : {"", "-wal"}) {
    struct stat st {};
    if (::stat((r.config.state_dir + "/gpuq.db" + suffix).c_str(), &st) == 0) bytes += static_cast<double>(st.st_size);
  }
  e.family("gpuq_store_bytes", "gauge", "Size of gpuqd's database and its write-ahead log");
  e.sample("gpuq_store_bytes", {}, bytes);

  e.family("gpuq_hooks_running", "gauge", "Hooks (on_finish, on_preempt) running");
  e.sample("gpuq_hooks_running", {}, hooks.running());
  e.family("gpuq_hooks_waiting", "gauge", "Jobs whose hooks wait for a turn");
  e.sample("gpuq_hooks_waiting", {}, static_cast<double>(hooks.waiting()));

  e.family("gpuq_requests_total", "counter", "Client requests on the unix socket, by command");
  for (const auto& [cmd, n] : c.requests) e.sample("gpuq_requests_total", {{"command", cmd}}, static_cast<double>(n));
  e.family("gpuq_request_errors_total", "counter", "Client requests refused or failed, by command and error code");
  for (const auto& [key, n] : c.request_errors)
    e.sample("gpuq_request_errors_total", {{"command", key.first}, {"code", key.second}}, static_cast<double>(n));
  return e.text();
}

}  // namespace gpuq::daemon
