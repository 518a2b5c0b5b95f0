// Prometheus metrics: the text exposition format (version 0.0.4) that `gpuqd --metrics-listen`
// serves at /metrics and `--metrics-textfile` writes for node_exporter's textfile collector, and
// the counters and histograms gpuqd keeps for it. Names follow Prometheus' conventions (gpuq_
// prefix, _total counters, base units: _seconds, _bytes); label values are bounded sets (states,
// users, commands, error codes, GPUs, batches with jobs in line), never job ids. The writer is
// pure, for tests; metrics_text fills it (metrics.cpp; the list is docs/monitoring.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpuq::daemon {

using Labels = std::vector<std::pair<std::string, std::string>>;

// A Prometheus histogram: cumulative counts per upper bound, the sum and the count.
struct Histogram {
  explicit Histogram(std::vector<double> upper) : bounds(std::move(upper)), counts(bounds.size(), 0) {}
  void observe(double v);
  std::vector<double> bounds;
  std::vector<std::uint64_t> counts;  // observations <= bounds[i] (not yet cumulative)
  double sum = 0;
  std::uint64_t count = 0;
};

// What gpuqd counts between scrapes, since it started (Prometheus takes a restart's reset).
struct MetricCounters {
  std::map<std::string, std::uint64_t> requests;                             // command -> requests
  std::map<std::pair<std::string, std::string>, std::uint64_t> request_errors;  // (command, error code)
  std::uint64_t attempts_started = 0;
  std::uint64_t retries = 0;
  std::map<uid_t, std::uint64_t> preemptions;  // victim's owner -> attempts preempted (asked to stop)
  // Shared jobs found over their GPU memory budgets (gpu_budgets.hpp): stopped for the room their
  // GPU's other jobs were owed, or their budget raised in place; and CUDA out of memory requeues.
  std::uint64_t budget_stops = 0, budget_raises = 0, budget_oom_requeues = 0;
  std::map<std::pair<std::string, uid_t>, std::uint64_t> finished;  // (terminal state, owner) -> jobs
  // Seconds from queued to started, and of an attempt's run: from a second to days.
  Histogram queue_wait{{1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400}};
  Histogram run_time{{1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400}};
  // A scheduling pass, on gpuqd's thread: from 10 µs to a second.
  Histogram pass{{1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1}};
  double started_at = 0;  // wall clock, when gpuqd began its recovery: gpuq_start_time_seconds
};

// Writes the exposition text: each family's HELP and TYPE once, then its samples.
class Exposition {
 public:
  // A family's header; `type`: counter, gauge or histogram.
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, const Labels& labels, double value);
  // A histogram family's samples: _bucket{le=...} (cumulative, +Inf last), _sum, _count.
  void histogram(std::string_view name, const Labels& labels, const Histogram& h);
  const std::string& text() const { return m_text; }

 private:
  std::string m_text;
};

struct Reads;
class Hooks;
// The exposition of gpuqd's state at a scrape: what `r` reads (jobs, GPUs as `gpuq gpus` reports
// them, the store's size), the counters `c` (with when gpuqd started), the hooks running and waiting.
std::string metrics_text(const Reads& r, const MetricCounters& c, const Hooks& hooks);

// A label value as the format quotes it: backslash, double quote and newline escaped.
std::string escape_label_value(std::string_view v);
// A sample value as the format writes it: integers plainly, +Inf/-Inf/NaN by name.
std::string format_sample_value(double v);

}  // namespace gpuq::daemon
