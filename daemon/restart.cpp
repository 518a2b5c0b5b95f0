// `gpuq restart`: ended jobs queued again under their own ids (as Slurm's requeue), with the jobs
// that failed waiting for them, in parts, so that requeueing a failed 20,000-job chain holds no
// other client up (it held gpuqd's thread for 0.5 to 1 s in one go).
//
// A restart goes in three steps, each a part (~10 ms) per turn of gpuqd's loop:
//   choose   the named jobs and a batch's ended ones, then, transitively, the jobs that failed
//            waiting for one of them (the dependency closure); then the check that every job
//            outside it that they wait for has not failed. Nothing is changed until it passes.
//   clear    with --fresh, their checkpoints are moved into the trash.
//   requeue  their new records are written, dependencies first, a part per transaction, and go
//            live as they are written.
// From the moment a job is chosen until its part is written it is pinned (restart_pins.hpp): no
// other restart takes it and no clean touches it, nor a job outside that it will wait for. Every
// part leaves a consistent queue: a requeued job waits only for jobs that are live or succeeded.
// The plan is stored with the first of several parts, so a restart that gpuqd's death cut short
// is finished at its next start (Restarter::resume); a later part that cannot be written is tried
// again until it can, since the earlier ones are already live.
#include <algorithm>
#include <iostream>
#include <queue>
#include <set>

#include "daemon/restarter.hpp"

#include "daemon/launcher.hpp"
#include "daemon/lifecycle.hpp"
#include "daemon/parts.hpp"

