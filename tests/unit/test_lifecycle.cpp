// The job life cycle: every (state, event) pair, legal or refused, and what each legal edge
// carries over or clears. Pure: no daemon, no store.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "daemon/lifecycle.hpp"

using namespace gpuq::daemon;
using gpuq::JobState;

namespace {

// A job that has run once (attempt 1, one retry allowed), in `state`.
JobRecord job_in(JobState state, bool held = false) {
  JobRecord r;
  r.id = 7;
  r.spec.name = "train";
  r.spec.retries = 1;
  r.state = state;
  r.held = held;
  r.attempt = state == JobState::queued ? 0 : 1;
  return r;
}

const std::vector<std::pair<std::string, JobRecord>>& every_state() {
  static const std::vector<std::pair<std::string, JobRecord>> states{
      {"queued", job_in(JobState::queued)},
      {"queued+held", job_in(JobState::queued, true)},
      {"running", job_in(JobState::running)},
      {"running+preempting",
       [] {
         JobRecord r = job_in(JobState::running);
         r.run.preempt_requested = true;
         return r;
       }()},
      {"running+suspended",
       [] {
         JobRecord r = job_in(JobState::running);
         r.run.suspended_for = 9;
         r.run.suspended_for_attempt = 1;
         r.run.suspended_at = 75.0;
         return r;
       }()},
      {"succeeded", job_in(JobState::succeeded)},
      {"failed", job_in(JobState::failed)},
      {"cancelled", job_in(JobState::cancelled)},
      {"timed_out", job_in(JobState::timed_out)},
      {"out_of_memory", job_in(JobState::out_of_memory)},
      {"out_of_memory+retry_on_oom",
       [] {
         JobRecord r = job_in(JobState::out_of_memory);
         r.spec.retry_on_oom = true;
         return r;
       }()},
  };
  return states;
}

const std::vector<Event>& every_event() {
  static const std::vector<Event> events{
      event::Launched{{0, 1}, {0}, {4}, 29500, 10.0},
      event::Ended{JobState::succeeded, "", 0, std::nullopt, nullptr, 20.0, ""},
      event::Retried{30.0, "retry 1/1"},
      event::CancelRequested{},
      event::Cancelled{40.0},
      event::DependencyFailed{3, "dependency 3 ended failed", 50.0},
      event::Held{true},
      event::Held{false},
      event::Restarted{},
      event::NeverStarted{"requeued: gpuqd stopped before the job started"},
      event::Unrunnable{"its stored spec does not parse", 60.0},
      event::RequeueRequested{},
      event::Requeued{"requeued (gpuq requeue): attempt 1 was stopped"},
      event::PreemptRequested{"job 9 (urgent)", 70.0},
      event::Preempted{"preempted by job 9 (urgent)"},
      event::Suspended{9, 1, "job 9 (urgent)", 80.0},
      event::Resumed{90.0},
      event::OverBudget{30000, "raised from 20000 MiB: it held 26000 MiB on GPU 0", false, 95.0},
      event::OverBudget{30000, "over its GPU memory budget", true, 96.0},
  };
  return events;
}

}  // namespace

TEST_SUITE_BEGIN("lifecycle");

