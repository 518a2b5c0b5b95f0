// Watches (watches.hpp).
#include "daemon/watches.hpp"

#include <algorithm>
#include <chrono>
#include <set>

namespace gpuq::daemon {

bool Watches::concerns(const Caller& caller, const common::WatchRequest& q, const Change& c) const {
  if (q.batch != 0 && c.batch != q.batch) return false;
  if (!q.ids.empty() && !std::binary_search(q.ids.begin(), q.ids.end(), c.id)) return false;
  // Another user's progress is not news to one who may not read it (may_read_details).
  return c.kind == Kind::state || caller.admin || caller.uid == c.uid;
}

void Watches::changed(const Change& c) {
  m_journal.push_back(c);
  ++m_head;
  if (m_journal.size() > m_capacity) m_journal.pop_front();
  bool due = false;
  for (auto& [_, h] : m_held) {
    if (h.due) continue;
    if (!concerns(h.caller, h.q, c)) {
      h.q.after = m_head;  // nothing for it so far: a long run of others' changes never resets it
      continue;
    }
    h.due = due = true;
  }
  if (due && !std::exchange(m_posted, true)) boost::asio::post(m_io, [this] { answer_due(); });
}

std::optional<common::WatchReply> Watches::look(const Caller& caller, const common::WatchRequest& q) {
  common::WatchReply out;
  out.epoch = m_epoch;
  out.cursor = m_head;
  const std::int64_t first = m_head - static_cast<std::int64_t>(m_journal.size()) + 1;  // the oldest kept
  // A cursor of another run, from the future, or older than the journal: read afresh. So is no
  // cursor at all (a client's first request, which learns the cursor to watch from).
  if (q.epoch != m_epoch || q.after > m_head || q.after < first - 1) {
    out.reset = true;
    return out;
  }
  // Each job once, in the order of its first change; one more than a page says there is more.
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> first_seq;  // of ids[i]
  std::set<std::int64_t> seen;
  const std::size_t page = static_cast<std::size_t>(std::max(q.page, 1));
  for (std::int64_t seq = q.after + 1; seq <= m_head && ids.size() <= page; ++seq) {
    const Change& c = m_journal[static_cast<std::size_t>(seq - first)];
    if (!concerns(caller, q, c) || !seen.insert(c.id).second) continue;
    ids.push_back(c.id);
    first_seq.push_back(seq);
  }
  if (ids.empty()) return q.timeout_s > 0 ? std::nullopt : std::optional(out);
  const bool over_page = ids.size() > page;
  if (over_page) ids.pop_back();  // first_seq keeps its first change: where the next page begins
  const std::size_t took = std::min(m_answer(caller, ids, out), ids.size());
  // Cut short: the next request starts at the first job not taken, so none is missed (those taken
  // that change again after it are sent again, as they are then).
  if (took < ids.size() || over_page) {
    out.cursor = first_seq[took] - 1;
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
  h.q.after = m_head;
  h.timer->expires_after(std::chrono::milliseconds(static_cast<long long>(q.timeout_s * 1000)));
  h.timer->async_wait([this, key](const boost::system::error_code& ec) {
    if (!ec) answer(key, true);
  });
}

void Watches::answer_due() {
  m_posted = false;
  std::vector<std::uint64_t> due;
  for (const auto& [key, h] : m_held)
    if (h.due) due.push_back(key);
  for (auto key : due)
    answer(key, false);
}

void Watches::answer(std::uint64_t key, bool timed_out) {
  const auto it = m_held.find(key);
  if (it == m_held.end()) return;  // answered already
  Held h = std::move(it->second);
  m_held.erase(it);
  ++m_answers;
  h.timer->cancel();
  if (timed_out) h.q.timeout_s = 0;  // what there is now, nothing included
  // Out of the list already: answered here whatever happens, with the error if the answer cannot
  // be made (a store read that fails), so that no watch is left unanswered.
  try {
    auto out = look(h.caller, h.q);
    if (!out) {  // due, but what concerned it is gone from what it may see: nothing, at the head
      out.emplace();
      out->epoch = m_epoch;
      out->cursor = m_head;
    }
    h.reply(*out);
  } catch (const std::exception& e) {
    h.reply.fail(error_of(e));
  }
}

}  // namespace gpuq::daemon
