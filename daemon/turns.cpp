// Users' requests taking turns on gpuqd's thread (turns.hpp).
#include "daemon/turns.hpp"

namespace gpuq::daemon {

void Turns::add(uid_t uid, std::function<void()> request) {
  auto& queue = m_queues[uid];
  if (queue.empty()) m_rotation.push_back(uid);
  queue.push_back(std::move(request));
  if (!std::exchange(m_posted, true)) boost::asio::post(m_executor, [self = shared_from_this()] { self->run_next(); });
}

std::size_t Turns::waiting() const {
  std::size_t n = 0;
  for (const auto& [uid, queue] : m_queues)
    n += queue.size();
  return n;
}

void Turns::run_next() {
  m_posted = false;
  if (m_rotation.empty()) return;
  const uid_t uid = m_rotation.front();
  m_rotation.pop_front();
  auto found = m_queues.find(uid);
  auto request = std::move(found->second.front());
  found->second.pop_front();
  if (found->second.empty())
    m_queues.erase(found);
  else
    m_rotation.push_back(uid);  // to the back of the rotation: every other user waiting goes first
  // The next turn is queued before this one runs: a request that posts work of its own (its
  // parts) gets no turn ahead of the others.
  if (!m_rotation.empty() && !std::exchange(m_posted, true))
    boost::asio::post(m_executor, [self = shared_from_this()] { self->run_next(); });
  request();
}

}  // namespace gpuq::daemon
