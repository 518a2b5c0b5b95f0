// Hang watch (hang_watch.hpp).
#include "daemon/hang_watch.hpp"

#include <iostream>

namespace gpuq::daemon {

std::vector<std::int64_t> HangWatch::check(double now, const std::vector<const JobRecord*>& running,
                                           const std::function<bool(const JobRecord&)>& gpus_busy) {
  std::vector<std::int64_t> stop;
  if (m_after_s <= 0 || now - m_checked < 1) return stop;
  m_checked = now;
  for (const JobRecord* job : running) {
    const JobRecord& r = *job;
    const auto at = r.run.progress.is_object() ? r.run.progress.find("at") : r.run.progress.end();
    // Judged only once it has said how it progresses, and on this attempt.
    // Frozen for another job (a suspension), it is silent by design: its silence counts from its thaw.
    const bool silent = at != r.run.progress.end() && at->is_number() && at->get<double>() >= r.run.started_at &&
                        r.run.suspended_for == 0 && now - std::max(at->get<double>(), r.run.resumed_at) > m_after_s;
    if (!silent || (!r.run.gpus.empty() && gpus_busy(r))) {  // busy GPUs say it still works, quietly
      m_hung.erase(r.id);
      continue;
    }
    if (!m_hung.insert(r.id).second) continue;
    std::cerr << "gpuqd: job " << r.id << " (" << r.spec.name << ") " << note(r, now)
              << (m_retry ? "; stopping it, to be retried" : "") << "\n";
    if (m_retry && !r.run.cancel_requested && m_stopped.insert(r.id).second) stop.push_back(r.id);
  }
  return stop;
}

std::string HangWatch::note(const JobRecord& r, double now) const {
  if (!m_hung.count(r.id)) return "";
  const double at = r.run.progress.value("at", now);
  std::string where;
  for (const char* key : {"epoch", "step"})
    if (auto it = r.run.progress.find(key); it != r.run.progress.end() && it->is_number())
      where += std::string(where.empty() ? " at " : ", ") + key + " " + it->dump();
  return "no progress for " + std::to_string(static_cast<long long>(now - at)) + " s since its last progress event" +
         where + " (hang_after_s " + std::to_string(static_cast<long long>(m_after_s)) + "): it may be hung";
}

std::string HangWatch::ended(const JobRecord& r, double now) {
  std::string said = m_stopped.erase(r.id) ? "stopped: " + note(r, now) : "";
  m_hung.erase(r.id);
  return said;
}

}  // namespace gpuq::daemon