TEST_CASE("every state and event: the legal edges lead where they should, every other one is refused") {
  // event -> state before -> state after; any pair not listed is illegal.
  const std::map<std::string, std::map<std::string, JobState>> legal{
      {"launched", {{"queued", JobState::running}}},
      {"ended",
       {{"running", JobState::succeeded},
        {"running+preempting", JobState::succeeded},
        {"running+suspended", JobState::succeeded}}},
      {"retried", {{"failed", JobState::queued}, {"out_of_memory+retry_on_oom", JobState::queued}}},
      {"cancel_requested",
       {{"running", JobState::running},
        {"running+preempting", JobState::running},
        {"running+suspended", JobState::running}}},
      {"cancelled", {{"queued", JobState::cancelled}, {"queued+held", JobState::cancelled}}},
      {"dependency_failed", {{"queued", JobState::failed}, {"queued+held", JobState::failed}}},
      {"held", {{"queued", JobState::queued}, {"queued+held", JobState::queued}}},
      {"released", {{"queued", JobState::queued}, {"queued+held", JobState::queued}}},
      {"restarted",
       {{"succeeded", JobState::queued},
        {"failed", JobState::queued},
        {"cancelled", JobState::queued},
        {"timed_out", JobState::queued},
        {"out_of_memory", JobState::queued},
        {"out_of_memory+retry_on_oom", JobState::queued}}},
      {"never_started",
       {{"running", JobState::queued},
        {"running+preempting", JobState::queued},
        {"running+suspended", JobState::queued}}},
      {"unrunnable", {{"queued", JobState::failed}, {"queued+held", JobState::failed}}},
      {"requeue_requested",
       {{"running", JobState::running},
        {"running+preempting", JobState::running},
        {"running+suspended", JobState::running}}},
      {"requeued",
       {{"running", JobState::queued},
        {"running+preempting", JobState::queued},
        {"running+suspended", JobState::queued}}},
      // Once: a victim already asked to stop is not preempted again.
      {"preempt_requested", {{"running", JobState::running}, {"running+suspended", JobState::running}}},
      {"preempted", {{"running+preempting", JobState::queued}}},
      // Frozen once, for another job; thawed only when frozen.
      {"suspended", {{"running", JobState::running}}},
      {"resumed", {{"running+suspended", JobState::running}}},
      // A budget raised whatever the attempt is doing; stopped for it only when nothing else stops it.
      {"over_budget",
       {{"running", JobState::running},
        {"running+preempting", JobState::running},
        {"running+suspended", JobState::running}}},
      {"over_budget_stop", {{"running", JobState::running}}},
  };
  int refusals = 0;
  for (const auto& e : every_event()) {
    const std::string name(event_name(e));
    REQUIRE(legal.count(name));
    for (const auto& [label, rec] : every_state()) {
      CAPTURE(name);
      CAPTURE(label);
      auto next = transition(rec, e);
      auto it = legal.at(name).find(label);
      if (it == legal.at(name).end()) {
        REQUIRE_FALSE(next.ok());
        CHECK(next.error().code == gpuq::ErrorCode::wrong_state);
        CHECK(next.error().message.find("job 7 (train) is " + std::string(to_string(rec.state))) == 0);
        CHECK(next.error().message.find("`" + name + "` needs") != std::string::npos);
        ++refusals;
      } else {
        REQUIRE(next.ok());
        CHECK(next->state == it->second);
        CHECK(next->id == rec.id);
      }
    }
  }
  CHECK(refusals == 19 * 11 - 43);  // 209 pairs, 43 of them legal
}

TEST_CASE("a launch starts the next attempt from a clean slate") {
  JobRecord r = job_in(JobState::queued);
  r.attempt = 2;  // waiting out a retry after its second attempt
  r.reason = "attempt 2 failed (rank 0 exited with code 1); retry 1/2 in 2 s";
  r.not_before = 5;
  r.run.exit_code = 1;
  r.run.first_failure = {{"rank", 0}, {"exit_code", 1}};
  r.run.progress = {{"step", 10}};
  r.run.result = {{"loss", 0.3}};
  r.run.ended_at = 4;
  r.run.external_id = "slurm:41";
  auto next = transition(r, event::Launched{{2, 3}, {0, 1}, {8, 9}, 29600, 100.0});
  REQUIRE(next.ok());
  CHECK(next->attempt == 3);
  CHECK(next->state == JobState::running);
  CHECK(next->run.gpus == std::vector<int>{2, 3});
  CHECK(next->run.cpu_slots == std::vector<int>{0, 1});
  CHECK(next->run.cores == std::vector<int>{8, 9});
  CHECK(next->run.master_port == 29600);
  CHECK(next->run.started_at == 100.0);
  CHECK(next->run.ended_at == 0);
  CHECK(next->reason.empty());
  CHECK_FALSE(next->run.exit_code);
  CHECK(next->run.first_failure.is_null());
  CHECK(next->run.progress.is_null());
  CHECK(next->run.result.is_null());
  CHECK(next->run.external_id.empty());
  CHECK(next->not_before == 0);
}

