// Requests that change queued or running jobs in place, and the GPUs' service (control.hpp).
#include "daemon/control.hpp"

#include <map>
#include <set>
#include <sstream>

#include "common/process.hpp"
#include "daemon/lifecycle.hpp"

namespace gpuq::daemon::control {

using json = nlohmann::json;

common::CancelReply cancel(const Changes& c, const Caller& caller, const common::IdsRequest& q) {
  // All ids must exist before anything is cancelled: a typo cancels nothing.
  // (Their states alone: an ended job's row may hold a result of a megabyte.)
  std::map<std::int64_t, JobState> states;
  for (auto id : q.ids) {
    const Active* active = c.jobs.find(id);
    auto st = active ? active->rec.state : c.store.state_of(id);
    states[id] = st ? *st : c.reads.existing_job(id).state;  // not_found, saying why
  }
  for (auto id : q.ids) c.reads.authorize(caller, id, "cancel");  // all, before any is cancelled
  // One transaction ends the queued ones and records the intent on the running ones (whatever
  // happens next, they end as cancelled): a failed write (disk full) cancels none of them.
  std::vector<JobRecord> cancelled;
  std::set<std::int64_t> now_cancelled;
  for (auto id : q.ids)
    if (const Active* it = c.jobs.find(id); it && it->rec.state == JobState::queued && now_cancelled.insert(id).second)
      cancelled.push_back(next_record(it->rec, event::Cancelled{common::wall_now()}));
  std::vector<JobRecord> flagged;
  for (auto id : q.ids)
    if (const Active* it = c.jobs.find(id); it && it->rec.state == JobState::running && !it->rec.run.cancel_requested)
      flagged.push_back(next_record(it->rec, event::CancelRequested{common::wall_now()}));
  c.commit(std::move(cancelled), {}, std::move(flagged));
  common::CancelReply out;
  for (auto id : q.ids) {
    if (!c.jobs.contains(id)) {
      const bool done_now = now_cancelled.count(id) > 0;
      out.jobs.push_back({id, done_now ? JobState::cancelled : states.at(id), done_now});
      continue;
    }
    c.executor.stop(id);
    out.jobs.push_back({id, JobState::running, true});
  }
  c.schedule_soon();
  return out;
}

common::CancelReply requeue(const Changes& c, const Caller& caller, const common::IdsRequest& q) {
  for (auto id : q.ids)
    c.reads.authorize(caller, id, "requeue");  // all, before any is looked at further
  for (auto id : q.ids) {
    const JobRecord rec = c.reads.existing_job(id);
    if (rec.state != JobState::running)
      throw RequestError(
          ErrorCode::wrong_state,
          job_label(rec) + " is " + std::string(to_string(rec.state)) + "; only a running job can be requeued" +
              (rec.state == JobState::queued ? " (it is in line already)" : " (`gpuq restart` queues an ended one)"));
    if (rec.run.cancel_requested) throw RequestError(ErrorCode::wrong_state, job_label(rec) + " is being cancelled");
    if (rec.run.preempt_requested)  // it goes back in line already, as preempted
      throw RequestError(ErrorCode::wrong_state, job_label(rec) + " is being preempted already");
    if (!rec.spec_error.empty())  // it could not run again: `cancel` stops it
      throw RequestError(ErrorCode::wrong_state, unreadable_refusal(rec, "be requeued"));
  }
  std::vector<JobRecord> flagged;
  std::set<std::int64_t> asked;
  for (auto id : q.ids) {
    const Active& a = c.jobs.at(id);
    if (!a.rec.run.requeue_requested && asked.insert(id).second)
      flagged.push_back(next_record(a.rec, event::RequeueRequested{common::wall_now()}));
  }
  c.commit({}, {}, std::move(flagged));  // the intent, stored: a gpuqd restarted meanwhile requeues it still
  common::CancelReply out;
  for (auto id : q.ids) {
    const bool now_asked = asked.erase(id) > 0;
    if (now_asked) c.executor.stop(id);
    out.jobs.push_back({id, JobState::running, now_asked});
  }
  return out;
}

common::CancelReply preempt(const Changes& c, const Caller& caller, const common::IdsRequest& q) {
  for (auto id : q.ids)
    c.reads.authorize(caller, id, "preempt");  // all, before any is looked at further
  std::vector<std::int64_t> ids;
  std::set<std::int64_t> seen;
  for (auto id : q.ids) {
    const JobRecord rec = c.reads.existing_job(id);
    if (rec.state != JobState::running)
      throw RequestError(ErrorCode::wrong_state, job_label(rec) + " is " + std::string(to_string(rec.state)) +
                                                     "; only a running job can be preempted");
    if (stop_asked(rec))
      throw RequestError(ErrorCode::wrong_state, job_label(rec) + " is being " +
                                                     (rec.run.cancel_requested    ? "cancelled"
                                                      : rec.run.requeue_requested ? "requeued"
                                                                                  : "preempted") +
                                                     " already");
    if (!rec.spec_error.empty())  // it could not run again: `cancel` stops it
      throw RequestError(ErrorCode::wrong_state, unreadable_refusal(rec, "be preempted"));
    if (seen.insert(id).second) ids.push_back(id);
  }
  c.preempt(ids, std::vector<std::string>(ids.size(), c.reads.users.name_of(caller.uid) + " (gpuq preempt)"));
  common::CancelReply out;
  for (auto id : q.ids)
    out.jobs.push_back({id, JobState::running, seen.erase(id) > 0});
  return out;
}

// Holds queued jobs out of line (as Slurm's hold: they keep their place in the history, reserve
// nothing, and start only once released), or releases them. Holding needs every named job to be
// queued, or nothing is held; releasing a job that is not held changes nothing. With a batch,
// its queued jobs. Each change is a transition in the job's history.
common::CancelReply set_held(const Changes& c, const Caller& caller, const common::SelectRequest& q, bool hold) {
  for (auto id : q.ids) {
    const JobRecord rec = c.reads.existing_job(id);
    if (hold && rec.state != JobState::queued)
      throw RequestError(ErrorCode::wrong_state,
                         job_label(rec) + " is " + std::string(to_string(rec.state)) + "; only a queued job can be held" +
                             (rec.state == JobState::running ? " (`gpuq cancel` stops a running one)" : ""));
  }
  const std::vector<std::int64_t> ids = c.reads.with_queued_of_batch(q.ids, q.batch);
  for (auto id : ids) c.reads.authorize(caller, id, hold ? "hold" : "release");

  common::CancelReply out;
  std::vector<JobRecord> changed;
  for (auto id : ids) {
    const Active* it = c.jobs.find(id);
    const bool change = it && it->rec.state == JobState::queued && it->rec.held != hold;
    if (change) changed.push_back(next_record(it->rec, event::Held{hold}));
    const JobState state = it ? it->rec.state : c.reads.lookup(id)->state;
    out.jobs.push_back({id, state, change});
  }
  const std::vector<std::string> why(changed.size(), hold ? "held" : "released");
  const bool released = !hold && !changed.empty();
  c.commit(std::move(changed), why, {});
  if (released) c.schedule_soon();
  return out;
}

// Changes jobs' priority, retries or timeout after submission, as Slurm's `scontrol update`:
// the spec is rewritten and the job takes its new place in line. A running job takes `priority`
// and `retries`, which decide its next attempt; its supervisor enforces the timeout it started
// with, so that cannot change under it. All or nothing; each change is in the job's history.
common::UpdateReply update(const Changes& c, const Caller& caller, const common::UpdateRequest& q) {
  for (auto id : q.ids) {
    const JobRecord rec = c.reads.existing_job(id);
    if (is_terminal(rec.state))
      throw RequestError(ErrorCode::wrong_state, job_label(rec) + " has ended " + std::string(to_string(rec.state)) +
                                                     "; `gpuq restart` queues it again, and then it can be updated");
    if (!rec.spec_error.empty())  // rewriting it would store a default spec over the one not read
      throw RequestError(ErrorCode::wrong_state, unreadable_refusal(rec, "be updated"));
    if (rec.state == JobState::running && q.timeout_s)
      throw RequestError(ErrorCode::wrong_state, job_label(rec) +
                                                     " is running: its supervisor enforces the timeout it started "
                                                     "with; only priority and retries can change now");
  }
  const bool spec_fields = q.priority || q.retries || q.timeout_s;
  // Only the batch's limit: its queued jobs are not asked to change.
  const std::vector<std::int64_t> ids = spec_fields ? c.reads.with_queued_of_batch(q.ids, q.batch) : q.ids;
  if (!spec_fields) c.reads.jobs_of_batch(q.batch);  // one that exists
  c.reads.authorize_batch(caller, q.batch, "update the batch of");
  for (auto id : ids) c.reads.authorize(caller, id, "update");
  if (q.priority) c.users.check_priority(caller, *q.priority, "");

  auto change = [](auto& field, const auto& value, const char* name, std::string& why) {
    if (!value || field == *value) return;
    std::ostringstream text;
    text << (why.empty() ? "updated: " : ", ") << name << " " << field << " -> " << *value;
    why += text.str();
    field = *value;
  };
  common::CancelReply out;
  std::vector<JobRecord> changed;
  std::vector<std::string> why;
  for (auto id : ids) {
    JobRecord next = c.jobs.at(id).rec;
    std::string what;
    change(next.spec.priority, q.priority, "priority", what);
    change(next.spec.retries, q.retries, "retries", what);
    change(next.spec.timeout_s, q.timeout_s, "timeout_s", what);
    out.jobs.push_back({id, next.state, !what.empty()});
    if (what.empty()) continue;
    changed.push_back(std::move(next));
    why.push_back(std::move(what));
  }
  const bool respecified = !changed.empty();  // new places in line: a pass sees to them
  c.land(std::move(changed), [&](const std::vector<const JobRecord*>& rows) {
    c.store.rewrite_specs(rows, why);  // not a change of state: no transition
  });
  common::UpdateReply reply{std::move(out.jobs), std::nullopt};
  if (q.max_running) {  // jobs already running past a lowered limit run on, as in Slurm
    const common::BatchLimitChange limit{q.batch, *q.max_running, c.jobs.batch_limit(q.batch).value_or(0)};
    c.store.set_batch_limit(q.batch, limit.max_running);
    c.jobs.set_batch_limit(q.batch, limit.max_running);
    reply.batch_limit = limit;
    std::vector<std::int64_t> handed;  // its jobs already handed over as a unit (a Slurm array's tasks) take it too
    for (std::int64_t id : c.jobs.running_ids())
      if (c.jobs.at(id).rec.batch == q.batch) handed.push_back(id);
    c.executor.set_array_limit(handed, limit.max_running);
  }
  if (respecified || q.max_running) c.schedule_soon();
  return reply;
}

common::GpusReply set_drained(const Changes& c, const Caller& caller, const common::DrainRequest& q, bool drain) {
  c.reads.authorize_admin(caller, drain ? "drain GPUs" : "undrain GPUs");
  c.health.set_drained(q, drain);
  return queries::gpus(c.reads);
}

}  // namespace gpuq::daemon::control
