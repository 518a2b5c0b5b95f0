// Running jobs: the scheduling pass (which queued jobs start, on what; the attempts' owner,
// attempts.hpp, launches them and records their ends), and landing every change of a record
// (commit, land, apply). Their event files are the event tick's (event_tick.hpp).
#include "daemon/daemon.hpp"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "daemon/dependencies.hpp"
#include "daemon/lifecycle.hpp"
#include "daemon/pass_inputs.hpp"
#include "daemon/preemption.hpp"

namespace gpuq::daemon {

// ---- scheduling ---------------------------------------------------------------------------------

void Daemon::schedule_now() {
  m_last_pass.begin();
  const auto pass_began = std::chrono::steady_clock::now();
  struct Timed {  // however the pass ends
    MetricCounters& m;
    std::chrono::steady_clock::time_point began;
    ~Timed() { m.pass.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count()); }
  } timed{m_metrics, pass_began};
  const double now = wall_now();
  if (dependencies::fail_blocked(reads(), commit_fn(), now)) m_pacer.soon();  // more to fail, in the next pass
  try {
    m_attempts.thaw_lent(now);       // suspended jobs whose borrower has ended go on
  } catch (const RequestError& e) {  // thawed, not stored: a pass soon stores it
    std::cerr << "gpuqd: cannot record a thaw: " << e.what() << "\n";
    m_pacer.at(now + k_write_retry_s, now);
  }

  std::vector<PendingJob> queue;
  queue.reserve(m_jobs.queue().size());
  BatchLimits limits;  // of the batches with a job in this pass
  std::int64_t seen_batch = 0;  // a batch's jobs lie together in line: its limit is looked up once a run
  double next_retry = 0;
  for (const auto& [_, q] : m_jobs.queue()) {
    if (q.has_deps || q.not_before > now) {
      Active& a = m_jobs.at(q.job.id);
      bool deps_done = true;
      for (auto dep : a.rec.after) deps_done = deps_done && dependencies::met(reads(), dep);
      if (!deps_done) {
        m_last_pass.say(a, "waiting for dependencies");
        continue;
      }
      if (q.not_before > now) {
        m_last_pass.say(a, "retrying after a backoff");
        next_retry = next_retry == 0 ? q.not_before : std::min(next_retry, q.not_before);
        continue;
      }
    }
    queue.push_back(q.job);  // in scheduling order already
    if (q.job.batch != seen_batch && !m_jobs.batch_limits().empty()) {
      seen_batch = q.job.batch;
      if (const auto limit = m_jobs.batch_limit(seen_batch)) limits[seen_batch].limit = *limit;
    }
  }
  if (!limits.empty())
    for (std::int64_t id : m_jobs.running_ids())
      if (auto it = limits.find(m_jobs.at(id).rec.batch); it != limits.end()) ++it->second.running;
  UserCaps users = lab_order(reads(), queue, now);  // lab mode: fair share, and the users' caps
  const UserCaps caps = users;                      // (a suspension's borrower keeps to them too)
  const CpuSlots cpu = reads().cpu_pool();
  std::vector<GpuState> gpus = gpus_for_pass(reads());

  Plan plan;
  std::vector<Handover::Array> units;  // attempts handed over as one unit
  const auto first = [this](const PendingJob& job) -> std::optional<Executor::Attempt> {
    const JobRecord& r = m_jobs.at(job.id).rec;
    if (r.attempt != r.attempt_base) return std::nullopt;  // a retry
    return m_attempts.attempt_of(r);
  };
  if (auto handover = m_executor->place(queue, limits, first)) {  // another system (Slurm) places them
    plan = std::move(handover->plan);
    units = std::move(handover->arrays);
  } else {
    plan = schedule(std::move(queue), std::move(gpus), now, cpu, true, std::move(limits), std::move(users));
  }
  m_last_pass.remember(plan);
  for (auto& [id, reason] : plan.waiting) {
    Active& a = m_jobs.at(id);
    m_last_pass.say(a, m_machine.gpu_processes.with_foreign_note(
                           gpu_budget_mb(a.rec), m_machine.health.with_drain_note(a.rec.spec.gpus, std::move(reason))));
  }
  auto prepared = [&](Active& a, const Placement& p) {
    try {
      return m_attempts.prepare(a, p, now);
    } catch (const RequestError& e) {
      // Still queued (a full disk, say): tried again on a timer, not only when something else
      // happens to trigger a pass.
      std::cerr << "gpuqd: cannot launch job " << p.id << ": " << e.what() << "\n";
      m_last_pass.say(a, std::string("cannot start: ") + e.what() + "; trying again every " +
                             std::to_string(static_cast<int>(k_write_retry_s)) + " s");
      next_retry = next_retry == 0 ? now + k_write_retry_s : std::min(next_retry, now + k_write_retry_s);
      return false;
    }
  };
  // Descriptors: a launch that would leave too few waits, queued and saying why, and is tried
  // again in a second.
  DescriptorBudget& fds = m_attempts.descriptors();
  const bool launching = !plan.start.empty() || !units.empty();
  fds.begin(launching, launching ? descriptors() : Descriptors{});
  const auto fds_short = [&](Active& a) {
    auto why = fds.spend();
    if (!why) return false;
    m_last_pass.say(a, std::move(*why));
    next_retry = next_retry == 0 ? now + 1 : std::min(next_retry, now + 1);
    return true;
  };
  for (const auto& p : plan.start) {
    Active& a = m_jobs.at(p.id);
    if (fds_short(a)) continue;
    if (prepared(a, p)) m_attempts.start(a);
  }
  for (const auto& unit : units) {
    std::vector<std::int64_t> ids;
    for (std::int64_t id : unit.ids)
      if (!fds_short(m_jobs.at(id)) && prepared(m_jobs.at(id), {id, {}, {}})) ids.push_back(id);
    m_attempts.start_array(ids, unit.limit);
  }
  fds.end();
  suspend_for(plan, caps, now);  // freezing loses nothing: tried first
  preempt_for(plan, now);
  if (next_retry > 0) m_pacer.at(next_retry, now);
  m_events.arm();
}

