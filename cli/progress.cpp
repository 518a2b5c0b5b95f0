// Progress lines for live waits; see progress.hpp.
#include "cli/progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
  std::string line = std::to_string(job.id) + "  " + job.name + "  ";
  if (job.state != "running") {
    line += job.state;
    if (job.state == "queued" && job.attempt > 0) line += " (retrying)";
    if (job.state == "succeeded" && job.result.is_object()) line += "  " + format_fields(job.result, 4);
    else if (!job.reason.empty()) line += "  " + job.reason;
  } else {
    line += progress_text(job, now, 20);
  }
  if (line.size() > width && width > 3) line = line.substr(0, width - 3) + "...";
  return line;
}

}  // namespace gpuq::cli