namespace gpuq::daemon {

std::int64_t queued_or_running(const JobTable& jobs, const RestartPins& pins, uid_t owner) {
  std::int64_t mine = 0;
  for (const auto& [_, a] : jobs.all()) mine += a.rec.uid == owner;
  return mine + pins.pinned_of(owner);
}

Restarter::Restarter(boost::asio::io_context& io, std::string state_dir, Store& store, JobTable& jobs, RestartPins& pins,
                     Trash& trash, const Users& users, Needs needs)
    : m_io(io),
      m_state_dir(std::move(state_dir)),
      m_store(store),
      m_jobs(jobs),
      m_pins(pins),
      m_trash(trash),
      m_users(users),
      m_needs(std::move(needs)) {}

namespace {

// The chosen jobs in an order that requeues each after the chosen jobs it waits for, and
// otherwise in id (line) order (a batch may name a later job of its own in `after`). A cycle
// cannot be submitted; were one there, its jobs would follow in id order.
std::vector<std::int64_t> dependencies_first(const std::map<std::int64_t, JobRecord>& chosen) {
  std::vector<std::int64_t> ids;  // ascending: a job's place here is its index below
  ids.reserve(chosen.size());
  for (const auto& [id, _] : chosen) ids.push_back(id);
  std::vector<std::pair<std::size_t, std::size_t>> edges;  // (dependency, dependent)
  std::size_t i = 0;
  for (const auto& [id, rec] : chosen) {
    for (auto dep : rec.after)
      if (auto it = std::lower_bound(ids.begin(), ids.end(), dep); it != ids.end() && *it == dep && *it != id)
        edges.emplace_back(static_cast<std::size_t>(it - ids.begin()), i);
    ++i;
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  std::vector<int> waits(ids.size());
  for (const auto& e : edges) ++waits[e.second];
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (waits[k] == 0) ready.push(k);
  std::vector<std::int64_t> order;
  order.reserve(ids.size());
  while (!ready.empty()) {
    const std::size_t k = ready.top();
    ready.pop();
    order.push_back(ids[k]);
    for (auto e = std::lower_bound(edges.begin(), edges.end(), std::pair<std::size_t, std::size_t>{k, 0});
         e != edges.end() && e->first == k; ++e)
      if (--waits[e->second] == 0) ready.push(e->second);
  }
  for (std::size_t k = 0; k < ids.size(); ++k)
    if (waits[k] > 0) order.push_back(ids[k]);
  return order;
}

}  // namespace

// Restarting a job takes along the jobs that failed waiting for it, whoever owns them: they failed
// only for its failure.
void Restarter::start(const Caller& caller, const common::RestartRequest& q, Later<common::RestartReply>& reply) {
  std::vector<JobRecord> named;
  for (auto id : q.ids) {
    named.push_back(m_needs.reads().ended_job(id, "only a job that has ended can be restarted"));
    m_needs.reads().authorize(caller, named.back(), "restart");
  }
  if (q.batch != 0 && !m_store.batch_exists(q.batch)) throw m_needs.reads().missing_batch(q.batch);
  m_needs.reads().authorize_batch(caller, q.batch, "restart the batch of");
  if (q.fresh) m_trash.make();
  auto r = std::make_shared<Restarting>();
  try {
    for (auto& rec : named) choose(*r, std::move(rec), 0);
  } catch (const RequestError&) {
    for (const auto& [id, _] : r->chosen) m_pins.unpin(id);
    throw;
  }
  r->fresh = q.fresh;
  r->batch = q.batch;
  r->reply = std::move(reply);
  part(r);
}

void Restarter::resume() {
  for (auto& plan : m_store.unfinished_restarts()) {
    auto r = std::make_shared<Restarting>();
    r->step = Restarting::Step::requeue;
    for (std::size_t i = plan.done; i < plan.jobs.size(); ++i) {
      const auto rec = m_store.get(plan.jobs[i].first);
      m_pins.pin(plan.jobs[i].first, rec ? rec->uid : 0);
    }
    std::cerr << "gpuqd: finishing a restart of " << plan.jobs.size() << " job(s) that stopped after "
              << plan.done << " of them\n";
    r->plan = std::move(plan);
    boost::asio::post(m_io, [this, r] { part(r); });
  }
}

void Restarter::part(const std::shared_ptr<Restarting>& r) {
  using Step = Restarting::Step;
  try {
    switch (r->step) {
      case Step::choose:
        if (choose_part(*r)) r->step = r->fresh ? Step::clear : Step::requeue;
        break;
      case Step::clear:
        if (clear_part(*r)) r->step = Step::requeue;
        break;
      case Step::requeue:
        if (r->plan.done > 0 && paused_between_parts(m_io, [this, r] { part(r); })) return;
        if (requeue_part(*r)) return done(*r);
        break;
    }
  } catch (const std::exception& e) {
    const auto* request_error = dynamic_cast<const RequestError*>(&e);
    const ErrorCode code = request_error ? request_error->code() : ErrorCode::internal;
    if (r->plan.done > 0) {  // some jobs are live already: the rest must follow, once the store can be written
      std::cerr << "gpuqd: a restart could not requeue its jobs after the first " << r->plan.done << " of "
                << r->plan.jobs.size() << " (" << e.what() << "); trying again in " << k_write_retry_s << " s\n";
      auto timer = std::make_shared<boost::asio::steady_timer>(m_io, std::chrono::milliseconds(static_cast<int>(k_write_retry_s * 1000)));
      timer->async_wait([this, r, timer](const boost::system::error_code& ec) {
        if (!ec) part(r);
      });
      return;
    }
    for (const auto& [id, _] : r->chosen) m_pins.unpin(id);
    release_outside(*r);
    m_trash.empty(std::move(r->moved));
    const bool store = code == ErrorCode::store_error;
    if (r->reply) r->reply.fail(code, std::string(e.what()) + (store ? "; nothing was restarted" : ""));
    return;
  }
  boost::asio::post(m_io, [this, r] { part(r); });
}

void Restarter::done(Restarting& r) {
  release_outside(r);
  if (!r.reply) return;
  auto& out = r.out;
  std::sort(out.jobs.begin(), out.jobs.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  out.total = static_cast<std::int64_t>(out.jobs.size());
  for (const auto& j : out.jobs) {
    ++out.was[j.was];
    out.along += j.with != 0;
  }
  out.more = out.jobs.size() > static_cast<std::size_t>(common::k_max_reply_jobs);  // the reply stays small
  if (out.more) out.jobs.resize(common::k_max_reply_jobs);
  r.reply(out);
}

void Restarter::release_outside(Restarting& r) {
  for (auto dep : r.outside) m_pins.release(dep);
  if (!r.outside.empty()) m_jobs.need_changed();
  r.outside.clear();
}

// One job more for the restart; throws when another restart has it.
void Restarter::choose(Restarting& r, JobRecord rec, std::int64_t along) {
  const std::int64_t id = rec.id;
  if (r.chosen.count(id)) return;
  if (!rec.spec_error.empty())  // it has no command to run: refused before anything is pinned
    throw RequestError(ErrorCode::wrong_state, unreadable_refusal(rec, "be restarted"));
  if (!m_pins.pin(id, rec.uid))
    throw RequestError(ErrorCode::wrong_state, job_label(rec) + " is being restarted by another request under way");
  if (along) r.with[id] = along;
  r.frontier.push_back(id);
  r.chosen.emplace(id, std::move(rec));
}

bool Restarter::choose_part(Restarting& r) {
  const auto deadline = part_deadline();
  const auto part_over = [&] { return std::chrono::steady_clock::now() >= deadline; };
  while (r.batch != 0) {  // its jobs that ended without success, a page (~1 ms) at a time
    auto page = m_store.batch_page(r.batch, r.batch_after, 64);
    for (auto& rec : page)
      if (is_terminal(rec.state) && rec.state != JobState::succeeded) choose(r, std::move(rec), 0);
    if (page.size() < 64) r.batch = 0;
    else r.batch_after = page.back().id;
    if (part_over()) return false;
  }
  // Then, transitively, the jobs that failed waiting for one of them.
  for (std::size_t looked = 1; !r.frontier.empty(); ++looked) {
    const std::int64_t id = r.frontier.back();
    r.frontier.pop_back();
    for (auto& dep : m_store.failed_waiting_for(id)) choose(r, std::move(dep), id);
    if (looked % 16 == 0 && part_over()) return false;
  }
  // All or nothing: no job is requeued to wait for one that failed and stays failed.
  std::set<std::int64_t> outside;
  for (const auto& [id, rec] : r.chosen)
    for (auto dep : rec.after) {
      if (r.chosen.count(dep)) continue;
      auto st = m_needs.reads().dependency_state(dep);
      if (!st || (is_terminal(*st) && *st != JobState::succeeded))
        throw RequestError(ErrorCode::wrong_state,
                           job_label(rec) + " waits for " +
                               (st ? "job " + std::to_string(dep) + ", which ended " + std::string(to_string(*st)) +
                                         ": restart that job too (the jobs that failed waiting for it come with it)"
                                   : m_needs.reads().missing_job(dep) + ", so it cannot run again"));
      outside.insert(dep);
    }
  m_users.check_restart(r.chosen, [this](uid_t u) { return queued_or_running(m_jobs, m_pins, u); });  // max_queued, as at submit
  r.outside.assign(outside.begin(), outside.end());
  for (auto dep : r.outside) m_pins.need(dep);  // kept from clean --forget until requeued
  if (!r.outside.empty()) m_jobs.need_changed();
  for (auto id : dependencies_first(r.chosen)) {
    const auto w = r.with.find(id);
    r.plan.jobs.emplace_back(id, w != r.with.end() ? w->second : 0);
  }
  return true;
}

bool Restarter::clear_part(Restarting& r) {
  const auto deadline = part_deadline();
  for (; r.cleared < r.plan.jobs.size(); ++r.cleared) {
    if (r.cleared % 64 == 0 && r.cleared > 0 && std::chrono::steady_clock::now() >= deadline) return false;
    const std::int64_t id = r.plan.jobs[r.cleared].first;
    if (auto to = m_trash.move(id, job_dir(m_state_dir, id) + "/checkpoints", true); !to.empty())
      r.moved.emplace_back(id, std::move(to));
  }
  m_trash.empty(std::move(r.moved));
  r.moved.clear();
  return true;
}

bool Restarter::requeue_part(Restarting& r) {
  // A part is as many jobs as took ~10 ms last time: its cost is mostly the one write at its end.
  const std::size_t begin = r.plan.done;
  const std::size_t end = std::min(r.plan.jobs.size(), begin + (parts_hooked() ? 64 : r.part_jobs));
  const auto started = std::chrono::steady_clock::now();
  std::vector<JobRecord> requeued;  // of the part's jobs, those still there to requeue
  std::vector<std::string> why;     // for their history; while queued a job shows why it waits
  std::vector<common::RestartOutcome> outcomes;  // the reply's, once written
  for (std::size_t i = begin; i < end; ++i) {
    const auto [id, along] = r.plan.jobs[i];
    std::optional<JobRecord> stored;  // a restart resumed at start has only ids
    const auto it = r.chosen.find(id);
    if (it == r.chosen.end()) stored = m_store.get(id);
    const JobRecord* rec = it != r.chosen.end() ? &it->second : stored ? &*stored : nullptr;
    if (!rec || !is_terminal(rec->state)) continue;  // forgotten, or (only ever a hand-edited store) not ended
    if (!rec->spec_error.empty()) {  // only in a restart resumed at start (choose refuses one): it stays ended
      std::cerr << "gpuqd: " << job_label(*rec) << " is not restarted: its stored spec does not parse ("
                << rec->spec_error << ")\n";
      continue;
    }
    why.push_back(along ? "restarted with job " + std::to_string(along)
                        : "restarted (it had ended " + std::string(to_string(rec->state)) + ")");
    outcomes.push_back({id, std::string(to_string(rec->state)), along});
    requeued.push_back(next_record(*rec, event::Restarted{}));
  }
  m_needs.land(std::move(requeued), [&](const std::vector<const JobRecord*>& rows) {
    m_store.write_restart_part(r.plan, rows, why, end - begin);  // with how far the plan is, even with no rows
  });
  r.out.jobs.insert(r.out.jobs.end(), outcomes.begin(), outcomes.end());
  for (std::size_t i = begin; i < end; ++i) {
    m_pins.unpin(r.plan.jobs[i].first);
    r.chosen.erase(r.plan.jobs[i].first);
  }
  m_needs.schedule_soon();
  const auto took = std::chrono::steady_clock::now() - started;
  const double per_job = std::chrono::duration<double>(took).count() / static_cast<double>(std::max<std::size_t>(1, end - begin));
  r.part_jobs = std::clamp<std::size_t>(static_cast<std::size_t>(std::chrono::duration<double>(k_part).count() / std::max(per_job, 1e-7)),
                                        64, 65536);
  return r.plan.done >= r.plan.jobs.size();
}

}  // namespace gpuq::daemon