// Preemption (preemption.hpp): after the pass's launches, the jobs it left waiting for GPUs that
// preemptible jobs of lower priority hold get them stopped; each starts in the pass their end
// brings (schedule_soon), its reservation holding the GPUs meanwhile (ends_by).
void Daemon::preempt_for(const Plan& plan, double now) {
  std::vector<PendingJob> waiting;
  for (const PendingJob& j : plan.wanting_gpus)  // not those started beside suspended jobs since
    if (m_jobs.contains(j.id) && m_jobs.at(j.id).rec.state == JobState::queued) waiting.push_back(j);
  if (waiting.empty()) return;
  bool any = false;
  const std::vector<Runner> running = runners(reads(), any);
  if (!any) return;
  const auto chosen =
      choose_preemptions(waiting, gpus_for_pass(reads()), running, now, preempt_rules(reads(), waiting));
  if (chosen.empty()) return;
  std::vector<std::int64_t> ids;
  std::vector<std::string> by;
  for (const auto& p : chosen) {
    ids.push_back(p.victim);
    by.push_back(job_label(m_jobs.at(p.by).rec));
  }
  try {
    m_attempts.preempt(ids, by, now);
  } catch (const RequestError& e) {  // the store refused: nothing was asked; the next pass tries again
    std::cerr << "gpuqd: cannot record a preemption: " << e.what() << "\n";
  }
}

// Suspension (preemption.hpp): the jobs the pass left waiting for CPU slots, or shared ones waiting
// for GPUs, get preemptible jobs of lower priority frozen in place, and start at once on what they
// lend; the first pass after such a job's end thaws them (thaw_lent).
void Daemon::suspend_for(const Plan& plan, const UserCaps& caps, double now) {
  if ((plan.wanting_slots.empty() && plan.wanting_gpus.empty()) || !m_executor->can_suspend()) return;
  const auto freezable = [this](std::int64_t id) { return !m_attempts.unfreezable(m_jobs.at(id).rec); };
  // A borrower keeps to its batch's limit and its user's, as the pass's launches did (those counted
  // what the pass started; these count what runs now).
  const auto within_limits = [&](const JobRecord& rec) {
    const auto limit = m_jobs.batch_limit(rec.batch);
    const auto cap = caps.find(rec.uid);
    if (!limit && cap == caps.end()) return true;
    int batch_running = 0;
    UserCap held = cap == caps.end() ? UserCap{} : cap->second;
    held.running = held.gpus = 0;
    for (std::int64_t id : m_jobs.running_ids()) {
      const JobRecord& r = m_jobs.at(id).rec;
      batch_running += r.batch == rec.batch;
      if (r.uid == rec.uid) ++held.running, held.gpus += static_cast<int>(r.run.gpus.size());
    }
    return (!limit || batch_running < *limit) && (cap == caps.end() || !user_at_limit(held, rec.spec.gpus));
  };
  // Those waiting for slots, then those waiting for GPUs, each look at the machine as the one before left it.
  for (const std::vector<PendingJob>* waiting : {&plan.wanting_slots, &plan.wanting_gpus}) {
    if (waiting->empty()) continue;
    bool any = false;
    const std::vector<Runner> running = runners(reads(), any, freezable);
    const auto chosen = choose_suspensions(*waiting, gpus_for_pass(reads()), reads().cpu_pool(), running, now,
                                           preempt_rules(reads(), *waiting), plan.reservations);
    if (chosen.empty()) continue;
    DescriptorBudget& fds = m_attempts.descriptors();
    fds.begin(true, descriptors());
    for (const auto& s : chosen) {
      Active& a = m_jobs.at(s.by);
      if (a.rec.state != JobState::queued || !within_limits(a.rec)) continue;
      if (auto why = fds.spend()) {
        m_last_pass.say(a, std::move(*why));
        continue;
      }
      try {
        if (m_attempts.suspend(s.victims, a.rec, now) && m_attempts.prepare(a, {s.by, s.gpus, s.cpu_slots}, now))
          m_attempts.start(a);
      } catch (const RequestError& e) {
        // The store refused: nothing was asked, or the job stays queued and the next pass thaws
        // what was frozen for it.
        std::cerr << "gpuqd: cannot start job " << s.by << " beside suspended jobs: " << e.what() << "\n";
        m_pacer.at(now + k_write_retry_s, now);
      }
    }
    fds.end();
  }
}