TEST_CASE("an end records the attempt's outcome and refuses a state that is not an end") {
  auto ended = transition(job_in(JobState::running),
                          event::Ended{JobState::failed, "rank 1 exited with code 7", 7, std::nullopt,
                                       {{"rank", 1}, {"exit_code", 7}}, 9.0, "slurm:42"});
  REQUIRE(ended.ok());
  CHECK(ended->run.external_id == "slurm:42");
  CHECK(ended->state == JobState::failed);
  CHECK(ended->run.exit_code == 7);
  CHECK(ended->run.first_failure["rank"] == 1);
  CHECK(ended->run.ended_at == 9.0);
  CHECK(ended->attempt == 1);  // the attempt it ended
  CHECK(ended->run.started_at == 0);  // as launched
  // A start later than the launch (held pending by Slurm) is the run's; an earlier one is not
  JobRecord launched = job_in(JobState::running);
  launched.run.started_at = 5.0;
  event::Ended late{JobState::succeeded, "", 0, std::nullopt, nullptr, 9.0, "slurm:42", 8.0};
  CHECK(transition(launched, late)->run.started_at == 8.0);
  late.started_at = 4.0;
  CHECK(transition(launched, late)->run.started_at == 5.0);
  for (JobState not_an_end : {JobState::queued, JobState::running})
    CHECK_FALSE(transition(job_in(JobState::running), event::Ended{not_an_end, "", {}, {}, nullptr, 1.0, ""}).ok());
}

TEST_CASE("a retry needs an attempt that ran and failed, within the retries since submission or the last restart") {
  JobRecord failed = job_in(JobState::failed);  // attempt 1 of 1 + 1 retry
  auto retried = transition(failed, event::Retried{12.0, "retry 1/1 in 1 s"});
  REQUIRE(retried.ok());
  CHECK(retried->state == JobState::queued);
  CHECK(retried->not_before == 12.0);
  CHECK(retried->attempt == 1);  // the next launch numbers it
  failed.attempt = 2;  // its retry failed too: none left
  auto none = transition(failed, event::Retried{13.0, ""});
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message == "job 7 has no retry left (1 used)");
  failed.attempt_base = 2;  // restarted since: a fresh budget
  failed.attempt = 3;
  CHECK(transition(failed, event::Retried{14.0, ""}).ok());
  JobRecord blocked = job_in(JobState::failed);  // failed waiting for a dependency: it never ran
  blocked.attempt = 0;
  blocked.blocked_by = 3;
  CHECK_FALSE(transition(blocked, event::Retried{15.0, ""}).ok());
}

TEST_CASE("a restart queues an ended job with a fresh retry budget and nothing of its last attempt") {
  JobRecord r = job_in(JobState::failed);
  r.attempt = 3;
  r.attempt_base = 1;
  r.restarts = 1;
  r.blocked_by = 2;
  r.run.cancel_requested = true;
  r.run.gpus = {0};
  r.run.result = {{"acc", 0.9}};
  r.after = {2};
  r.bad_event_lines = 4;
  auto next = transition(r, event::Restarted{});
  REQUIRE(next.ok());
  CHECK(next->state == JobState::queued);
  CHECK(next->attempt == 3);
  CHECK(next->attempt_base == 3);
  CHECK(next->restarts == 2);
  CHECK(next->blocked_by == 0);
  CHECK_FALSE(next->run.cancel_requested);
  CHECK(next->run.gpus.empty());
  CHECK(next->run.result.is_null());
  CHECK(next->after == std::vector<std::int64_t>{2});  // what the job is stays
  CHECK(next->bad_event_lines == 4);
}

TEST_CASE("queued jobs that end without running say why, and drop their hold") {
  auto cancelled = transition(job_in(JobState::queued, true), event::Cancelled{3.0});
  REQUIRE(cancelled.ok());
  CHECK(cancelled->reason == "cancelled before it started");
  CHECK_FALSE(cancelled->held);
  CHECK(cancelled->run.ended_at == 3.0);
  JobRecord waiting = job_in(JobState::queued);
  waiting.attempt = 1;  // between a failed attempt and its retry
  CHECK(transition(waiting, event::Cancelled{4.0})->reason == "cancelled while waiting to retry");
  auto blocked = transition(job_in(JobState::queued, true), event::DependencyFailed{3, "dependency 3 ended failed", 5.0});
  REQUIRE(blocked.ok());
  CHECK(blocked->blocked_by == 3);
  CHECK(blocked->reason == "dependency 3 ended failed");
  CHECK_FALSE(blocked->held);
}

