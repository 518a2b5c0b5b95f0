// A job's life cycle (see lifecycle.hpp).
#include "daemon/lifecycle.hpp"

#include <algorithm>

namespace gpuq::daemon {

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

Error refused(const JobRecord& rec, const Event& e, std::string_view needs) {
  return Error{ErrorCode::wrong_state, job_label(rec) + " is " + std::string(to_string(rec.state)) + (rec.held ? " and held" : "") +
                                           "; `" + std::string(event_name(e)) + "` needs " + std::string(needs)};
}

// A job whose stored spec does not parse runs no more: it has no command to run.
Error unreadable(const JobRecord& rec, const Event& e) {
  return Error{ErrorCode::wrong_state, unreadable_refusal(rec, "`" + std::string(event_name(e)) + "`")};
}

// A queued job that fails without running (its dependency failed, or it cannot run at all).
// Thawed: a suspension over (resumed, or a stop asked of it, or its end), at `at` where known.
void thawed(JobRecord& next, double at) {
  if (next.run.suspended_for == 0) return;
  if (next.run.suspended_at > 0 && at > next.run.suspended_at) {
    next.run.suspended_s += at - next.run.suspended_at;
    next.run.resumed_at = at;
  }
  next.run.suspended_for = 0;
  next.run.suspended_for_attempt = 0;
  next.run.suspended_by.clear();
  next.run.suspended_at = 0;
}

JobRecord fails_unstarted(JobRecord next, double at, std::string reason) {
  next.state = JobState::failed;
  next.held = false;
  next.run.ended_at = at;
  next.reason = std::move(reason);
  return next;
}

}  // namespace

std::string job_label(const JobRecord& rec) { return "job " + std::to_string(rec.id) + " (" + rec.spec.name + ")"; }

std::string_view event_name(const Event& e) {
  return std::visit(Overloaded{
                        [](const event::Launched&) { return "launched"; },
                        [](const event::Ended&) { return "ended"; },
                        [](const event::Retried&) { return "retried"; },
                        [](const event::CancelRequested&) { return "cancel_requested"; },
                        [](const event::Cancelled&) { return "cancelled"; },
                        [](const event::DependencyFailed&) { return "dependency_failed"; },
                        [](const event::Held& h) { return h.hold ? "held" : "released"; },
                        [](const event::Restarted&) { return "restarted"; },
                        [](const event::NeverStarted&) { return "never_started"; },
                        [](const event::Unrunnable&) { return "unrunnable"; },
                        [](const event::RequeueRequested&) { return "requeue_requested"; },
                        [](const event::Requeued&) { return "requeued"; },
                        [](const event::PreemptRequested&) { return "preempt_requested"; },
                        [](const event::Preempted&) { return "preempted"; },
                        [](const event::Suspended&) { return "suspended"; },
                        [](const event::Resumed&) { return "resumed"; },
                        [](const event::OverBudget& o) { return o.stop ? "over_budget_stop" : "over_budget"; },
                    },
                    e);
}

void clear_attempt(JobRecord& rec) {
  rec.run = {};
  rec.reason.clear();
  rec.not_before = 0;
  rec.blocked_by = 0;
}

bool has_retry_left(const JobRecord& rec) {
  const int run = rec.attempt - rec.attempt_base;
  return run >= 1 && run <= rec.spec.retries && rec.spec_error.empty();
}

