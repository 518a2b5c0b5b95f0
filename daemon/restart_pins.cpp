// The jobs restarts under way hold (restart_pins.hpp).
#include "daemon/restart_pins.hpp"

namespace gpuq::daemon {

bool RestartPins::pin(std::int64_t id, uid_t owner) {
  if (!m_pinned.emplace(id, owner).second) return false;
  ++m_by_owner[owner];
  return true;
}

void RestartPins::unpin(std::int64_t id) {
  const auto it = m_pinned.find(id);
  if (it == m_pinned.end()) return;
  if (--m_by_owner[it->second] == 0) m_by_owner.erase(it->second);
  m_pinned.erase(it);
}

std::int64_t RestartPins::pinned_of(uid_t owner) const {
  const auto it = m_by_owner.find(owner);
  return it == m_by_owner.end() ? 0 : it->second;
}

void RestartPins::release(std::int64_t id) {
  if (auto it = m_needed.find(id); it != m_needed.end()) m_needed.erase(it);
}

void RestartPins::for_each_pinned(const std::function<void(std::int64_t)>& f) const {
  for (const auto& [id, _] : m_pinned) f(id);
}

void RestartPins::for_each_needed(const std::function<void(std::int64_t)>& f) const {
  for (auto it = m_needed.begin(); it != m_needed.end(); it = m_needed.upper_bound(*it)) f(*it);
}

}  // namespace gpuq::daemon