TEST_CASE("a launch recorded but never started is queued again as the same attempt, or as the next one") {
  JobRecord r = job_in(JobState::running);
  r.attempt = 2;
  r.attempt_base = 1;
  r.run.gpus = {1};
  r.run.cpu_slots = {3};
  r.run.cores = {6};
  auto same = transition(r, event::NeverStarted{"requeued: gpuqd stopped before the job started"});
  REQUIRE(same.ok());
  CHECK((same->attempt == 1 && same->attempt_base == 1));
  // Its number taken: a supervisor late for attempt 2 finds it withdrawn (LocalExecutor::adopt),
  // the next is 3, and the tries counted (attempt - attempt_base) are as before the launch.
  auto next = transition(r, event::NeverStarted{"requeued: gpuqd stopped before the job started", true});
  REQUIRE(next.ok());
  CHECK(next->state == JobState::queued);
  CHECK(next->attempt == 2);
  CHECK(next->attempt_base == 2);
  CHECK(next->run.gpus.empty());
  CHECK(next->run.cpu_slots.empty());
  CHECK(next->run.cores.empty());
  CHECK(next->reason == "requeued: gpuqd stopped before the job started");
}

TEST_CASE("a requeue stops a running job and puts it back in line, its next attempt numbered on, no retry spent") {
  JobRecord r = job_in(JobState::running);  // attempt 1 of 1 + 1 retry
  r.run.gpus = {1};
  r.run.progress = {{"step", 40}};
  auto asked = transition(r, event::RequeueRequested{});
  REQUIRE(asked.ok());
  CHECK(asked->state == JobState::running);
  CHECK(asked->run.requeue_requested);
  CHECK_FALSE(asked->run.cancel_requested);
  auto back = transition(*asked, event::Requeued{"requeued (gpuq requeue): attempt 1 was stopped"});
  REQUIRE(back.ok());
  CHECK(back->state == JobState::queued);
  CHECK(back->attempt == 1);       // the next launch makes it attempt 2
  CHECK(back->attempt_base == 1);  // and its try 1 of 2: the stopped attempt was not one
  CHECK_FALSE(back->run.requeue_requested);
  CHECK(back->run.gpus.empty());
  CHECK(back->run.progress.is_null());
  CHECK(back->reason == "requeued (gpuq requeue): attempt 1 was stopped");
  auto again = transition(*back, event::Launched{{0}, {}, {}, 0, 5.0});
  REQUIRE(again.ok());
  CHECK(again->attempt == 2);
  CHECK(has_retry_left(*again));  // retries 1: a failure of attempt 2 is retried
  JobRecord unreadable = *asked;
  unreadable.spec_error = "invalid job spec";
  CHECK_FALSE(transition(unreadable, event::Requeued{""}).ok());  // it could never run again
}

TEST_CASE(
    "over its GPU memory budget: the budget raised and kept from attempt to attempt; stopped, it is requeued once") {
  JobRecord r = job_in(JobState::running);
  r.spec.shared = true;
  r.spec.gpu_memory_mb = 20000;
  r.run.gpus = {0};
  CHECK(gpu_budget_mb(r) == 20000);  // its spec's, until raised
  auto raised = transition(r, event::OverBudget{32512, "raised from 20000 MiB: it held 26000 MiB", false, 50.0});
  REQUIRE(raised.ok());
  CHECK(raised->state == JobState::running);
  CHECK(gpu_budget_mb(*raised) == 32512);
  CHECK(raised->gpu_budget == JobRecord::GpuBudget{32512, "raised from 20000 MiB: it held 26000 MiB", 1, 50.0});
  CHECK_FALSE(stop_asked(*raised));  // left running

  auto stopping = transition(*raised, event::OverBudget{49152, "over its GPU memory budget", true, 60.0});
  REQUIRE(stopping.ok());
  CHECK(stopping->run.requeue_requested);
  CHECK(stopping->run.over_budget == "over its GPU memory budget");
  CHECK(stopping->gpu_budget.raises == 2);
  CHECK_FALSE(transition(*stopping, event::OverBudget{60000, "again", true, 61.0}).ok());  // asked once
  JobRecord frozen = *raised;
  frozen.run.suspended_for = 9;
  CHECK_FALSE(transition(frozen, event::OverBudget{60000, "frozen", true, 61.0}).ok());  // a frozen job grows not

  auto back = transition(*stopping, event::Requeued{"requeued: over its GPU memory budget: attempt 1 was stopped"});
  REQUIRE(back.ok());
  CHECK(back->state == JobState::queued);
  CHECK(back->attempt_base == 1);  // no retry spent
  CHECK(back->run.over_budget.empty());
  CHECK(gpu_budget_mb(*back) == 49152);  // the next attempt runs with it
  auto again = transition(*back, event::Launched{{0}, {}, {}, 0, 70.0});
  REQUIRE(again.ok());
  CHECK(gpu_budget_mb(*again) == 49152);
  CHECK_FALSE(transition(job_in(JobState::queued), event::OverBudget{1000, "queued", false, 1.0}).ok());
  CHECK_FALSE(transition(r, event::OverBudget{0, "nothing", false, 1.0}).ok());
}