Result<JobRecord> transition(const JobRecord& rec, const Event& e) {
  const bool queued = rec.state == JobState::queued, running = rec.state == JobState::running;
  JobRecord next = rec;
  return std::visit(
      Overloaded{
          [&](const event::Launched& l) -> Result<JobRecord> {
            if (!queued || rec.held) return refused(rec, e, "a queued job that is not held");
            if (!rec.spec_error.empty()) return unreadable(rec, e);
            clear_attempt(next);
            next.state = JobState::running;
            next.attempt = rec.attempt + 1;
            next.run.gpus = l.gpus;
            next.run.cpu_slots = l.cpu_slots;
            next.run.cores = l.cores;
            next.run.master_port = l.master_port;
            next.run.started_at = l.at;
            return next;
          },
          [&](const event::Ended& end) -> Result<JobRecord> {
            if (!running) return refused(rec, e, "a running job");
            if (!is_terminal(end.state))
              return refused(rec, e, "an end state (succeeded, failed, timed_out, cancelled, out_of_memory)");
            next.state = end.state;
            next.reason = end.reason;
            next.run.exit_code = end.exit_code;
            next.run.exit_signal = end.exit_signal;
            next.run.first_failure = end.first_failure;
            next.run.ended_at = end.at;
            next.run.external_id = end.external_id;
            if (end.started_at > rec.run.started_at) next.run.started_at = end.started_at;
            thawed(next, end.at);
            return next;
          },
          [&](const event::Retried& r) -> Result<JobRecord> {
            // Only an attempt that ran and failed, within the retry budget of this run (since
            // submission or the latest restart); a job failed for a dependency never ran.
            const int run = rec.attempt - rec.attempt_base;
            const bool oom_retried = rec.state == JobState::out_of_memory && rec.spec.retry_on_oom;
            if ((rec.state != JobState::failed && !oom_retried) || run < 1 || rec.blocked_by != 0)
              return refused(rec, e, "a job whose attempt has just failed");
            if (!rec.spec_error.empty()) return unreadable(rec, e);
            if (!has_retry_left(rec))
              return Error{ErrorCode::wrong_state, "job " + std::to_string(rec.id) + " has no retry left (" +
                                                       std::to_string(rec.spec.retries) + " used)"};
            next.state = JobState::queued;
            next.not_before = r.not_before;
            next.run.ended_at = 0;
            next.reason = r.reason;
            return next;
          },
          [&](const event::CancelRequested& c) -> Result<JobRecord> {
            if (!running) return refused(rec, e, "a running job");
            next.run.cancel_requested = true;
            thawed(next, c.at);  // the executor thaws it to stop it
            return next;
          },
          [&](const event::Cancelled& c) -> Result<JobRecord> {
            if (!queued) return refused(rec, e, "a queued job (a running one is asked to stop: cancel_requested)");
            next.state = JobState::cancelled;
            next.held = false;
            next.run.ended_at = c.at;
            next.reason = rec.attempt > 0 ? "cancelled while waiting to retry" : "cancelled before it started";
            return next;
          },
          [&](const event::DependencyFailed& d) -> Result<JobRecord> {
            if (!queued) return refused(rec, e, "a queued job");
            next.blocked_by = d.dependency;
            return fails_unstarted(std::move(next), d.at, d.reason);
          },
          [&](const event::Held& h) -> Result<JobRecord> {
            if (!queued) return refused(rec, e, "a queued job");
            next.held = h.hold;
            return next;
          },
          [&](const event::Restarted&) -> Result<JobRecord> {
            if (!is_terminal(rec.state)) return refused(rec, e, "a job that has ended");
            if (!rec.spec_error.empty()) return unreadable(rec, e);
            clear_attempt(next);
            next.state = JobState::queued;
            next.attempt_base = rec.attempt;
            next.restarts = rec.restarts + 1;
            next.held = false;
            return next;
          },
          [&](const event::NeverStarted& n) -> Result<JobRecord> {
            if (!running || rec.attempt < 1) return refused(rec, e, "a running job");
            if (!rec.spec_error.empty()) return unreadable(rec, e);
            next.state = JobState::queued;
            if (n.number_taken)
              next.attempt_base = rec.attempt_base + 1;  // not one of its tries
            else
              next.attempt = rec.attempt - 1;
            next.reason = n.reason;
            next.run.preempt_requested = false;  // nothing ran to be preempted
            next.run.preempted_by.clear();
            next.run.preempted_at = 0;
            next.run.gpus.clear();
            next.run.cpu_slots.clear();
            next.run.cores.clear();
            return next;
          },
          [&](const event::Unrunnable& u) -> Result<JobRecord> {
            if (!queued) return refused(rec, e, "a queued job");
            return fails_unstarted(std::move(next), u.at, u.reason);
          },
          [&](const event::RequeueRequested& r) -> Result<JobRecord> {
            if (!running) return refused(rec, e, "a running job");
            next.run.requeue_requested = true;
            thawed(next, r.at);
            return next;
          },
          [&](const event::Requeued& r) -> Result<JobRecord> {
            if (!running || rec.attempt < 1) return refused(rec, e, "a running job");
            if (!rec.spec_error.empty()) return unreadable(rec, e);
            clear_attempt(next);
            next.state = JobState::queued;
            next.attempt_base = rec.attempt_base + 1;  // the attempt it lost is not one of its tries
            next.reason = r.reason;
            return next;
          },
          [&](const event::PreemptRequested& p) -> Result<JobRecord> {
            // Once: a job already asked to stop is not preempted again (two urgent jobs, one victim).
            if (!running || stop_asked(rec)) return refused(rec, e, "a running job not asked to stop yet");
            next.run.preempt_requested = true;
            next.run.preempted_by = p.by;
            next.run.preempted_at = p.at;
            thawed(next, p.at);
            return next;
          },
          [&](const event::Suspended& su) -> Result<JobRecord> {
            if (!running || stop_asked(rec) || rec.run.suspended_for != 0 || su.by_id <= 0 || su.by_id == rec.id)
              return refused(rec, e, "a running job not asked to stop nor suspended, for another job");
            next.run.suspended_for = su.by_id;
            next.run.suspended_for_attempt = su.by_attempt;
            next.run.suspended_by = su.by;
            next.run.suspended_at = su.at;
            next.suspensions = rec.suspensions + 1;
            return next;
          },
          [&](const event::Resumed& r) -> Result<JobRecord> {
            if (!running || rec.run.suspended_for == 0) return refused(rec, e, "a suspended job");
            if (r.undone) {
              next.run.suspended_at = 0;  // no time frozen, no thaw
              next.suspensions = std::max(0, rec.suspensions - 1);
            }
            thawed(next, r.at);
            return next;
          },
          [&](const event::OverBudget& o) -> Result<JobRecord> {
            if (!running || o.raised_mb <= 0) return refused(rec, e, "a running job");
            if (o.stop && (stop_asked(rec) || rec.run.suspended_for != 0))
              return refused(rec, e, "a running job not asked to stop nor suspended");
            next.gpu_budget = {o.raised_mb, o.why, rec.gpu_budget.raises + 1, o.at};
            if (o.stop) {
              next.run.requeue_requested = true;
              next.run.over_budget = o.why;
            }
            return next;
          },
          [&](const event::Preempted& p) -> Result<JobRecord> {
            if (!running || rec.attempt < 1 || !rec.run.preempt_requested)
              return refused(rec, e, "a running job asked to stop for a preemption");
            if (!rec.spec_error.empty()) return unreadable(rec, e);
            clear_attempt(next);
            next.state = JobState::queued;
            next.attempt_base = rec.attempt_base + 1;  // a preemption spends no retry
            next.preemptions = rec.preemptions + 1;
            next.run.preempted_by = rec.run.preempted_by;  // status and show say who, until it starts again
            next.run.preempted_at = rec.run.preempted_at;
            next.reason = p.reason;
            return next;
          },
      },
      e);
}

std::string unreadable_refusal(const JobRecord& rec, std::string_view act) {
  return job_label(rec) + " cannot " + std::string(act) + ": its stored spec does not parse (" + rec.spec_error +
         "); submit it again";
}

std::string unrunnable_reason(const JobRecord& rec) {
  return "its stored spec does not parse (" + rec.spec_error + "): it cannot run; submit it again";
}

Event back_in_line(const JobRecord& rec, std::string reason, double now, bool number_taken) {
  if (rec.spec_error.empty()) return event::NeverStarted{std::move(reason), number_taken};
  return event::Ended{JobState::failed, unrunnable_reason(rec), std::nullopt, std::nullopt, nullptr, now, "", 0};
}

bool stop_asked(const JobRecord& rec) {
  return rec.run.cancel_requested || rec.run.requeue_requested || rec.run.preempt_requested;
}

JobRecord next_record(const JobRecord& rec, const Event& e) {
  auto next = transition(rec, e);
  if (!next) throw RequestError(next.error());
  return std::move(*next);
}

}  // namespace gpuq::daemon
