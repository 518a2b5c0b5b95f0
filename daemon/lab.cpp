// Lab mode's rules for users (docs/lab.md): their limits (user_limits, max_priority), fair share's
// memory of their GPU use, and `usage`, which shows both. Who may act on a job is daemon.cpp's
// authorize; the order users' jobs start in is scheduler.hpp's fair_order.
#include <algorithm>
#include <cmath>

#include "daemon/daemon.hpp"

namespace gpuq::daemon {

const common::UserLimit* Daemon::limits_of(uid_t uid) const {
  if (!m_config.multi_user || m_config.user_limits.empty()) return nullptr;
  auto it = m_config.user_limits.find(name_of(uid));
  if (it == m_config.user_limits.end()) it = m_config.user_limits.find("*");
  return it == m_config.user_limits.end() ? nullptr : &it->second;
}

double Daemon::recent_use(uid_t uid, double now) const {
  auto it = m_usage.find(uid);
  if (it == m_usage.end()) return 0;
  return it->second.gpu_s * std::exp2(-std::max(0.0, now - it->second.at) / m_config.usage_half_life_s);
}

void Daemon::add_use(uid_t uid, double gpu_s, double at) {
  if (!m_config.multi_user) return;
  Usage& u = m_usage[uid];
  u.gpu_s = recent_use(uid, at) + gpu_s;
  u.at = at;
}

void Daemon::check_user_limits(const Caller& caller, uid_t owner, const std::vector<JobRecord>& jobs) {
  if (!m_config.multi_user) return;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    check_priority(caller, jobs[i].spec.priority, "job[" + std::to_string(i) + "] (" + jobs[i].spec.name + "): ");
  const common::UserLimit* l = limits_of(owner);
  if (!l) return;
  if (l->max_gpus > 0)
    for (std::size_t i = 0; i < jobs.size(); ++i)
      if (jobs[i].spec.gpus > l->max_gpus)
        throw RequestError(ErrorCode::forbidden, "job[" + std::to_string(i) + "] (" + jobs[i].spec.name + "): asks for " +
                                                     std::to_string(jobs[i].spec.gpus) + " GPUs; " + name_of(owner) +
                                                     " may hold at most " + std::to_string(l->max_gpus) +
                                                     " at once (max_gpus), so it could never start");
  if (l->max_queued > 0) {
    const std::int64_t mine = queued_or_running(owner);
    if (mine + static_cast<std::int64_t>(jobs.size()) > l->max_queued)
      throw RequestError(ErrorCode::forbidden, name_of(owner) + " has " + std::to_string(mine) +
                                                   " jobs queued or running; " + std::to_string(jobs.size()) +
                                                   " more would pass their limit (max_queued " +
                                                   std::to_string(l->max_queued) + "); nothing was submitted");
  }
}

std::int64_t Daemon::queued_or_running(uid_t owner) const {
  std::int64_t mine = 0;
  for (const auto& [_, a] : m_active) mine += a.rec.uid == owner;
  const auto pinned = m_restarting_by_uid.find(owner);
  return mine + (pinned == m_restarting_by_uid.end() ? 0 : pinned->second);
}

void Daemon::check_restart_limits(const std::map<std::int64_t, JobRecord>& chosen) const {
  if (!m_config.multi_user) return;
  std::map<uid_t, std::int64_t> restarting;  // this restart's jobs, by owner
  for (const auto& [_, rec] : chosen) ++restarting[rec.uid];
  for (const auto& [owner, n] : restarting) {
    const common::UserLimit* l = limits_of(owner);
    if (!l || l->max_queued <= 0) continue;
    const std::int64_t all = queued_or_running(owner);  // this restart's jobs are pinned, so counted
    if (all > l->max_queued)
      throw RequestError(ErrorCode::forbidden, name_of(owner) + " has " + std::to_string(all - n) +
                                                   " jobs queued or running; restarting " + std::to_string(n) +
                                                   " more would pass their limit (max_queued " +
                                                   std::to_string(l->max_queued) + "); nothing was restarted");
  }
}

void Daemon::check_priority(const Caller& caller, int priority, const std::string& who) const {
  if (!m_config.multi_user || !m_config.max_priority || caller.admin || priority <= *m_config.max_priority) return;
  throw RequestError(ErrorCode::forbidden, who + "priority " + std::to_string(priority) +
                                               " is above this machine's ceiling (max_priority " +
                                               std::to_string(*m_config.max_priority) + "); higher priorities are an admin's");
}

json Daemon::cmd_usage() {
  const double now = wall_now();
  std::map<uid_t, common::UserUsage> users;
  const auto row = [&](uid_t uid) -> common::UserUsage& {
    auto [it, fresh] = users.try_emplace(uid);
    if (fresh) {
      it->second.uid = uid;
      it->second.user = name_of(uid);
      if (const auto* l = limits_of(uid)) {
        it->second.max_running = l->max_running;
        it->second.max_gpus = l->max_gpus;
        it->second.max_queued = l->max_queued;
      }
    }
    return it->second;
  };
  for (const auto& [uid, _] : m_usage) row(uid).gpu_hours = recent_use(uid, now) / 3600;
  for (const auto& [id, a] : m_active) {
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
