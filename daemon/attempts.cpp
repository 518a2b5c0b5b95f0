// The attempts' owner (attempts.hpp): launching an attempt, and recording how it ended.
#include "daemon/attempts.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include "common/failure_class.hpp"
#include "common/paths.hpp"
#include "common/users.hpp"
#include "daemon/gpu_budgets.hpp"
#include "daemon/lifecycle.hpp"
#include "daemon/parts.hpp"
#include "daemon/pass_inputs.hpp"

namespace gpuq::daemon {

namespace {

std::string describe_end(const json& failure);

// The first failure in words: which rank, how it ended, and what it said: the class of failure
// its log names (CUDA out of memory, ...) with the line that named it, else its log's last line.
// `notes`: what the GPUs said meanwhile (gpu_failure_notes).
std::string describe_exit(const json& failure, const std::string& notes) {
  if (!failure.is_object()) return notes.empty() ? "failed" : "failed; " + notes;
  auto text = [&](const char* key) {
    const auto it = failure.find(key);
    return it != failure.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string words = common::failure_class_words(text("class"));
  if (!words.empty()) {
    const std::string line = text("class_line");
    return describe_end(failure) + ": " + words + (notes.empty() ? "" : " (" + notes + ")") +
           (line.empty() ? "" : ": " + line);
  }
  const std::string said = text("message");
  return describe_end(failure) + (notes.empty() ? "" : "; " + notes) + (said.empty() ? "" : ": " + said);
}

std::string describe_end(const json& failure) {
  std::string who = "rank " + std::to_string(failure.value("rank", 0));
  if (failure.contains("signal") && failure["signal"].is_number_integer()) {
    int sig = failure["signal"].get<int>();
    // The kernel's OOM-kill count is the system's: another job's OOM kill while this rank died of
    // someone's SIGKILL reads the same. Likely, then, not certain.
    if (failure.value("oom_kill", false))
      return who + " was killed by signal 9 (SIGKILL), most likely by the kernel's out-of-memory killer";
    const char* name = sigabbrev_np(sig);
    return who + " was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  if (failure.contains("exit_code") && failure["exit_code"].is_number_integer())
    return who + " exited with code " + std::to_string(failure["exit_code"].get<int>());
  return who + " failed";
}

}  // namespace

// ---- descriptors --------------------------------------------------------------------------------

void DescriptorBudget::begin(bool launching, Descriptors fds) {
  m_free = launching ? fds.free : -1;
  m_reserved = fds.reserved;
  m_launching = launching;
  m_held_back = false;
}

std::optional<std::string> DescriptorBudget::spend() {
  if (m_free < 0) return std::nullopt;  // unknown: no /proc
  if (m_free >= m_reserved + k_descriptors_per_launch) {
    m_free -= k_descriptors_per_launch;
    return std::nullopt;
  }
  std::string why = "gpuqd is short of file descriptors (" + std::to_string(std::max(0L, m_free)) + " free, " +
                    std::to_string(m_reserved + k_descriptors_per_launch) +
                    " needed to start a job): raise its limit (LimitNOFILE=, ulimit -n)";
  if (!m_held_back && !m_short) std::cerr << "gpuqd: " << why << "; jobs wait until some free up\n";
  m_held_back = true;
  return why;
}

void DescriptorBudget::end() {
  if (m_held_back)
    m_short = true;  // said once a shortage, and once when it is over
  else if (m_launching && std::exchange(m_short, false))
    std::cerr << "gpuqd: file descriptors free again; starting jobs\n";
}

// ---- launching ----------------------------------------------------------------------------------

Attempts::Attempts(boost::asio::io_context& io, const Config& config, Store& store, JobTable& jobs, Users& users,
                   Machine& machine, Executor& executor, EventTick& events, MetricCounters& metrics, Needs needs)
    : m_io(io),
      m_config(config),
      m_store(store),
      m_jobs(jobs),
      m_users(users),
      m_machine(machine),
      m_executor(executor),
      m_events(events),
      m_metrics(metrics),
      m_needs(std::move(needs)) {}

bool Attempts::prepare(Active& a, const Placement& placement, double now) {
  const std::vector<int>& gpus = placement.gpus;
  event::Launched launched{gpus, placement.cpu_slots, {}, 0, now};
  {
    JobRecord slots = a.rec;  // the cores follow from the slots, under this gpuqd's CPU mask
    slots.run.cpu_slots = placement.cpu_slots;
    launched.cores = job_cores(slots, m_machine.cores.cores);
  }
  if (a.rec.spec.mode == common::Mode::ddp) {
    std::set<int> in_use;
    for (std::int64_t id : m_jobs.running_ids())
      if (const int port = m_jobs.at(id).rec.run.master_port) in_use.insert(port);
    launched.master_port = pick_free_port(in_use);
  }
  JobRecord next = next_record(a.rec, launched);

  if (!next.spec.train.is_null()) next.spec.command[0] = m_config.worker_path;
  const std::string jdir = job_dir(m_config.state_dir, next.id);
  const std::string adir = attempt_dir(m_config.state_dir, next.id, next.attempt);
  // Lab mode: a job of another user than gpuqd's runs as that user (the shim becomes them).
  const bool as_owner = m_config.multi_user && next.uid != ::geteuid();
  const common::Account* owner = as_owner ? m_users.account(next.uid) : nullptr;
  if (as_owner) {
    auto made =
        owner ? make_owned_dirs(m_config.state_dir, next.id, next.attempt, owner->uid, m_config.admin_gid, owner->gid)
              : Result<bool>(Error{ErrorCode::not_found, "its owner, uid " + std::to_string(next.uid) +
                                                             ", has no account in the user database"});
    if (!made) {
      m_needs.commit({std::move(next)}, {}, {});
      finish(a, Outcome::failed(made.error().message + "; not started"));
      return false;
    }
  } else {
    for (const auto& dir : {adir, jdir + "/checkpoints"})
      if (auto made = common::ensure_private_dir(dir); !made) throw RequestError(made.error());
  }
  std::vector<std::string> uuids;
  std::int64_t gpu_total_mb = 0;  // of the first of its GPUs: a shared job's memory is a part of it
  for (int idx : gpus)
    if (const Gpu* g = m_machine.inventory.find(idx)) {
      uuids.push_back(g->uuid);
      if (gpu_total_mb == 0) gpu_total_mb = g->memory_total_mb;
    }
  Env base;
  const bool inherit = m_executor.inherits_environment();
  const json batch_env = inherit ? json::object() : m_store.batch_env(next.batch);  // named: items() would dangle
  for (const auto& [k, v] : batch_env.items())
    if (v.is_string()) base[k] = v.get<std::string>();
  auto doc = launch_document(next, base, uuids, m_config.state_dir, m_config.grace_s, m_config.log_limit_mb << 20,
                             m_machine.cores.cores, m_machine.cores.nodes,
                             {inherit, owner,
                              inherit ? 0
                                      : omp_share(next.spec, static_cast<int>(m_machine.cores.cores.size()),
                                                  static_cast<int>(m_machine.inventory.gpus().size()), gpu_total_mb)});
  // What a preemption sends the ranks first, and how long they have to checkpoint (supervisor.cpp).
  // Its pid file made once, where a gpuqd restarted before the supervisor's claim withdraws the
  // attempt by making it first (LocalExecutor::adopt); Slurm may run an attempt's script again.
  if (m_executor.withdraws_numbers()) doc["claim"] = true;
  doc["preempt"] = {{"signal", common::preempt_signal_number(next.spec.preempt_signal)},
                    {"grace_s", preempt_grace_s(next.spec)},
                    {"file", preempt_file_path(adir)}};
  if (auto w = write_file_atomic(adir + "/launch.json", doc.dump()); !w) throw RequestError(w.error());

  // Durable before the process exists: a crash from here on re-adopts or restarts this attempt.
  m_needs.commit({std::move(next)}, {}, {});
  a.wait_reason.clear();
  a.event_offsets.clear();

  // A working directory gone since submission fails the attempt with that reason (a job like
  // `rm -rf ./*` must never run elsewhere; the rank's own chdir also refuses, should it go later).
  struct stat st {};
  if (const bool missing = ::stat(a.rec.spec.cwd.c_str(), &st) != 0; missing || !S_ISDIR(st.st_mode)) {
    const std::string why = missing ? std::strerror(errno) : "not a directory";
    finish(a, Outcome::failed("the job's working directory " + a.rec.spec.cwd + " is gone (" + why + "); not started"));
    return false;
  }
  return true;
}

void Attempts::start(Active& a) {
  Executor::Attempt attempt = attempt_of(a.rec);
  const JobRecord& rec = a.rec;
  AttemptLimits& limits = attempt.limits;
  limits.ranks = rec.spec.mode == common::Mode::ddp ? rec.spec.ranks : 1;
  limits.memory_mb = rec.spec.memory_mb;
  limits.pids = m_config.pids_per_attempt;
  // Each rank's cpuset: its cores, or where it has none the cores gpuqd may use (joining a cpuset
  // resets a process's affinity to it on kernels before 6.2; an unpinned rank had gpuqd's mask).
  limits.rank_cores = rank_cores(rec, m_machine.cores.cores);
  limits.free_cores = m_machine.cores.cores;
  limits.denied_devices = denied_gpu_devices(m_machine.inventory.gpus(), rec.run.gpus);
  if (auto started = m_executor.start(attempt); !started) {
    std::cerr << "gpuqd: job " << a.rec.id << ": " << started.error().message << "\n";
    finish(a, Outcome::failed(started.error().message));
  }
}

void Attempts::start_array(const std::vector<std::int64_t>& ids, int limit) {
  if (ids.size() == 1) start(m_jobs.at(ids[0]));
  if (ids.size() < 2) return;
  std::vector<Executor::Attempt> attempts;
  for (std::int64_t id : ids)
    attempts.push_back(attempt_of(m_jobs.at(id).rec));
  if (auto started = m_executor.start_array(attempts, limit); !started) {
    std::cerr << "gpuqd: jobs " << ids.front() << "-" << ids.back() << ": " << started.error().message << "\n";
    for (std::int64_t id : ids)
      finish(m_jobs.at(id), Outcome::failed(started.error().message));
  }
}

Executor::Attempt Attempts::attempt_of(const JobRecord& rec) const {
  Executor::Attempt attempt{rec.id, attempt_dir(m_config.state_dir, rec.id, rec.attempt), &rec.spec, {}, rec.uid, {}};
  attempt.suspended = rec.run.suspended_for != 0;
  attempt.suspended_s =
      rec.run.suspended_s + (attempt.suspended ? std::max(0.0, wall_now() - rec.run.suspended_at) : 0.0);
  for (std::int64_t dep : rec.after)  // handed over after them (Executor::follows)
    if (m_jobs.is_running(dep)) attempt.after.push_back(dep);
  return attempt;
}

// ---- attempts ending ----------------------------------------------------------------------------

void Attempts::ended(std::int64_t id) {
  Active* found = m_jobs.find(id);
  if (!found || found->rec.state != JobState::running) return;
  Active& a = *found;
  a.retry.reset();
  try {
    if (!m_events.ingest(a, true)) throw RequestError(ErrorCode::store_error, "its last events could not be stored");
    finish(a, m_executor.outcome(attempt_of(a.rec)));
  } catch (const RequestError& e) {
    // A full disk, say: the job stays running in the records until its end is stored, and its
    // end is tried again, as a launch is; nothing else would ever record it.
    std::cerr << "gpuqd: job " << id << " ended, but its end cannot be recorded (" << e.what() << "); trying again in "
              << k_write_retry_s << " s\n";
    a.retry = std::make_unique<boost::asio::steady_timer>(
        m_io, std::chrono::milliseconds(static_cast<int>(k_write_retry_s * 1000)));
    a.retry->async_wait([this, id](const boost::system::error_code& ec) {
      if (!ec) ended(id);
    });
  }
}

void Attempts::finish(Active& a, const Outcome& outcome) {
  const double now = wall_now();
  // Its record as it ends: with the most GPU memory NVML saw this attempt hold kept (whatever
  // comes of the end; a copy: `a` is gone once its end is stored).
  JobRecord ending = a.rec;
  if (const auto peak = m_machine.gpu_processes.peak_mb(ending.id))
    ending.gpu_budget.peak_mb = std::max(ending.gpu_budget.peak_mb, *peak);
  const JobRecord& rec = ending;
  // Stopped by the hang watch: a failure, to be retried, not a cancel.
  const std::string hung = m_events.hangs().ended(rec, now);
  if (outcome.withdrawn && !rec.run.cancel_requested) {
    // Taken back before it started (withdraw_orphans): in line again as the same attempt, to
    // wait for its dependency's next attempt, or to fail with it.
    m_needs.commit({next_record(rec, back_in_line(rec, "back in line: a job it waits for did not succeed", now))}, {},
                   {});
    m_needs.withdraw_orphans();  // those handed over after this one
    m_needs.schedule_soon();
    return;
  }
  const json& failure = outcome.first_failure;
  event::Ended end{JobState::failed,    "",      outcome.exit_code,
                   outcome.exit_signal, failure, outcome.ended_at.value_or(now),
                   outcome.external_id};
  // Where another system held it after the launch (pending in Slurm), the run began when its
  // supervisor started: the record's runtime is the job's, not its wait there.
  if (outcome.began_at) end.started_at = std::min(*outcome.began_at, end.at);

  bool retryable = false;
  if (!hung.empty() && !rec.run.cancel_requested) {
    end.state = JobState::failed;
    end.reason = hung;
    retryable = true;
  } else if (rec.run.cancel_requested || outcome.cancelled) {
    end.state = JobState::cancelled;
    // Who, when not gpuq: the executor's word ("cancelled in Slurm (scancel), not through gpuq").
    end.reason =
        rec.run.cancel_requested ? "cancelled while running" : outcome.error.value_or("cancelled while running");
  } else if (outcome.timed_out) {
    end.state = JobState::timed_out;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "timed out after %g s", rec.spec.timeout_s);
    // Without a timeout of its own, the limit was another system's (Slurm's): its word says which.
    end.reason = rec.spec.timeout_s <= 0 && outcome.error ? *outcome.error : std::string(buf);
  } else if (outcome.all_ok && !failure.is_object()) {
    end.state = JobState::succeeded;
  } else if (outcome.oom_kills.value_or(0) > 0) {
    // An OOM killer killed a process of it (a shell wrapper's child, say), and it failed: that is
    // why, whatever the rank that failed first shows.
    end.state = JobState::out_of_memory;
    const std::int64_t n = *outcome.oom_kills;
    end.reason = "out of memory: the OOM killer killed " + std::to_string(n) + (n == 1 ? " process" : " processes") +
                 " of it" +
                 (rec.spec.memory_mb > 0 ? " (its limit: " + std::to_string(rec.spec.memory_mb) + " MiB a rank)" : "") +
                 "; " + (outcome.error ? *outcome.error : describe_exit(failure, gpu_failure_notes(rec, failure)));
    retryable = rec.spec.retry_on_oom && !outcome.final;
  } else {
    end.reason = outcome.error ? *outcome.error : describe_exit(failure, gpu_failure_notes(rec, failure));
    retryable = !outcome.final;  // the executor's word: another attempt would fare the same
  }

  // Processes of it live on (stuck in the kernel): its GPUs go to no other job until they are gone.
  if (const std::string why = m_executor.lingering(attempt_of(rec)); !why.empty()) {
    const std::string held = hold_gpus(rec, why);
    end.reason +=
        (end.reason.empty() ? "" : "; ") + why + (held.empty() ? "" : "; GPU " + held + " drained until they are gone");
  }

  // CUDA out of memory while it kept within its budget, as far as NVML's looks saw, and something
  // outside gpuq grew beside it: not its budget's fault (gpu_budgets.hpp), so not raised for it.
  // Its watch goes once this end is stored: a store that refuses has finish() called again, which
  // is to judge as this one did.
  const bool crowded_out = m_machine.gpu_processes.crowded_within(rec.id, gpu_budget_mb(rec));
  struct ForgetOnceStored {
    GpuProcesses& processes;
    std::int64_t id;
    int unwinding = std::uncaught_exceptions();
    ~ForgetOnceStored() {
      if (std::uncaught_exceptions() == unwinding) processes.forget(id);
    }
  } forget_once_stored{m_machine.gpu_processes, rec.id};
  if (rec.run.started_at > 0 && end.at >= rec.run.started_at) m_metrics.run_time.observe(end.at - rec.run.started_at);
  // Fair share remembers its GPU time, once the end is stored (`rec` is gone by then).
  const uid_t owner = rec.uid;
  const double gpu_s = rec.run.started_at > 0
                           ? static_cast<double>(rec.run.gpus.size()) * std::max(0.0, end.at - rec.run.started_at)
                           : 0;
  // Preempted by the system that ran it (Slurm): as if gpuq had preempted it, by that system.
  JobRecord preempted = rec;
  if (!outcome.preempted_by.empty() && !stop_asked(rec) && end.state != JobState::succeeded && rec.spec_error.empty()) {
    preempted = next_record(rec, event::PreemptRequested{outcome.preempted_by, end.at});
    ++m_metrics.preemptions[rec.uid];
  }
  // Preempted (and not cancelled, nor ended on its own before the signal came: succeeded, timed
  // out, or failed with a rank's failure, each of which its supervisor lets go on): back in line
  // as the same job, no retry spent, saying who preempted it.
  if (preempted.run.preempt_requested && !rec.run.cancel_requested && end.state != JobState::succeeded &&
      !outcome.timed_out && !failure.is_object() && rec.spec_error.empty()) {
    const std::string why = "preempted by " + preempted.run.preempted_by + ": attempt " +
                            std::to_string(preempted.attempt) + " was stopped" +
                            (preempted.run.checkpoint_at > 0 ? " (it had checkpointed)" : "");
    m_needs.commit({next_record(preempted, event::Preempted{why})}, {}, {});
    if (gpu_s > 0) m_users.add_use(owner, gpu_s, now);
    m_needs.withdraw_orphans();
    m_needs.schedule_soon();
    return;
  }
  // Stopped by `gpuq requeue` (and not cancelled, nor done before the stop came): back in line as
  // the same job, no retry spent, its lingering processes' GPUs held as for any end.
  if (rec.run.requeue_requested && !rec.run.cancel_requested && end.state != JobState::succeeded &&
      rec.spec_error.empty()) {
    const std::string why =
        (rec.run.over_budget.empty() ? "requeued (gpuq requeue)" : "requeued: " + rec.run.over_budget) + ": attempt " +
        std::to_string(rec.attempt) + " was stopped";
    m_needs.commit({next_record(rec, event::Requeued{why})}, {}, {});
    if (gpu_s > 0) m_users.add_use(owner, gpu_s, now);
    m_needs.withdraw_orphans();
    m_needs.schedule_soon();
    return;
  }
  // CUDA ran out of memory in a shared job at its budget: it runs again with a larger one, no retry
  // spent, up to the whole GPU (at which it fails as any job does, saying so).
  if (end.state == JobState::failed && failure.is_object() && failure.value("class", json()) == "cuda_oom" &&
      rec.spec.shared && gpu_budget_mb(rec) > 0 && !rec.run.cancel_requested && rec.spec_error.empty() &&
      !crowded_out) {
    std::int64_t cap = 0;  // the least any of its GPUs has beside the memory held outside gpuq
    for (int gpu : rec.run.gpus)
      if (const Gpu* g = m_machine.inventory.find(gpu)) {
        const auto f = m_machine.gpu_processes.foreign_mb().find(gpu);
        const std::int64_t has = g->memory_total_mb - (f == m_machine.gpu_processes.foreign_mb().end() ? 0 : f->second);
        if (cap == 0 || has < cap) cap = has;
      }
    const std::int64_t budget = gpu_budget_mb(rec);
    const std::int64_t raised = raised_budget_mb(budget, 0, cap);
    if (raised > budget) {
      const std::string why = "raised from " + std::to_string(budget) +
                              " MiB after CUDA ran out of memory in attempt " + std::to_string(rec.attempt);
      JobRecord more = next_record(rec, event::OverBudget{raised, why, false, now});
      m_needs.commit(
          {next_record(more, event::Requeued{"requeued: CUDA ran out of memory at its GPU memory budget of " +
                                             std::to_string(budget) + " MiB; its budget is now " +
                                             std::to_string(raised) + " MiB (" + end.reason + ")"})},
          {}, {});
      ++m_metrics.budget_oom_requeues;
      if (gpu_s > 0) m_users.add_use(owner, gpu_s, now);
      m_needs.withdraw_orphans();
      m_needs.schedule_soon();
      return;
    }
    end.reason += "; at its GPU memory budget's cap (" + std::to_string(cap) + " MiB, all its GPU has)";
  }
  const int run = rec.attempt - rec.attempt_base;  // attempts since the job was submitted or restarted
  if (retryable && has_retry_left(rec)) {
    double delay = std::min(m_config.retry_backoff_max_s, m_config.retry_backoff_s * std::pow(2.0, run - 1));
    end.reason = "attempt " + std::to_string(rec.attempt) + " failed (" + end.reason + "); retry " +
                 std::to_string(run) + "/" + std::to_string(rec.spec.retries) + " in " +
                 std::to_string(static_cast<int>(std::ceil(delay))) + " s";
    // Record the failed attempt's end, then the requeue, as two transitions of one transaction.
    JobRecord failed = next_record(rec, end);
    JobRecord queued = next_record(failed, event::Retried{now + delay, end.reason});
    ++m_metrics.retries;
    m_needs.commit({std::move(failed), std::move(queued)}, {}, {});
    if (gpu_s > 0) m_users.add_use(owner, gpu_s, now);
    m_needs.withdraw_orphans();
    m_needs.schedule_soon();
    return;
  }
  const bool succeeded = end.state == JobState::succeeded;
  m_needs.commit({next_record(rec, end)}, {}, {});  // `a` is gone: the job has ended
  if (gpu_s > 0) m_users.add_use(owner, gpu_s, now);
  if (!succeeded) m_needs.withdraw_orphans();
  m_needs.schedule_soon();
}

double Attempts::preempt_grace_s(const common::JobSpec& spec) const {
  return preempt_grace_of(spec, m_config);
}

void Attempts::preempt(const std::vector<std::int64_t>& ids, const std::vector<std::string>& by, double now) {
  std::vector<JobRecord> asked;
  for (std::size_t i = 0; i < ids.size(); ++i)
    asked.push_back(next_record(m_jobs.at(ids[i]).rec, event::PreemptRequested{by[i], now}));
  m_needs.commit({}, {}, std::move(asked));  // the intent, stored: a gpuqd restarted meanwhile preempts it still
  // Tests only: gpuqd dies here, the intent stored and no supervisor signalled yet (the window
  // that adoption's preempt closes; test_preempt.Recovery).
  static const bool die_here = std::getenv("GPUQ_TEST_DIE_AFTER_PREEMPT_INTENT") != nullptr;
  if (die_here) ::_exit(86);
  for (std::int64_t id : ids) {
    const JobRecord& rec = m_jobs.at(id).rec;
    ++m_metrics.preemptions[rec.uid];
    std::cerr << "gpuqd: preempting " << job_label(rec) << " for " << rec.run.preempted_by << "\n";
    m_executor.preempt(id, preempt_grace_s(rec.spec));
  }
}

bool Attempts::suspend(const std::vector<std::int64_t>& victims, const JobRecord& borrower, double now) {
  std::vector<JobRecord> asked;
  for (std::int64_t id : victims)
    asked.push_back(
        next_record(m_jobs.at(id).rec, event::Suspended{borrower.id, borrower.attempt + 1, job_label(borrower), now}));
  m_needs.commit({}, {}, std::move(asked));  // stored first: a gpuqd restarted meanwhile thaws them
  bool all = true;
  for (std::int64_t id : victims) {
    m_suspended.insert(id);
    if (m_executor.suspend(id, true)) continue;
    all = false;
    const JobRecord& rec = m_jobs.at(id).rec;
    m_unfreezable[id] = rec.attempt;  // not asked again: no suspension counted each pass for nothing
    std::cerr << "gpuqd: cannot freeze " << job_label(rec) << " (its cgroup's freezer refused)\n";
  }
  if (!all) {  // none of it: those frozen are thawed, and the suspension is undone
    std::cerr << "gpuqd: " << job_label(borrower) << " is not started beside suspended jobs\n";
    std::vector<JobRecord> back;
    for (std::int64_t id : victims) {
      m_executor.suspend(id, false);
      back.push_back(next_record(m_jobs.at(id).rec, event::Resumed{now, true}));  // suspended just above
    }
    m_needs.commit({}, {}, std::move(back));
    return false;
  }
  for (std::int64_t id : victims) {
    const JobRecord& rec = m_jobs.at(id).rec;
    ++m_metrics.preemptions[rec.uid];
    std::cerr << "gpuqd: suspended " << job_label(rec) << " for " << rec.run.suspended_by << "\n";
  }
  return true;
}

bool Attempts::thaw_lent(double now) {
  std::vector<JobRecord> thawed;
  for (auto it = m_suspended.begin(); it != m_suspended.end();) {
    const Active* a = m_jobs.find(*it);
    if (!a || a->rec.state != JobState::running || a->rec.run.suspended_for == 0) {
      it = m_suspended.erase(it);  // ended, or thawed otherwise (a stop asked of it)
      continue;
    }
    const Active* b = m_jobs.find(a->rec.run.suspended_for);
    if (b && b->rec.state == JobState::running && b->rec.attempt == a->rec.run.suspended_for_attempt) {
      ++it;
      continue;
    }
    if (!m_executor.suspend(*it, false)) {  // still frozen, maybe: tried again next pass
      if (m_thaw_failed.insert(*it).second)
        std::cerr << "gpuqd: cannot thaw " << job_label(a->rec) << " (its cgroup's freezer refused); trying again\n";
      ++it;
      continue;
    }
    m_thaw_failed.erase(*it);
    thawed.push_back(next_record(a->rec, event::Resumed{now}));
    ++it;
  }
  if (thawed.empty()) return false;
  for (const auto& r : thawed)
    std::cerr << "gpuqd: thawed " << job_label(r) << "\n";
  m_needs.commit({}, {}, std::move(thawed));  // a refusal (a full disk): thawed again next pass, stored then
  return true;
}

void Attempts::keep_suspended(std::int64_t id, double now) {
  if (m_executor.suspend(id, true)) {
    m_suspended.insert(id);
    return;
  }
  const JobRecord& rec = m_jobs.at(id).rec;
  if (m_executor.supervisor_pid(id) > 0) {
    // No freezer now (gpuqd restarted without one): nothing keeps it frozen, nor could thaw it.
    std::cerr << "gpuqd: cannot keep " << job_label(rec) << " frozen (no cgroup freezer now); thawing it\n";
    m_executor.suspend(id, false);
    m_unfreezable[id] = rec.attempt;
  }  // else its supervisor is gone, and what is left of it is being killed (frozen or not): it ends
  m_needs.commit({}, {}, {next_record(rec, event::Resumed{now})});
}

std::string Attempts::hold_gpus(const JobRecord& rec, const std::string& why) {
  std::string listed;
  for (int gpu : rec.run.gpus) {
    const Gpu* g = m_machine.inventory.find(gpu);
    if (!g) continue;  // gone from the inventory since
    Held& h = m_held_gpus[gpu];
    if (h.jobs.empty()) {
      // Drained already for another reason (an admin's, a failed health check: likely what left the
      // processes stuck): that drain is left as it is, and not undone when they are gone.
      if (m_machine.health.drained(g->uuid)) {
        m_held_gpus.erase(gpu);
        continue;
      }
      h.reason = "job " + std::to_string(rec.id) + ": " + why;
      try {
        m_machine.health.set_drained({{gpu}, {}, h.reason}, true);
      } catch (const RequestError& e) {  // the store refused: the GPU stays in service
        std::cerr << "gpuqd: job " << rec.id << ": cannot drain GPU " << gpu << ": " << e.what() << "\n";
        m_held_gpus.erase(gpu);
        continue;
      }
    }
    h.jobs.insert(rec.id);  // a GPU shared with another lingering job: back once neither lingers
    listed += (listed.empty() ? "" : ",") + std::to_string(gpu);
  }
  return listed;
}

void Attempts::resume_holds(const std::vector<std::int64_t>& lingering) {
  const std::set<std::int64_t> left(lingering.begin(), lingering.end());
  std::vector<std::pair<int, std::string>> gone;  // GPUs whose job has nothing left
  for (const auto& g : m_machine.inventory.gpus()) {
    const auto it = m_machine.health.drained().find(g.uuid);
    if (it == m_machine.health.drained().end()) continue;
    const std::string& reason = it->second;  // "job N: processes of it did not die ..." (hold_gpus)
    long long job = 0;
    int end = 0;
    if (std::sscanf(reason.c_str(), "job %lld: processes of it did not die%n", &job, &end) != 1 || end == 0) continue;
    if (left.count(job)) {
      Held& h = m_held_gpus[g.index];
      h.jobs.insert(job);
      h.reason = reason;
    } else {
      gone.emplace_back(g.index, reason);
    }
  }
  for (const auto& [gpu, reason] : gone) {
    try {
      m_machine.health.release({gpu}, reason);
    } catch (const RequestError& e) {
      std::cerr << "gpuqd: cannot put GPU " << gpu << " back in service (" << e.what() << "); `gpuq undrain` it\n";
    }
  }
}

void Attempts::released(std::int64_t id) {
  try {
    for (const auto& [gpu, h] : m_held_gpus)
      if (h.jobs.size() == 1 && h.jobs.count(id)) m_machine.health.release({gpu}, h.reason);
  } catch (const RequestError& e) {  // the store refused: tried again later (what went back stays back)
    std::cerr << "gpuqd: job " << id << ": cannot put its GPUs back in service (" << e.what() << "); trying again in "
              << k_write_retry_s << " s\n";
    auto retry = std::make_shared<boost::asio::steady_timer>(
        m_io, std::chrono::milliseconds(static_cast<int>(k_write_retry_s * 1000)));
    retry->async_wait([this, id, retry](const boost::system::error_code& ec) {
      if (!ec) released(id);
    });
    return;
  }
  bool any = false;
  for (auto it = m_held_gpus.begin(); it != m_held_gpus.end();) {
    any = it->second.jobs.erase(id) > 0 || any;
    it = it->second.jobs.empty() ? m_held_gpus.erase(it) : std::next(it);
  }
  if (any) m_needs.schedule_soon();
}

void Attempts::hold_budgets(double now) {
  const GpuProcesses& seen = m_machine.gpu_processes;
  const auto& listed = seen.listed();
  if (listed.empty()) return;
  std::vector<BudgetJob> jobs;
  bool any_over = false;
  for (const Active& a : m_jobs.running()) {
    const JobRecord& r = a.rec;
    const auto held = seen.now_mb().find(r.id);
    for (int gpu : r.run.gpus) {
      if (!listed.count(gpu)) continue;  // NVML could not say
      std::int64_t used = 0;
      if (held != seen.now_mb().end())
        if (const auto u = held->second.find(gpu); u != held->second.end()) used = u->second;
      BudgetJob j{r.id, gpu, r.spec.shared ? gpu_budget_mb(r) : 0, used, false, m_config.budget_stops(r.spec)};
      j.judged = r.spec.shared && !stop_asked(r) && r.run.suspended_for == 0 && r.spec_error.empty();
      j.leaving = stop_asked(r);
      any_over = any_over || (j.judged && j.budget_mb > 0 && j.used_mb > j.budget_mb);
      jobs.push_back(j);
    }
  }
  if (!any_over) return;  // every look but a rare one
  std::vector<BudgetGpu> gpus;
  for (const auto& g : m_machine.inventory.gpus())
    if (listed.count(g.index)) {
      const auto f = seen.foreign_mb().find(g.index);
      gpus.push_back({g.index, g.memory_total_mb, f == seen.foreign_mb().end() ? 0 : f->second});
    }
  const std::vector<Overrun> over = judge_budgets(gpus, jobs);
  std::vector<JobRecord> changed;
  for (const Overrun& o : over) {
    std::string why = overrun_words(o);
    if (o.stop) {
      std::string owed;
      for (std::int64_t id : o.short_of)
        owed += (owed.empty() ? "job " : ", job ") + std::to_string(id);
      why = "over its GPU memory budget (" + why + ", while " + owed + " beside it " +
            (o.short_of.size() == 1 ? "was" : "were") + " owed " + std::to_string(o.short_mb) +
            " MiB more than the GPU had free); its budget is now " + std::to_string(o.raised_mb) + " MiB";
    } else {
      why = "raised from " + std::to_string(o.budget_mb) + " MiB: " + why + ", with room beside it";
    }
    changed.push_back(next_record(m_jobs.at(o.id).rec, event::OverBudget{o.raised_mb, why, o.stop, now}));
  }
  try {
    m_needs.commit({}, {}, changed);  // stored first: a gpuqd restarted meanwhile stops it still
  } catch (const RequestError& e) {   // the next look tries again
    std::cerr << "gpuqd: cannot record GPU memory budgets (" << e.what() << ")\n";
    return;
  }
  for (const JobRecord& r : changed) {
    std::cerr << "gpuqd: " << job_label(r) << ": "
              << (r.run.over_budget.empty() ? "budget " + r.gpu_budget.why : "stopping it: " + r.run.over_budget)
              << "\n";
    ++(r.run.over_budget.empty() ? m_metrics.budget_raises : m_metrics.budget_stops);
    if (!r.run.over_budget.empty()) m_executor.stop(r.id);
  }
}

// What the GPUs say of a failed attempt.
std::string Attempts::gpu_failure_notes(const JobRecord& r, const json& failure) {
  if (r.run.gpus.empty() || m_machine.inventory.source().rfind("nvml", 0) != 0) return "";
  std::vector<std::string> notes;
  const auto cls = failure.is_object() ? failure.find("class") : failure.end();
  if (failure.is_object() && cls != failure.end() && *cls == "cuda_oom") {
    if (m_machine.gpu_processes.on()) m_machine.gpu_processes.look();  // the latest
    std::map<int, std::int64_t> totals;
    for (const auto& g : m_machine.inventory.gpus())
      totals[g.index] = g.memory_total_mb;
    notes = m_machine.gpu_processes.oom_notes(r.id, totals, [this](int pid) {
      const auto owner = common::process_owner(pid);
      return owner ? m_users.name_of(*owner) : std::string();
    });
  }
  for (auto& n : m_machine.health.xids_since(r.run.gpus, r.run.started_at))
    notes.push_back(std::move(n));
  std::string out;
  for (const auto& n : notes)
    out += (out.empty() ? "" : "; ") + n;
  return out;
}

}  // namespace gpuq::daemon
