// Unread replies, bounded (outbox.hpp).
#include "daemon/outbox.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <iostream>
#include <utility>

namespace gpuq::daemon {

Outbox::Key Outbox::open(uid_t uid, std::function<void()> drop, bool counted) {
  const Key k = m_next++;
  m_entries.emplace(k, Entry{uid, 0, 0, std::move(drop), counted});
  ++m_connections[uid];
  if (counted) ++m_counted;
  return k;
}

void Outbox::forget(Key k) {
  auto it = m_entries.find(k);
  if (it == m_entries.end()) return;
  sent(k, it->second.bytes);
  auto c = m_connections.find(it->second.uid);
  if (--c->second == 0) m_connections.erase(c);
  if (it->second.counted) --m_counted;
  m_entries.erase(it);
}

std::size_t Outbox::connections_of(uid_t uid) const {
  auto it = m_connections.find(uid);
  return it == m_connections.end() ? 0 : it->second;
}

std::size_t Outbox::unsent_of(uid_t uid) const {
  auto it = m_by_user.find(uid);
  return it == m_by_user.end() ? 0 : it->second;
}

Outbox::Key Outbox::oldest_of(uid_t uid) const {
  Key best = 0;
  std::uint64_t since = 0;
  for (const auto& [k, e] : m_entries)
    if (e.uid == uid && e.bytes > 0 && (best == 0 || e.since < since)) best = k, since = e.since;
  return best;
}

void Outbox::drop(Key k, const std::string& why) {
  auto it = m_entries.find(k);
  const uid_t uid = it->second.uid;
  const std::size_t held = it->second.bytes;
  auto close = std::move(it->second.drop);
  forget(k);  // before the connection goes: its bytes are no one's now
  ++m_dropped;
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (now - m_said_at >= 10) {
    m_said_at = now;
    std::cerr << "gpuqd: closed a connection of uid " << uid << " holding " << (held >> 10)
              << " KiB of replies it had not read or of a request not yet whole (" << why << "; " << m_dropped
              << " closed so far)\n";
  }
  if (close) close();
}

bool Outbox::add(Key k, std::size_t bytes) {
  auto it = m_entries.find(k);
  if (it == m_entries.end()) return false;
  const uid_t uid = it->second.uid;
  while (unsent_of(uid) + bytes > m_per_user) {
    const Key victim = oldest_of(uid);
    if (victim == 0) break;  // none holds anything: one reply over the bound alone, let through
    drop(victim, "a user's connections may hold " + std::to_string(m_per_user >> 20) + " MiB of them");
    if (victim == k) return false;
  }
  while (m_total + bytes > m_total_limit) {
    uid_t most = uid;
    for (const auto& [u, n] : m_by_user)
      if (n > unsent_of(most)) most = u;
    const Key victim = oldest_of(most);
    if (victim == 0) break;
    drop(victim, "all connections may hold " + std::to_string(m_total_limit >> 20) + " MiB of them");
    if (victim == k) return false;
  }
  Entry& e = m_entries.at(k);
  if (bytes == 0) return true;
  if (e.bytes == 0) e.since = ++m_seq;
  e.bytes += bytes;
  m_by_user[uid] += bytes;
  m_total += bytes;
  return true;
}

void Outbox::sent(Key k, std::size_t bytes) {
  auto it = m_entries.find(k);
  if (it == m_entries.end() || bytes == 0) return;
  Entry& e = it->second;
  bytes = std::min(bytes, e.bytes);
  e.bytes -= bytes;
  m_total -= bytes;
  auto u = m_by_user.find(e.uid);
  if ((u->second -= bytes) == 0) m_by_user.erase(u);
}

}  // namespace gpuq::daemon
