// What the last scheduling pass said (last_pass.hpp).
#include "daemon/last_pass.hpp"

namespace gpuq::daemon {

void LastPass::remember(Plan& plan) {
  m_stopped = plan.stopped;
  m_tail = plan.tail;
  m_at_limit = std::move(plan.at_limit);
  m_users_at_limit = std::move(plan.users_at_limit);
  m_reservations = plan.reservations;
}

std::string LastPass::wait_reason(const Active& a, const std::string& owner,
                                  const std::function<std::string(int, std::string)>& drain_note) const {
  const JobRecord& r = a.rec;
  if (a.reason_pass == m_number || r.state != JobState::queued) return a.wait_reason;
  // Passed over without a word: for its batch's limit, its user's, or behind where the pass stopped.
  if (const BatchLimit* limit = batch_at_limit(r.batch)) return batch_limit_reason(r.batch, *limit);
  if (const UserCap* cap = user_at_limit(r.uid); cap && daemon::user_at_limit(*cap, r.spec.gpus))
    return user_limit_reason(owner, *cap, r.spec.gpus);
  if (m_stopped) return drain_note(r.spec.gpus, tail_wait_reason(pending_of(r), m_tail));
  return a.wait_reason;  // (as of an earlier pass)
}

const BatchLimit* LastPass::batch_at_limit(std::int64_t batch) const {
  auto it = m_at_limit.find(batch);
  return it == m_at_limit.end() ? nullptr : &it->second;
}

const UserCap* LastPass::user_at_limit(std::uint32_t uid) const {
  auto it = m_users_at_limit.find(uid);
  return it == m_users_at_limit.end() ? nullptr : &it->second;
}

}  // namespace gpuq::daemon