TEST_CASE("a preemption stops a running job once and puts it back in line, saying who preempted it and when") {
  JobRecord r = job_in(JobState::running);
  r.run.gpus = {0, 1};
  r.run.checkpoint_at = 12.0;
  auto asked = transition(r, event::PreemptRequested{"job 9 (urgent)", 70.0});
  REQUIRE(asked.ok());
  CHECK(asked->run.preempt_requested);
  CHECK(stop_asked(*asked));
  CHECK(asked->run.preempted_by == "job 9 (urgent)");
  CHECK(asked->run.preempted_at == 70.0);
  CHECK_FALSE(transition(*asked, event::PreemptRequested{"job 10 (urgent2)", 71.0}).ok());  // not twice
  JobRecord cancelling = r;
  cancelling.run.cancel_requested = true;
  CHECK_FALSE(transition(cancelling, event::PreemptRequested{"job 9 (urgent)", 70.0}).ok());
  CHECK_FALSE(transition(r, event::Preempted{"preempted"}).ok());  // only after it was asked
  auto back = transition(*asked, event::Preempted{"preempted by job 9 (urgent)"});
  REQUIRE(back.ok());
  CHECK(back->state == JobState::queued);
  CHECK(back->attempt == 1);
  CHECK(back->attempt_base == 1);  // no retry spent
  CHECK(back->preemptions == 1);
  CHECK_FALSE(back->run.preempt_requested);
  CHECK(back->run.preempted_by == "job 9 (urgent)");  // kept while it waits
  CHECK(back->run.preempted_at == 70.0);
  CHECK(back->run.checkpoint_at == 0);  // the attempt's own
  CHECK(back->run.gpus.empty());
  auto again = transition(*back, event::Launched{{0}, {}, {}, 0, 80.0});
  REQUIRE(again.ok());
  CHECK(again->attempt == 2);
  CHECK(again->preemptions == 1);
  CHECK(again->run.preempted_by.empty());  // running again: no longer "preempted"
  JobRecord unreadable = *asked;
  unreadable.spec_error = "invalid job spec";
  CHECK_FALSE(transition(unreadable, event::Preempted{""}).ok());
  // Preempted before it started (gpuqd stopped in between): back in line as never started, not
  // shown as preempted.
  auto never = transition(*asked, event::NeverStarted{"requeued: gpuqd stopped before the job started"});
  REQUIRE(never.ok());
  CHECK_FALSE(never->run.preempt_requested);
  CHECK(never->run.preempted_by.empty());
}

