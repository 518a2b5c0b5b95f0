// Progress lines for live waits; see progress.hpp.
#include "cli/progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "cli/format.hpp"

namespace gpuq::cli {

namespace {

double number(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number() ? it->get<double>() : std::nan("");
}

std::string rate(double per_s) {
  char buf[32];
  if (per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", per_s / 1e6);
  else if (per_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", per_s);
  return buf;
}

}  // namespace

std::optional<double> fraction_done(const nlohmann::json& progress) {
  if (!progress.is_object()) return std::nullopt;
  const double step = number(progress, "step"), total_steps = number(progress, "total_steps");
  if (std::isfinite(step) && std::isfinite(total_steps) && total_steps > 0)
    return std::clamp(step / total_steps, 0.0, 1.0);
  const double epoch = number(progress, "epoch"), epochs = number(progress, "epochs");
  if (std::isfinite(epoch) && std::isfinite(epochs) && epochs > 0) return std::clamp(epoch / epochs, 0.0, 1.0);
  return std::nullopt;
}

std::string progress_text(const common::JobInfo& job, double now, int bar) {
  std::string line;
  const auto& p = job.progress;
  const auto done = fraction_done(p);
  if (done) {
    const int filled = static_cast<int>(std::lround(*done * bar));
    line += "[" + std::string(filled, '#') + std::string(bar - filled, '-') + "] " +
            std::to_string(static_cast<int>(std::lround(*done * 100))) + "%  ";
  } else {
    line += "running  ";
  }
  if (p.is_object()) {
    const double epoch = number(p, "epoch"), epochs = number(p, "epochs"), step = number(p, "step");
    const double loss = number(p, "loss"), per_s = number(p, "samples_per_s");
    if (std::isfinite(epoch))
      line += "epoch " + format_value(epoch) + (std::isfinite(epochs) ? "/" + format_value(epochs) : "") + "  ";
    if (std::isfinite(step)) line += "step " + format_value(step) + "  ";
    if (std::isfinite(loss)) line += "loss " + format_value(loss) + "  ";
    if (std::isfinite(per_s)) line += rate(per_s) + " samples/s  ";
  }
  const double elapsed = job.started_at > 0 ? now - job.started_at : 0;
  if (done && *done > 0.01 && elapsed > 0) line += "ETA " + format_duration(elapsed * (1 - *done) / *done) + "  ";
  return line + format_duration(elapsed);
}

std::string progress_line(const common::JobInfo& job, double now, std::size_t width) {
  std::string line = std::to_string(job.id) + "  " + printable(job.name) + "  ";
  if (job.state != JobState::running) {
    line += name_of(job.state);
    if (const std::string shown = display_state(job); shown != name_of(job.state)) line += " (" + shown + ")";
    if (job.state == JobState::succeeded && job.result.is_object()) line += "  " + format_fields(job.result, 4);
    else if (!job.reason.empty()) line += "  " + printable(job.reason);
  } else {
    line += progress_text(job, now, 20);
  }
  if (line.size() > width && width > 3) line = line.substr(0, width - 3) + "...";
  return line;
}

std::vector<std::string> wait_screen(const std::vector<common::JobInfo>& jobs, double now, double since,
                                     std::size_t width, std::size_t rows) {
  std::vector<std::string> lines;
  rows = std::max<std::size_t>(rows, 2);
  if (jobs.size() <= rows) {
    for (const auto& j : jobs) lines.push_back(progress_line(j, now, width));
    return lines;
  }
  std::map<std::string, std::size_t> count;
  std::size_t ended = 0, ended_since = 0;
  for (const auto& j : jobs) {
    count[name_of(j.state)]++;
    if (j.state == JobState::queued || j.state == JobState::running) continue;
    ++ended;
    ended_since += j.ended_at >= since;
  }
  const double done = static_cast<double>(ended) / static_cast<double>(jobs.size());
  constexpr int k_bar = 20;
  const int filled = static_cast<int>(std::lround(done * k_bar));
  std::string head = std::to_string(jobs.size()) + " jobs  [" + std::string(filled, '#') +
                     std::string(k_bar - filled, '-') + "] " + std::to_string(static_cast<int>(done * 100)) + "%";
  for (const char* state : {"succeeded", "failed", "out_of_memory", "timed_out", "cancelled", "running", "queued"})
    if (count[state]) head += "  " + std::to_string(count[state]) + " " + state;
  const std::size_t left = jobs.size() - ended;
  if (ended_since > 0 && left > 0 && now > since)
    head += "  ETA " + format_duration(static_cast<double>(left) * (now - since) / static_cast<double>(ended_since));
  if (head.size() > width && width > 3) head = head.substr(0, width - 3) + "...";
  lines.push_back(head);

  // Then what needs an eye: the running jobs, then the failed ones, newest first.
  std::vector<const common::JobInfo*> shown;
  for (const auto& j : jobs)
    if (j.state == JobState::running) shown.push_back(&j);
  std::vector<const common::JobInfo*> failed;
  for (const auto& j : jobs)
    if (j.state == JobState::failed || j.state == JobState::timed_out || j.state == JobState::out_of_memory)
      failed.push_back(&j);
  std::sort(failed.begin(), failed.end(), [](const auto* a, const auto* b) { return a->ended_at > b->ended_at; });
  shown.insert(shown.end(), failed.begin(), failed.end());
  const std::size_t room = rows - 1;
  const bool cut = shown.size() > room;
  for (std::size_t i = 0; i < shown.size() && i < (cut ? room - 1 : room); ++i)
    lines.push_back(progress_line(*shown[i], now, width));
  if (cut) lines.push_back("... and " + std::to_string(shown.size() - (room - 1)) + " more running or failed");
  return lines;
}

}  // namespace gpuq::cli
