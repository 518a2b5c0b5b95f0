// Waits (waiters.hpp).
#include "daemon/waiters.hpp"

#include <algorithm>

namespace gpuq::daemon {

void Waiters::add(const Caller& caller, std::set<std::int64_t> ids, Later<common::JobsReply> reply, double timeout_s) {
  Wait w{caller, ids, ids, std::move(reply), nullptr};
  if (timeout_s > 0) {
    w.timer = std::make_shared<boost::asio::steady_timer>(m_io);
    w.timer->expires_after(std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000)));
    w.timer->async_wait([this, timer = std::weak_ptr(w.timer)](const boost::system::error_code& ec) {
      if (ec) return;
      const auto mine = timer.lock();
      const auto it = std::find_if(m_waits.begin(), m_waits.end(), [&](const Wait& x) { return x.timer == mine; });
      if (!mine || it == m_waits.end()) return;
      Wait done = std::move(*it);
      m_waits.erase(it);
      answer(done, true);
    });
  }
  m_waits.push_back(std::move(w));
}

void Waiters::notify(const std::function<bool(std::int64_t)>& active) {
  for (std::size_t i = 0; i < m_waits.size();) {
    auto& pending = m_waits[i].pending;
    while (!pending.empty() && !active(*pending.begin())) pending.erase(pending.begin());
    if (!pending.empty()) {
      ++i;
      continue;
    }
    Wait done = std::move(m_waits[i]);
    m_waits.erase(m_waits.begin() + static_cast<std::ptrdiff_t>(i));
    if (done.timer) done.timer->cancel();
    answer(done, false);
  }
}

void Waiters::answer(Wait& done, bool timed_out) {
  // Out of the list already: answered here whatever happens, the error if the answer cannot be
  // made (a store read that fails), so that no wait is left unanswered and no exception reaches
  // the request (another client's) that happened to end its jobs.
  try {
    done.reply(m_answer(done.caller, done.ids, timed_out));
  } catch (const std::exception& e) {
    done.reply.fail(error_of(e));
  }
}

std::size_t Waiters::abandon(std::uint64_t connection) {
  if (connection == 0) return 0;
  const auto gone =
      std::remove_if(m_waits.begin(), m_waits.end(), [&](const Wait& w) { return w.caller.connection == connection; });
  const auto n = static_cast<std::size_t>(m_waits.end() - gone);
  m_waits.erase(gone, m_waits.end());  // their timers go with them, cancelled
  return n;
}

void Waiters::came_back(std::int64_t id) {
  for (auto& w : m_waits)
    if (w.ids.count(id)) w.pending.insert(id);
}

bool Waiters::names(std::int64_t id) const {
  return std::any_of(m_waits.begin(), m_waits.end(), [&](const Wait& w) { return w.ids.count(id) > 0; });
}

void Waiters::for_each_named(const std::function<void(std::int64_t)>& f) const {
  for (const auto& w : m_waits)
    for (auto id : w.ids) f(id);
}

}  // namespace gpuq::daemon
