// The job table (job_table.hpp).
#include "daemon/job_table.hpp"

namespace gpuq::daemon {

PendingJob pending_of(const JobRecord& r) {
  const auto& s = r.spec;
  return {r.id,
          s.priority,
          s.gpus,
          s.shared,
          gpu_budget_mb(r),
          s.timeout_s,
          s.ranks,
          s.cpus,
          r.batch,
          r.uid,
          s.placement == common::Placement::spread};
}

Active* JobTable::find(std::int64_t id) {
  auto it = m_active.find(id);
  return it == m_active.end() ? nullptr : &it->second;
}

const Active* JobTable::find(std::int64_t id) const {
  auto it = m_active.find(id);
  return it == m_active.end() ? nullptr : &it->second;
}

std::optional<JobState> JobTable::known_state(std::int64_t id) const {
  if (const Active* a = find(id)) return a->rec.state;
  if (auto it = m_ended.find(id); it != m_ended.end()) return it->second;
  return std::nullopt;
}

JobTable::Applied JobTable::apply(JobRecord rec,
                                  const std::function<void(Active&, std::optional<JobState>, const JobRecord&)>& before) {
  Active& a = m_active[rec.id];
  const bool fresh = a.rec.id == 0;  // new to the table: a job coming back (restart)
  Applied out{fresh ? std::nullopt : std::optional<JobState>(a.rec.state), false, false};
  if (before) before(a, out.was, rec);
  if (!fresh && a.rec.state == JobState::running && rec.state == JobState::running) {
    // Still running (its events, an update of its priority): filed as it was, so that a walk over
    // the running jobs may change them.
    a.rec = std::move(rec);
    return out;
  }
  if (!fresh) unfile(a.rec);  // as it was filed: an update may have changed its priority
  a.rec = std::move(rec);
  if (is_terminal(a.rec.state)) {
    const std::int64_t id = a.rec.id;
    // Remembered while a queued job waits on something; once none does, forgotten (the store
    // answers a later lookup): a history of ended jobs costs no memory here.
    if (!m_with_deps.empty())
      m_ended[id] = a.rec.state;
    else if (!m_ended.empty())
      decltype(m_ended)().swap(m_ended);  // clear() keeps the buckets
    m_active.erase(id);
    out.ended = true;
    return out;
  }
  if (fresh) {  // it had ended: dependencies see it live again
    m_ended.erase(a.rec.id);
    out.came_back = true;
  }
  file(a);
  return out;
}

Active& JobTable::load(JobRecord rec, double queued_since) {
  Active& a = m_active[rec.id];
  a.rec = std::move(rec);
  a.queued_since = queued_since;
  file(a);
  return a;
}

void JobTable::add(std::map<std::int64_t, Active>& staged) {
  if (staged.empty()) return;
  const std::int64_t first = staged.begin()->first;
  m_active.merge(staged);
  for (auto it = m_active.find(first); it != m_active.end(); ++it) file(it->second);
}

void JobTable::file(const Active& a) {
  if (a.rec.state == JobState::running) m_running.insert(a.rec.id);
  if (a.rec.state != JobState::queued) return;
  // A held job is out of line, but still fails when a dependency does.
  if (!a.rec.after.empty() && m_with_deps.insert(a.rec.id).second) ++m_needs_changed;
  if (a.rec.held)
    m_held.insert(a.rec.id);
  else
    m_queue[{-a.rec.spec.priority, a.rec.id}] = {pending_of(a.rec), a.rec.not_before, !a.rec.after.empty()};
}

void JobTable::unfile(const JobRecord& r) {
  m_running.erase(r.id);
  m_queue.erase({-r.spec.priority, r.id});
  m_with_deps.erase(r.id);
  m_held.erase(r.id);
}

std::optional<int> JobTable::batch_limit(std::int64_t batch) const {
  const auto it = m_batch_limits.find(batch);
  return it == m_batch_limits.end() ? std::nullopt : std::optional<int>(it->second);
}

void JobTable::set_batch_limit(std::int64_t batch, int max_running) {
  if (max_running > 0) m_batch_limits[batch] = max_running;
  else m_batch_limits.erase(batch);
}

}  // namespace gpuq::daemon
