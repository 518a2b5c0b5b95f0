// A job's life cycle as one pure function: transition(record, event) is the record after the
// event, or an error naming the edge it refuses. Every change of a job's state in gpuqd is one
// of these events, so the legal edges are written here once (as Slurm's job_state_set and
// containerd's shim states refuse illegal ones), and what an attempt owns is cleared in one place.
//
//             ┌──────── held / released ───────┐
//             ▼                                │
//   submit ─▶ queued ─── launched ──────────▶ running ─── ended ──▶ succeeded | failed |
//             │  ▲ ▲                            │  │                timed_out | cancelled |
//             │  │ └──── never_started ─────────┘  │                out_of_memory       │
//             │  └────── retried (failed, with retries left; ◀──────────┼────────┘
//             │          out_of_memory too, if the spec asks)           │
//             ├── cancelled / dependency_failed ──▶ cancelled | failed  │
//             └◀─────────────── restarted (any end) ◀───────────────────┘
//   running ── cancel_requested ──▶ running (it ends as cancelled, whatever happens next)
//   running ── requeue_requested ─▶ running ── requeued (its attempt ended) ──▶ queued (no retry spent)
//   running ── preempt_requested ─▶ running ── preempted (its attempt ended) ─▶ queued (no retry
//              (by whom, when; once)              spent; shown as `preempted` until it starts again)
//   running ── suspended (frozen for job N) ──▶ running ── resumed (job N's attempt ended) ──▶ running
//              (a stop asked of it, or its end, thaws it too)
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/error.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

namespace event {
// Queued, not held -> running: the next attempt, on these GPUs, CPU slots and cores.
struct Launched {
  std::vector<int> gpus, cpu_slots, cores;
  int master_port = 0;  // ddp jobs: the rendezvous port
  double at = 0;
};
// Running -> a terminal state: the attempt's end, as its supervisor recorded it.
struct Ended {
  JobState state = JobState::failed;  // succeeded, failed, timed_out, cancelled or out_of_memory
  std::string reason;
  std::optional<int> exit_code, exit_signal;
  json first_failure;
  double at = 0;
  std::string external_id;  // the executor's id of the attempt ("slurm:42"), if it has one
  // When its processes started, where that came after the launch (Slurm held it pending): the
  // record's start from then on. 0: it started as launched.
  double started_at = 0;
};
// Failed (the attempt just ended) -> queued again, when the job has retries left.
struct Retried {
  double not_before = 0;  // the backoff
  std::string reason;
};
// Running -> running, flagged: it ends as cancelled once its processes are gone.
struct CancelRequested {
  double at = 0;  // when asked: a frozen job's time frozen ends then
};
// Queued -> cancelled, without running (again).
struct Cancelled {
  double at = 0;
};
// Queued -> failed, without running: `dependency` ended without success (or is gone).
struct DependencyFailed {
  std::int64_t dependency = 0;
  std::string reason;
  double at = 0;
};
// Queued -> queued, out of line (hold) or back in it (release).
struct Held {
  bool hold = true;
};
// Running -> running, flagged: once its processes are gone it goes back in line (Requeued).
struct RequeueRequested {
  double at = 0;
};
// Running (its attempt just ended, stopped by gpuq requeue) -> queued, as the same job: the next
// attempt is numbered on, and no retry is spent (attempt_base moves with it).
struct Requeued {
  std::string reason;
};
// Running, not yet asked to stop -> running, flagged: a preemption (by a job of higher priority,
// or `gpuq preempt`) asked it to checkpoint and stop; once its processes are gone, Preempted.
struct PreemptRequested {
  std::string by;  // "job 12 (urgent)", "alice (gpuq preempt)"
  double at = 0;
};
// Running (its attempt just ended, stopped by a preemption) -> queued, as the same job: no retry
// spent, the attempt number goes on, one more preemption counted; who preempted it and when stay.
struct Preempted {
  std::string reason;
};
// Running, not asked to stop nor suspended -> running, suspended: frozen in place for job `by_id`,
// whose attempt `by_attempt` runs on its CPU slots (preemption.hpp's suspension).
struct Suspended {
  std::int64_t by_id = 0;
  int by_attempt = 0;
  std::string by;  // "job 12 (urgent)"
  double at = 0;
};
// Running, suspended -> running: thawed (the job it was frozen for has ended); `undone`: its
// freeze failed, so it never was (the suspension is not counted).
struct Resumed {
  double at = 0;
  bool undone = false;
};
// Running -> running, its GPU memory budget raised to `raised_mb`, `why` said: it held more than
// its budget (gpu_budgets.hpp), or CUDA ran out of memory at it. With `stop` (a job not asked to
// stop nor suspended), also asked to stop for it and go back in line as the same job, as
// RequeueRequested: its GPU's other jobs need the room.
struct OverBudget {
  std::int64_t raised_mb = 0;
  std::string why;
  bool stop = false;
  double at = 0;
};
// Any end -> queued under the same id, with a fresh retry budget (gpuq restart).
struct Restarted {};
// Running but never started (gpuqd stopped between recording the launch and spawning it, or it
// was withdrawn from the system that was to run it) -> queued, to start again as the same
// attempt; or, `number_taken` (its directory holds a claim no later start may reuse:
// LocalExecutor::adopt), as the next, the withdrawn one not counted among its tries.
struct NeverStarted {
  std::string reason;
  bool number_taken = false;
};
// Queued -> failed, without running: it can never run (its stored spec does not parse).
struct Unrunnable {
  std::string reason;
  double at = 0;
};
}  // namespace event

