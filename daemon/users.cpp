// Users: callers, accounts, lab mode's limits and fair share's memory (users.hpp).
#include "daemon/users.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace gpuq::daemon {

Caller Caller::self() { return {::getuid(), true}; }

bool may_read_details(const Caller& viewer, uid_t owner) {
  return viewer.admin || viewer.uid == owner;
}
bool may_read_details(const Caller& viewer, const JobRecord& r) {
  return may_read_details(viewer, r.uid);
}

Users::Users(Rules rules) : Users(std::move(rules), Directory{}) {}

Users::Users(Rules rules, Directory directory) : m_rules(std::move(rules)), m_directory(std::move(directory)) {}

Result<Caller> Users::identify(uid_t uid, std::chrono::steady_clock::time_point now) const {
  if (!m_rules.multi_user) {
    if (uid == ::getuid() || uid == 0) return Caller{uid, true};
    return Error{ErrorCode::forbidden, "gpuqd serves only its own user (uid " + std::to_string(::getuid()) +
                                           ") and root, not uid " + std::to_string(uid) +
                                           "; a machine shared by several users runs one `gpuqd --multi-user` (docs/lab.md)"};
  }
  Caller c{uid, uid == 0};
  if (c.admin || !m_rules.admin_gid) return c;
  auto& [admin, until] = m_admins[uid];
  if (until <= now) {
    auto account = m_directory.account(uid);
    admin = account && std::find(account->groups.begin(), account->groups.end(), *m_rules.admin_gid) != account->groups.end();
    until = now + std::chrono::seconds(60);
  }
  c.admin = admin;
  return c;
}

const std::string& Users::name_of(uid_t uid) const {
  auto it = m_names.find(uid);
  if (it == m_names.end()) it = m_names.emplace(uid, m_directory.name(uid)).first;
  return it->second;
}

const common::Account* Users::account(uid_t uid) {
  auto known = m_accounts.find(uid);
  if (known == m_accounts.end())  // its jobs were submitted before gpuqd's last start
    if (auto found = m_directory.account(uid)) known = m_accounts.emplace(uid, std::move(*found)).first;
  return known != m_accounts.end() ? &known->second : nullptr;
}

void Users::remember(common::Account a) {
  const uid_t uid = a.uid;
  m_accounts[uid] = std::move(a);
}

const common::UserLimit* Users::limits_of(uid_t uid) const {
  if (!m_rules.multi_user || m_rules.user_limits.empty()) return nullptr;
  auto it = m_rules.user_limits.find(name_of(uid));
  if (it == m_rules.user_limits.end()) it = m_rules.user_limits.find("*");
  return it == m_rules.user_limits.end() ? nullptr : &it->second;
}

double Users::recent_use(uid_t uid, double now) const {
  auto it = m_use.find(uid);
  if (it == m_use.end()) return 0;
  return it->second.gpu_s * std::exp2(-std::max(0.0, now - it->second.at) / m_rules.usage_half_life_s);
}

void Users::add_use(uid_t uid, double gpu_s, double at) {
  if (!m_rules.multi_user) return;
  Use& u = m_use[uid];
  u.gpu_s = recent_use(uid, at) + gpu_s;
  u.at = at;
}

std::vector<std::pair<uid_t, double>> Users::recent_uses(double now) const {
  std::vector<std::pair<uid_t, double>> out;
  for (const auto& [uid, _] : m_use) out.emplace_back(uid, recent_use(uid, now));
  return out;
}

void Users::check_submission(const Caller& caller, uid_t owner, const std::vector<JobRecord>& jobs, const Count& queued) const {
  if (!m_rules.multi_user) return;
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
    const std::int64_t mine = queued(owner);
    if (mine + static_cast<std::int64_t>(jobs.size()) > l->max_queued)
      throw RequestError(ErrorCode::forbidden, name_of(owner) + " has " + std::to_string(mine) +
                                                   " jobs queued or running; " + std::to_string(jobs.size()) +
                                                   " more would pass their limit (max_queued " +
                                                   std::to_string(l->max_queued) + "); nothing was submitted");
  }
}

void Users::check_restart(const std::map<std::int64_t, JobRecord>& chosen, const Count& queued) const {
  if (!m_rules.multi_user) return;
  std::map<uid_t, std::int64_t> restarting;  // this restart's jobs, by owner
  for (const auto& [_, rec] : chosen) ++restarting[rec.uid];
  for (const auto& [owner, n] : restarting) {
    const common::UserLimit* l = limits_of(owner);
    if (!l || l->max_queued <= 0) continue;
    const std::int64_t all = queued(owner);  // this restart's jobs are pinned, so counted
    if (all > l->max_queued)
      throw RequestError(ErrorCode::forbidden, name_of(owner) + " has " + std::to_string(all - n) +
                                                   " jobs queued or running; restarting " + std::to_string(n) +
                                                   " more would pass their limit (max_queued " +
                                                   std::to_string(l->max_queued) + "); nothing was restarted");
  }
}

void Users::check_priority(const Caller& caller, int priority, const std::string& who) const {
  if (!m_rules.multi_user || !m_rules.max_priority || caller.admin || priority <= *m_rules.max_priority) return;
  throw RequestError(ErrorCode::forbidden, who + "priority " + std::to_string(priority) +
                                               " is above this machine's ceiling (max_priority " +
                                               std::to_string(*m_rules.max_priority) + "); higher priorities are an admin's");
}

}  // namespace gpuq::daemon