TEST_CASE("a suspension freezes a running job for another, once; its thaw, a stop or its end clears it") {
  JobRecord r = job_in(JobState::running);
  r.run.started_at = 10;
  auto frozen = transition(r, event::Suspended{9, 2, "job 9 (urgent)", 100.0});
  REQUIRE(frozen.ok());
  CHECK(frozen->state == JobState::running);
  CHECK(frozen->run.suspended_for == 9);
  CHECK(frozen->run.suspended_for_attempt == 2);
  CHECK(frozen->run.suspended_by == "job 9 (urgent)");
  CHECK(frozen->run.suspended_at == 100.0);
  CHECK(frozen->suspensions == 1);
  CHECK(frozen->preemptions == 0);  // nothing was stopped: no attempt lost
  CHECK_FALSE(transition(*frozen, event::Suspended{8, 1, "job 8 (other)", 101.0}).ok());  // once
  CHECK_FALSE(transition(r, event::Suspended{7, 1, "job 7 (train)", 100.0}).ok());        // never for itself
  CHECK_FALSE(transition(r, event::Resumed{110.0}).ok());                                 // not frozen

  auto thawed = transition(*frozen, event::Resumed{130.0});
  REQUIRE(thawed.ok());
  CHECK(thawed->run.suspended_for == 0);
  CHECK(thawed->run.suspended_by.empty());
  CHECK(thawed->run.suspended_s == 30.0);  // its timeout's clock stood still this long
  CHECK(thawed->run.resumed_at == 130.0);
  CHECK(thawed->suspensions == 1);
  auto again = transition(*thawed, event::Suspended{9, 3, "job 9 (urgent)", 200.0});
  REQUIRE(again.ok());
  auto thawed_again = transition(*again, event::Resumed{210.0});
  REQUIRE(thawed_again.ok());
  CHECK(thawed_again->run.suspended_s == 40.0);  // summed over the attempt's suspensions
  CHECK(thawed_again->suspensions == 2);

  // A freeze that failed is undone: not counted, no time frozen.
  auto undone = transition(*frozen, event::Resumed{130.0, true});
  REQUIRE(undone.ok());
  CHECK(undone->run.suspended_for == 0);
  CHECK(undone->suspensions == 0);
  CHECK(undone->run.suspended_s == 0);
  CHECK(undone->run.resumed_at == 0);

  // A stop asked of a frozen job thaws it (the executor does, to stop it); so does its end.
  for (const Event& stop :
       std::vector<Event>{event::CancelRequested{120.0}, event::RequeueRequested{120.0},
                          event::PreemptRequested{"job 8 (other)", 120.0},
                          event::Ended{JobState::failed, "killed", 137, std::nullopt, nullptr, 120.0, ""}}) {
    CAPTURE(event_name(stop));
    auto next = transition(*frozen, stop);
    REQUIRE(next.ok());
    CHECK(next->run.suspended_for == 0);
    CHECK(next->suspensions == 1);
    CHECK(next->run.suspended_s == 20.0);  // frozen until then: a gpuqd restarted meanwhile counts it
  }
  // A new attempt starts unfrozen.
  auto requeued = transition(*frozen, event::Requeued{"requeued"});
  REQUIRE(requeued.ok());
  CHECK(requeued->run.suspended_for == 0);
  CHECK(requeued->run.suspended_s == 0);
}

TEST_CASE("a job whose stored spec does not parse is never launched, retried or restarted, and fails if queued") {
  const std::string why = "invalid job spec: unknown field `gang_timeout_s`";
  JobRecord queued = job_in(JobState::queued);
  queued.spec_error = why;
  for (const Event& e : {Event{event::Launched{{0}, {}, {}, 0, 1.0}}, Event{event::Retried{2.0, "retry 1/1"}}}) {
    JobRecord r = std::holds_alternative<event::Retried>(e) ? job_in(JobState::failed) : queued;
    r.spec_error = why;
    auto next = transition(r, e);
    REQUIRE_FALSE(next.ok());
    CHECK(next.error().code == gpuq::ErrorCode::wrong_state);
    CHECK(next.error().message == "job 7 (train) cannot `" + std::string(event_name(e)) +
                                      "`: its stored spec does not parse (" + why + "); submit it again");
  }
  for (JobState ended : {JobState::succeeded, JobState::failed, JobState::cancelled, JobState::timed_out}) {
    JobRecord r = job_in(ended);
    r.spec_error = why;
    CAPTURE(to_string(ended));
    CHECK_FALSE(transition(r, event::Restarted{}).ok());
  }
  // Running, but never started: not back in line (it would wait for a launch it cannot have) but
  // ended, failed, saying why.
  JobRecord running = job_in(JobState::running);
  running.spec_error = why;
  CHECK_FALSE(transition(running, event::NeverStarted{"requeued: gpuqd stopped before the job started"}).ok());
  auto ended = transition(running, back_in_line(running, "requeued: gpuqd stopped before the job started", 8.0));
  REQUIRE(ended.ok());
  CHECK(ended->state == JobState::failed);
  CHECK(ended->run.ended_at == 8.0);
  CHECK(ended->reason == "its stored spec does not parse (" + why + "): it cannot run; submit it again");
  running.spec_error.clear();
  auto requeued = transition(running, back_in_line(running, "requeued: gpuqd stopped before the job started", 8.0));
  REQUIRE(requeued.ok());
  CHECK(requeued->state == JobState::queued);
  // What it may still do: fail without running, be held, be cancelled.
  queued.held = true;
  auto failed = transition(queued, event::Unrunnable{"its stored spec does not parse (" + why + ")", 9.0});
  REQUIRE(failed.ok());
  CHECK(failed->state == JobState::failed);
  CHECK_FALSE(failed->held);
  CHECK(failed->run.ended_at == 9.0);
  CHECK(failed->attempt == 0);
  CHECK(failed->reason.find(why) != std::string::npos);
  CHECK(transition(queued, event::Cancelled{3.0}).ok());
  CHECK(transition(queued, event::Held{false}).ok());
}

TEST_SUITE_END();
