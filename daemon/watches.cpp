// Watches (watches.hpp).
#include "daemon/watches.hpp"

#include <algorithm>
#include <chrono>

namespace gpuq::daemon {

bool Watches::concerns(const Caller& caller, const common::WatchRequest& q, const Change& c) {
  if (q.batch != 0 && c.batch != q.batch) return false;
  if (!q.ids.empty() && !std::binary_search(q.ids.begin(), q.ids.end(), c.id)) return false;
  // Another user's progress is not news to one who may not read it (may_read_details).
  return visible(caller, c);
}

std::int64_t Watches::dropped_for(const Caller& caller) const {
  if (caller.admin) return m_dropped_any;
  const auto it = m_dropped_details.find(caller.uid);
  return std::max(m_dropped_state, it == m_dropped_details.end() ? 0 : it->second);
}

std::int64_t Watches::visible_head(const Caller& caller) const {
  for (auto it = m_journal.rbegin(); it != m_journal.rend(); ++it)
    if (visible(caller, *it)) return m_head - (it - m_journal.rbegin());
  return dropped_for(caller);
}

void Watches::file(std::uint64_t key, const common::WatchRequest& q, bool in) {
  const auto unfile = [key](auto& index, std::int64_t at) {
    auto [from, to] = index.equal_range(at);
    for (auto it = from; it != to; ++it)
      if (it->second == key) return void(index.erase(it));
  };
  if (!q.ids.empty()) {
    for (auto id : q.ids)
      in ? void(m_by_id.emplace(id, key)) : unfile(m_by_id, id);
  } else if (q.batch != 0) {
    in ? void(m_by_batch.emplace(q.batch, key)) : unfile(m_by_batch, q.batch);
  } else {
    in ? void(m_open.insert(key)) : void(m_open.erase(key));
  }
}

void Watches::changed(const Change& c) {
  m_journal.push_back(c);
  ++m_head;
  if (m_journal.size() > m_capacity) {
    const Change& gone = m_journal.front();
    const std::int64_t seq = m_head - static_cast<std::int64_t>(m_journal.size()) + 1;
    m_dropped_any = seq;
    if (gone.kind == Kind::state)
      m_dropped_state = seq;
    else
      m_dropped_details[gone.uid] = seq;
    m_journal.pop_front();
  }
  bool due = false;
  const auto touch = [&](std::uint64_t key) {
    Held& h = m_held.at(key);
    if (h.due || !concerns(h.caller, h.q, c)) return;
    // Every change since it was held was of no concern to it: its answer starts at this one, so a
    // long run of those before it never resets it.
    h.due = due = true;
    h.q.after = m_head - 1;
  };
  for (auto [it, to] = m_by_id.equal_range(c.id); it != to; ++it)
    touch(it->second);
  for (auto [it, to] = m_by_batch.equal_range(c.batch); it != to; ++it)
    touch(it->second);
  for (auto key : m_open)
    touch(key);
  if (due && !std::exchange(m_posted, true)) boost::asio::post(m_io, [this] { answer_due(); });
}

std::optional<common::WatchReply> Watches::look(const Caller& caller, const common::WatchRequest& q) {
  common::WatchReply out;
  out.epoch = m_epoch;
  const std::int64_t first = m_head - static_cast<std::int64_t>(m_journal.size()) + 1;  // the oldest kept
  // A cursor of another run, or from the future, or one the journal dropped changes after that the
  // caller may see: read afresh. So is no cursor at all (a client's first request, which learns the
  // cursor to watch from).
  if (q.epoch != m_epoch || q.after > m_head || (q.after < first - 1 && dropped_for(caller) > q.after)) {
    out.cursor = visible_head(caller);
    out.reset = true;
    return out;
  }
  // Each job once, in the order of its first change; one more than a page says there is more. The
  // cursor moves over what the caller may see only: how much else changed is not its to know.
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> before;  // the cursor before ids[i]: the last change it may see ahead of it
  std::set<std::int64_t> seen;
  std::int64_t cursor = q.after;
  const std::size_t page = static_cast<std::size_t>(std::max(q.page, 1));
  for (std::int64_t seq = std::max(q.after + 1, first); seq <= m_head && ids.size() <= page; ++seq) {
    const Change& c = m_journal[static_cast<std::size_t>(seq - first)];
    if (concerns(caller, q, c) && seen.insert(c.id).second) {
      ids.push_back(c.id);
      before.push_back(cursor);
    }
    if (visible(caller, c) && ids.size() <= page) cursor = seq;
  }
  if (ids.empty() && q.timeout_s > 0) return std::nullopt;
  out.cursor = cursor;
  if (ids.empty()) return out;
  const bool over_page = ids.size() > page;
  if (over_page) ids.pop_back();  // `before` keeps its cursor: where the next page begins
  const std::size_t took = std::min(m_answer(caller, ids, out), ids.size());
  // Cut short: the next request starts at the first job not taken, so none is missed (those taken
  // that change again after it are sent again, as they are then).
  if (took < ids.size() || over_page) {
    out.cursor = before[took];
    out.more = true;
  }
  return out;
}

void Watches::add(const Caller& caller, const common::WatchRequest& q, Later<common::WatchReply> reply) {
  std::optional<common::WatchReply> now;
  try {
    now = look(caller, q);
  } catch (const std::exception& e) {  // the request is this owner's to answer now
    return reply.fail(error_of(e));
  }
  if (now) {
    ++m_answers;
    return reply(*now);
  }
  const std::uint64_t key = m_next_key++;
  Held& h =
      m_held.emplace(key, Held{caller, q, std::move(reply), std::make_unique<boost::asio::steady_timer>(m_io), false})
          .first->second;
  file(key, h.q, true);
  h.timer->expires_after(std::chrono::milliseconds(static_cast<long long>(q.timeout_s * 1000)));
  h.timer->async_wait([this, key](const boost::system::error_code& ec) {
    if (!ec) answer(key);
  });
}

void Watches::answer_due() {
  m_posted = false;
  std::vector<std::uint64_t> due;
  for (const auto& [key, h] : m_held)
    if (h.due) due.push_back(key);
  for (auto key : due)
    answer(key);
}

std::size_t Watches::abandon(std::uint64_t connection) {
  if (connection == 0) return 0;
  std::vector<std::uint64_t> keys;
  for (const auto& [key, h] : m_held)
    if (h.caller.connection == connection) keys.push_back(key);
  for (auto key : keys) {
    auto it = m_held.find(key);
    file(key, it->second.q, false);
    it->second.timer->cancel();
    m_held.erase(it);
  }
  return keys.size();
}

void Watches::answer(std::uint64_t key) {
  const auto it = m_held.find(key);
  if (it == m_held.end()) return;  // answered already
  Held h = std::move(it->second);
  m_held.erase(it);
  file(key, h.q, false);
  ++m_answers;
  h.timer->cancel();
  // Out of the list already: answered here whatever happens, with the error if the answer cannot
  // be made (a store read that fails), so that no watch is left unanswered.
  try {
    std::optional<common::WatchReply> out;
    if (h.due) out = look(h.caller, h.q);
    if (!out) {  // its time is up with nothing for it: on to the last change it may see
      out.emplace();
      out->epoch = m_epoch;
      out->cursor = std::max(h.q.after, visible_head(h.caller));
    }
    h.reply(*out);
  } catch (const std::exception& e) {
    h.reply.fail(error_of(e));
  }
}

}  // namespace gpuq::daemon
