// `usage` (lab mode's users: their limits, fair share's memory of their GPU use and what they hold
// now). The rules themselves are users.hpp's; who may
// act on a job is daemon.cpp's authorize; the order users' jobs start in is scheduler.hpp's fair_order.
#include <algorithm>
#include <cmath>

#include "daemon/daemon.hpp"

namespace gpuq::daemon {

json Daemon::cmd_usage() {
  const double now = wall_now();
  std::map<uid_t, common::UserUsage> users;
  const auto row = [&](uid_t uid) -> common::UserUsage& {
    auto [it, fresh] = users.try_emplace(uid);
    if (fresh) {
      it->second.uid = uid;
      it->second.user = m_users.name_of(uid);
      if (const auto* l = m_users.limits_of(uid)) {
        it->second.max_running = l->max_running;
        it->second.max_gpus = l->max_gpus;
        it->second.max_queued = l->max_queued;
      }
    }
    return it->second;
  };
  for (const auto& [uid, used] : m_users.recent_uses(now)) row(uid).gpu_hours = used / 3600;
  for (const auto& [id, a] : m_jobs.all()) {
    auto& u = row(a.rec.uid);
    if (a.rec.state == JobState::running) {
      ++u.running;
      u.gpus += static_cast<int>(a.rec.run.gpus.size());
      u.gpu_hours += static_cast<double>(a.rec.run.gpus.size()) * std::max(0.0, now - a.rec.run.started_at) / 3600;
    } else {
      ++u.queued;
    }
  }
  common::UsageReply out{m_config.multi_user, m_config.usage_half_life_s, {}};
  for (auto& [_, u] : users) out.users.push_back(std::move(u));
  std::stable_sort(out.users.begin(), out.users.end(),
                   [](const auto& a, const auto& b) { return a.gpu_hours < b.gpu_hours; });
  return out;
}

}  // namespace gpuq::daemon
