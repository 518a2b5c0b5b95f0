// The read-only requests (status, show, events, results) and `wait`, which answers once the jobs
// it names have ended.
#include "daemon/daemon.hpp"

#include <algorithm>

#include "common/paths.hpp"

namespace gpuq::daemon {

json Daemon::cmd_status(const Caller& caller, const common::StatusRequest& q) {
  common::JobsReply out;
  const auto& f = q.filter;
  out.total = m_store->count_jobs(f);
  std::size_t bytes = 0;
  if (q.all) {
    // One page more than asked tells whether another page follows.
    auto rows = m_store->page_after(q.after, q.page + 1, f);
    out.more = rows.size() > static_cast<std::size_t>(q.page);
    if (out.more) rows.pop_back();
    for (const auto& r : rows)
      if (!add_to_reply(out, r, bytes, caller)) break;
    return out;
  }
  const auto keep = [&](const JobRecord& r) {
    return f.empty() || common::matches(f, r.batch, r.state, r.spec.name);
  };
  // Without all, the lists are cut to the reply's bound (`more`), never paged: running jobs first,
  // then the queue's head, then the most recent ended jobs.
  for (std::int64_t id : m_running)
    if (keep(m_active.at(id).rec) && !add_to_reply(out, m_active.at(id).rec, bytes, caller)) break;
  // Queued jobs in line order, as many as asked: a deep queue need not travel whole, unless a
  // filter has its jobs counted. Held jobs are not in line: they come after it.
  std::int64_t shown = 0, kept = 0;
  const auto visit = [&](std::int64_t id) {  // false: the rest of the line need not be looked at
    const JobRecord& r = m_active.at(id).rec;
    if (!keep(r)) return true;
    ++kept;
    if ((q.queued >= 0 && shown >= q.queued) || out.more) return !f.empty();
    if (add_to_reply(out, r, bytes, caller)) ++shown;
    return true;
  };
  if (f.states.empty() || std::find(f.states.begin(), f.states.end(), JobState::queued) != f.states.end()) {
    bool more = true;
    for (auto it = m_queue.begin(); more && it != m_queue.end(); ++it) more = visit(it->second.job.id);
    for (auto it = m_held.begin(); more && it != m_held.end(); ++it) more = visit(*it);
  }
  out.queued_total = f.empty() ? static_cast<std::int64_t>(m_queue.size() + m_held.size()) : kept;
  for (auto& r : m_store->recent_finished(q.limit, f))
    if (!add_to_reply(out, r, bytes, caller)) break;
  std::sort(out.jobs.begin(), out.jobs.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  return out;
}

json Daemon::cmd_show(const Caller& caller, const common::IdRequest& q) {
  const JobRecord rec = existing_job(q.id);
  authorize(caller, rec, "read the details of");  // its environment, result and files
  common::ShowReply out;
  out.job = info_of(rec);
  if (auto it = m_batch_limits.find(rec.batch); it != m_batch_limits.end()) out.batch_max_running = it->second;
  out.spec = common::to_json(rec.spec);
  out.history = m_store->history(q.id);
  for (int a = 1; a <= rec.attempt; ++a)
    for (int r = 0; r < rec.spec.ranks; ++r) {
      std::string p = rank_log_path(attempt_dir(m_config.state_dir, q.id, a), r);
      if (common::path_exists(p)) out.logs.push_back({a, r, p});
    }
  out.first_failure = rec.run.first_failure;
  return out;
}

json Daemon::cmd_events(const Caller& caller, const common::EventsRequest& q) {
  const JobRecord rec = existing_job(q.id);
  authorize(caller, rec, "read the events of");
  const int attempts = rec.attempt;
  if (q.attempt > attempts)
    throw RequestError(ErrorCode::not_found, "job " + std::to_string(q.id) + " has " + std::to_string(attempts) +
                                                 " attempt(s); there is no attempt " + std::to_string(q.attempt));
  common::EventsReply out;
  out.id = q.id;
  out.attempt = q.attempt ? q.attempt : attempts;
  // One row more than asked tells whether another page follows.
  auto rows = m_store->events(q.id, out.attempt, q.after, q.page + 1, q.type);
  out.more = rows.size() > static_cast<std::size_t>(q.page);
  if (out.more) rows.pop_back();
  std::size_t bytes = 0;
  for (auto& e : rows) {
    if (bytes >= common::k_max_reply_bytes) {  // each event is under 1 MiB: the reply stays bounded
      out.more = true;
      break;
    }
    bytes += 64 + e.data.dump().size();
    out.events.push_back({e.seq, e.rank, e.type, e.at, std::move(e.data)});
  }
  return out;
}

json Daemon::cmd_results(const Caller& caller, const common::ResultsRequest& q) {
  if (q.ids.empty() && q.batch == 0) throw RequestError(ErrorCode::bad_request, "give job ids or a batch");
  // Every id named must exist (checked on the first page, with one index probe each: a client
  // polling many ids pages through them); then one page of them, in id order.
  std::vector<std::int64_t> ids = q.ids;  // ascending, each once
  if (q.after == 0)
    for (auto id : ids)
      if (!m_active.count(id) && !m_store->exists(id)) existing_job(id);  // not_found, saying why
  // Of the batch, only the page's worth after `after`: the union's first page lies within it.
  std::vector<JobRecord> batch_rows;
  if (q.batch) {
    if (m_store->batch_page(q.batch, 0, 1).empty()) jobs_of_batch(q.batch);  // not_found, saying why
    batch_rows = m_store->batch_page(q.batch, q.after, q.page + 1);
  }
  for (const auto& r : batch_rows) ids.push_back(r.id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  common::JobsReply out;
  std::size_t bytes = 0;
  int shown = 0;
  for (auto it = std::upper_bound(ids.begin(), ids.end(), q.after); it != ids.end(); ++it) {
    if (shown == q.page) {
      out.more = true;
      break;
    }
    auto row = std::lower_bound(batch_rows.begin(), batch_rows.end(), *it,
                                [](const JobRecord& r, std::int64_t id) { return r.id < id; });
    const bool in_batch = row != batch_rows.end() && row->id == *it;
    const JobRecord rec = in_batch ? *row : existing_job(*it);
    authorize(caller, rec, "read the result of");
    if (!add_to_reply(out, rec, bytes, caller)) break;
    ++shown;
  }
  return out;
}

void Daemon::cmd_wait(const Caller& caller, const common::IdsRequest& q, Reply& reply) {
  for (auto id : q.ids)  // all known, or no wait (one index probe each)
    if (!m_active.count(id) && !m_store->exists(id)) existing_job(id);
  std::set<std::int64_t> ids(q.ids.begin(), q.ids.end());
  Waiter w{caller, ids, ids, std::move(reply), nullptr};
  if (q.timeout_s > 0) {
    w.timer = std::make_shared<asio::steady_timer>(m_io);
    w.timer->expires_after(std::chrono::milliseconds(static_cast<long long>(q.timeout_s * 1000)));
    auto timer = w.timer;
    w.timer->async_wait([this, timer](const boost::system::error_code& ec) {
      if (ec) return;
      for (auto it = m_waiters.begin(); it != m_waiters.end(); ++it) {
        if (it->timer != timer) continue;
        common::JobsReply out;
        std::size_t bytes = 0;
        for (auto id : it->ids)
          if (auto rec = lookup(id); rec && !add_to_reply(out, *rec, bytes, it->caller)) break;
        out.timed_out = true;
        Reply r = std::move(it->reply);
        m_waiters.erase(it);
        r(common::ok_reply(out));
        return;
      }
    });
  }
  m_waiters.push_back(std::move(w));
  ++m_needs_changed;
  notify_waiters();
}

void Daemon::notify_waiters() {
  for (std::size_t i = 0; i < m_waiters.size();) {
    // Each id leaves `pending` once, so a wait on a whole batch costs O(1) per job that ends.
    auto& pending = m_waiters[i].pending;
    while (!pending.empty() && !m_active.count(*pending.begin())) pending.erase(pending.begin());
    if (!pending.empty()) {
      ++i;
      continue;
    }
    common::JobsReply out;
    std::size_t bytes = 0;
    for (auto id : m_waiters[i].ids)
      if (auto rec = m_store->get(id); rec && !add_to_reply(out, *rec, bytes, m_waiters[i].caller)) break;
    Waiter w = std::move(m_waiters[i]);
    m_waiters.erase(m_waiters.begin() + static_cast<std::ptrdiff_t>(i));
    if (w.timer) w.timer->cancel();
    w.reply(common::ok_reply(out));
  }
}

}  // namespace gpuq::daemon