void Daemon::commit(std::vector<JobRecord> changed, const std::vector<std::string>& why, std::vector<JobRecord> also) {
  if (changed.empty() && also.empty()) return;
  for (std::size_t i = 0; i < changed.size(); ++i) {
    // A job's last record here that ends it (not the failed attempt a retry follows) makes its
    // on_finish hooks due, in the same transaction (update_many stores them).
    JobRecord& r = changed[i];
    r.hook_due = is_terminal(r.state) && (i + 1 == changed.size() || changed[i + 1].id != r.id) &&
                 m_jobs.contains(r.id) && !is_terminal(m_jobs.at(r.id).rec.state) && m_hooks.any_for(r.spec);
    // One that has just been preempted (back in line, one more preemption) makes its on_preempt
    // hooks due likewise.
    r.preempt_hook_due = m_jobs.contains(r.id) && r.preemptions > m_jobs.at(r.id).rec.preemptions &&
                         m_hooks.any_for(r.spec, HookEvent::preempt);
  }
  std::vector<const JobRecord*> quiet;
  for (const auto& r : also) quiet.push_back(&r);
  land(std::move(changed), [&](const std::vector<const JobRecord*>& rows) { m_store->update_many(rows, why, quiet); });
  for (auto& r : also) apply(std::move(r));
}

void Daemon::land(std::vector<JobRecord> changed, const WriteRows& write) {
  std::vector<const JobRecord*> rows;
  for (const auto& r : changed) rows.push_back(&r);
  write(rows);  // throws before anything changed in memory
  // Hooks made due by commit, whose write stored them with the records; the other writes are of
  // changes that end no job (a spec, events, a restart's requeue, slots), so carry none.
  bool hooks = false;
  for (const auto& r : changed) {
    if (r.preempt_hook_due) m_hooks.due({r.id, HookEvent::preempt, r.run.preempted_by});
    if (r.hook_due) m_hooks.due({r.id, HookEvent::finish, {}});
    hooks = hooks || r.hook_due || r.preempt_hook_due;
  }
  if (hooks) asio::post(m_io, [this] { m_hooks.run(); });
  for (std::size_t i = 0; i < changed.size(); ++i)
    if (i + 1 == changed.size() || changed[i + 1].id != changed[i].id) apply(std::move(changed[i]));
}

void Daemon::apply(JobRecord rec) {
  const std::int64_t id = rec.id;
  const auto applied = m_jobs.apply(std::move(rec), [this](Active& a, std::optional<JobState> was, const JobRecord& now) {
    count_transition(a, was, now);
    // Watches hear of it: of its place in the queue when that changed (a job back from its end is
    // new to the table: `was` is empty), else of its details (progress, result) when they did.
    const bool queue = !was || *was != now.state || a.rec.attempt != now.attempt || a.rec.held != now.held ||
                       a.rec.reason != now.reason || a.rec.spec.priority != now.spec.priority ||
                       a.rec.run.suspended_for != now.run.suspended_for;  // shown as suspended, or not
    if (queue || a.rec.run.progress != now.run.progress || a.rec.run.result != now.run.result)
      m_watches.changed({now.id, now.batch, now.uid, queue ? Watches::Kind::state : Watches::Kind::details});
  });
  if (applied.came_back) m_waiters.came_back(id);  // a wait that names it waits for it again
  if (applied.ended) notify_waiters();
}

void Daemon::count_transition(Active& a, std::optional<JobState> was, const JobRecord& now) {
  if (now.state == JobState::queued && was != JobState::queued)
    a.queued_since = wall_now();  // in line again: a retry, or a restart (submit and recover set theirs)
  if (now.state == JobState::running && was != JobState::running) {
    ++m_metrics.attempts_started;
    if (a.queued_since > 0 && now.run.started_at >= a.queued_since)
      m_metrics.queue_wait.observe(now.run.started_at - a.queued_since);
  }
  if (is_terminal(now.state) && was && !is_terminal(*was))
    ++m_metrics.finished[{std::string(gpuq::to_string(now.state)), now.uid}];
}

}  // namespace gpuq::daemon