using Event = std::variant<event::Launched, event::Ended, event::Retried, event::CancelRequested, event::Cancelled,
                           event::DependencyFailed, event::Held, event::Restarted, event::NeverStarted,
                           event::Unrunnable, event::RequeueRequested, event::Requeued, event::PreemptRequested,
                           event::Preempted, event::Suspended, event::Resumed, event::OverBudget>;

std::string_view event_name(const Event& e);

// A running job that never started (or was taken back before it did) goes back in line as the
// same attempt: NeverStarted; unless its stored spec does not parse, when it ends failed instead,
// as it could never run again.
Event back_in_line(const JobRecord& rec, std::string reason, double now, bool number_taken = false);

// Why a job whose stored spec does not parse fails, for its record's reason.
std::string unrunnable_reason(const JobRecord& rec);
// The refusal of `act` ("be restarted") on such a job: "job 7 (train) cannot be restarted: its
// stored spec does not parse (...); submit it again".
std::string unreadable_refusal(const JobRecord& rec, std::string_view act);

// "job 7 (train)": how errors name a job.
std::string job_label(const JobRecord& rec);

// The record after `e`, or wrong_state: "job 7 is succeeded; `launched` needs a queued job that
// is not held". Pure: the caller stores the result, then applies it in memory.
Result<JobRecord> transition(const JobRecord& rec, const Event& e);
// The same for gpuqd's own transitions, which its checks made legal: a refusal is a RequestError.
JobRecord next_record(const JobRecord& rec, const Event& e);

// Whether a running job has been asked to stop (cancel, requeue or preemption).
bool stop_asked(const JobRecord& rec);

// Whether the attempt that `rec` (running, or just failed) holds may be followed by a retry: it is
// within the retry budget of this run (attempts since submission or the latest restart), and its
// spec is readable. The one rule: `Retried` is refused where it says no, and gpuqd asks it before.
bool has_retry_left(const JobRecord& rec);

// Starts the next attempt from a clean slate: a default JobRecord::Attempt (its times, exit
// status, GPUs, slots, cores and port, progress, result and first failure, a cancel asked of it),
// and no reason, backoff or dependency that failed it.
void clear_attempt(JobRecord& rec);

}  // namespace gpuq::daemon
