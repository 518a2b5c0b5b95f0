// Running jobs: the scheduling pass (which queued jobs start, on what), launching an attempt
// through the executor, recording how it ended (a retry, or the job's end) once the executor says
// it has, and landing every change of a record (commit, land, apply). Their event files are
// the event tick's (event_tick.hpp).
#include "daemon/daemon.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>
#include <set>

#include "common/failure_class.hpp"
#include "common/paths.hpp"
#include "daemon/events.hpp"
#include "daemon/lifecycle.hpp"
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
  if (fail_blocked_dependents(now)) m_pacer.soon();  // more to fail, in the next pass

  std::vector<PendingJob> queue;
  queue.reserve(m_jobs.queue().size());
  BatchLimits limits;  // of the batches with a job in this pass
  std::int64_t seen_batch = 0;  // a batch's jobs lie together in line: its limit is looked up once a run
  double next_retry = 0;
  for (const auto& [_, q] : m_jobs.queue()) {
    if (q.has_deps || q.not_before > now) {
      Active& a = m_jobs.at(q.job.id);
      bool deps_done = true;
      for (auto dep : a.rec.after) deps_done = deps_done && dependency_met(dep);
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
  const CpuSlots cpu = reads().cpu_pool();
  std::vector<GpuState> gpus = gpus_for_pass(reads());

  Plan plan;
  std::vector<Handover::Array> units;  // attempts handed over as one array
  if (m_executor->places_work()) {  // another system (Slurm) decides where and when
    // A first attempt of a batch may join an array; a retry goes alone.
    const auto key = [this](const PendingJob& job) {
      const JobRecord& r = m_jobs.at(job.id).rec;
      return r.attempt == r.attempt_base && job.batch != 0 ? m_executor->array_key(attempt_of(r)) : std::string();
    };
    auto handover = hand_over(queue, std::move(limits), key, m_executor->max_array());
    plan = std::move(handover.plan);
    units = std::move(handover.arrays);
  } else {
    plan = schedule(std::move(queue), std::move(gpus), now, cpu, true, std::move(limits), std::move(users));
  }
  m_last_pass.remember(plan);
  for (auto& [id, reason] : plan.waiting) {
    Active& a = m_jobs.at(id);
    m_last_pass.say(a, m_gpu_processes.with_foreign_note(a.rec.spec.gpu_memory_mb,
                                                         m_health.with_drain_note(a.rec.spec.gpus, std::move(reason))));
  }
  auto prepared = [&](Active& a, const Placement& p) {
    try {
      return prepare_launch(a, p, now);
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
  // Descriptors: a launch that would leave fewer than fds_reserved waits, queued and
  // saying why, and is tried again in a second (a job's end or a client's leaving frees some).
  const bool launching = !plan.start.empty() || !units.empty();
  const Descriptors fds = launching ? descriptors() : Descriptors{};
  long fds_free = fds.free;
  const long fds_reserved = fds.reserved;
  bool held_back = false;
  const auto fds_short = [&](Active& a) {
    if (fds_free < 0) return false;  // unknown: no /proc
    if (fds_free >= fds_reserved + k_descriptors_per_launch) {
      fds_free -= k_descriptors_per_launch;
      return false;
    }
    m_last_pass.say(a, "gpuqd is short of file descriptors (" + std::to_string(std::max(0L, fds_free)) + " free, " +
                           std::to_string(fds_reserved + k_descriptors_per_launch) +
                           " needed to start a job): raise its limit (LimitNOFILE=, ulimit -n)");
    if (!held_back && !m_fds_short) std::cerr << "gpuqd: " << a.wait_reason << "; jobs wait until some free up\n";
    held_back = true;
    next_retry = next_retry == 0 ? now + 1 : std::min(next_retry, now + 1);
    return true;
  };
  for (const auto& p : plan.start) {
    Active& a = m_jobs.at(p.id);
    if (fds_short(a)) continue;
    if (prepared(a, p)) start_attempt(a);
  }
  for (const auto& unit : units) {
    std::vector<std::int64_t> ids;
    for (std::int64_t id : unit.ids)
      if (!fds_short(m_jobs.at(id)) && prepared(m_jobs.at(id), {id, {}, {}})) ids.push_back(id);
    if (ids.size() == 1) start_attempt(m_jobs.at(ids[0]));
    if (ids.size() < 2) continue;
    std::vector<Executor::Attempt> attempts;
    for (std::int64_t id : ids) attempts.push_back(attempt_of(m_jobs.at(id).rec));
    if (auto refused = m_executor->start_array(attempts, unit.limit)) {
      std::cerr << "gpuqd: jobs " << ids.front() << "-" << ids.back() << ": " << refused->message << "\n";
      for (std::int64_t id : ids) finish_attempt(m_jobs.at(id), Outcome::failed(refused->message));
    }
  }
  if (held_back) m_fds_short = true;  // said once a shortage, and once when it is over
  else if (launching && std::exchange(m_fds_short, false)) std::cerr << "gpuqd: file descriptors free again; starting jobs\n";
  if (next_retry > 0) m_pacer.at(next_retry, now);
  m_events.arm();
}

bool Daemon::prepare_launch(Active& a, const Placement& placement, double now) {
  const std::vector<int>& gpus = placement.gpus;
  event::Launched launched{gpus, placement.cpu_slots, {}, 0, now};
  {
    JobRecord slots = a.rec;  // the cores follow from the slots, under this gpuqd's CPU mask
    slots.run.cpu_slots = placement.cpu_slots;
    launched.cores = job_cores(slots, m_cores.cores);
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
    auto made = owner ? make_owned_dirs(m_config.state_dir, next.id, next.attempt, owner->uid, m_config.admin_gid, owner->gid)
                      : Result<bool>(Error{ErrorCode::not_found, "its owner, uid " + std::to_string(next.uid) +
                                                                     ", has no account in the user database"});
    if (!made) {
      commit({std::move(next)});
      finish_attempt(a, Outcome::failed(made.error().message + "; not started"));
      return false;
    }
  } else {
    for (const auto& dir : {adir, jdir + "/checkpoints"})
      if (auto made = common::ensure_private_dir(dir); !made) throw RequestError(made.error());
  }
  std::vector<std::string> uuids;
  for (int idx : gpus)
    if (const Gpu* g = m_inventory.find(idx)) uuids.push_back(g->uuid);
  Env base;
  const bool inherit = m_executor->inherits_environment();
  const json batch_env = inherit ? json::object() : m_store->batch_env(next.batch);  // named: items() would dangle
  for (const auto& [k, v] : batch_env.items())
    if (v.is_string()) base[k] = v.get<std::string>();
  const auto doc = launch_document(next, base, uuids, m_config.state_dir, m_config.grace_s,
                                   m_config.log_limit_mb << 20, m_cores.cores, m_cores.nodes, {inherit, owner});
  if (auto w = write_file_atomic(adir + "/launch.json", doc.dump()); !w) throw RequestError(w.error());

  // Durable before the process exists: a crash from here on re-adopts or restarts this attempt.
  commit({std::move(next)});
  a.wait_reason.clear();
  a.event_offsets.clear();

  // A working directory gone since submission fails the attempt with that reason (a job like
  // `rm -rf ./*` must never run elsewhere; the rank's own chdir also refuses, should it go later).
  struct stat st {};
  if (const bool missing = ::stat(a.rec.spec.cwd.c_str(), &st) != 0; missing || !S_ISDIR(st.st_mode)) {
    const std::string why = missing ? std::strerror(errno) : "not a directory";
    finish_attempt(a, Outcome::failed("the job's working directory " + a.rec.spec.cwd + " is gone (" + why + "); not started"));
    return false;
  }
  return true;
}

void Daemon::start_attempt(Active& a) {
  if (auto refused = m_executor->start(attempt_of(a.rec))) {
    std::cerr << "gpuqd: job " << a.rec.id << ": " << refused->message << "\n";
    finish_attempt(a, Outcome::failed(refused->message));
  }
}

Executor::Attempt Daemon::attempt_of(const JobRecord& rec) const {
  Executor::Attempt attempt{rec.id, attempt_dir(m_config.state_dir, rec.id, rec.attempt), &rec.spec, {}, rec.uid};
  if (m_executor->places_work())
    for (std::int64_t dep : rec.after)
      if (m_jobs.is_running(dep)) attempt.after.push_back(dep);
  return attempt;
}

// ---- attempts ending ----------------------------------------------------------------------------

void Daemon::on_attempt_end(std::int64_t id) {
  Active* found = m_jobs.find(id);
  if (!found || found->rec.state != JobState::running) return;
  Active& a = *found;
  a.retry.reset();
  try {
    if (!m_events.ingest(a, true)) throw RequestError(ErrorCode::store_error, "its last events could not be stored");
    finish_attempt(a, m_executor->outcome(attempt_of(a.rec)));
  } catch (const RequestError& e) {
    // A full disk, say: the job stays running in the records until its end is stored, and its
    // end is tried again, as a launch is; nothing else would ever record it.
    std::cerr << "gpuqd: job " << id << " ended, but its end cannot be recorded (" << e.what() << "); trying again in "
              << k_write_retry_s << " s\n";
    a.retry = std::make_unique<asio::steady_timer>(m_io, std::chrono::milliseconds(static_cast<int>(k_write_retry_s * 1000)));
    a.retry->async_wait([this, id](const boost::system::error_code& ec) {
      if (!ec) on_attempt_end(id);
    });
  }
}

void Daemon::finish_attempt(Active& a, const Outcome& outcome) {
  const double now = wall_now();
  const JobRecord& rec = a.rec;
  // Stopped by the hang watch: a failure, to be retried, not a cancel.
  const std::string hung = m_events.hangs().ended(rec, now);
  if (outcome.withdrawn && !rec.run.cancel_requested) {
    // Taken back before it started (withdraw_orphans): in line again as the same attempt, to
    // wait for its dependency's next attempt, or to fail with it.
    commit({next_record(rec, back_in_line(rec, "back in line: a job it waits for did not succeed", now))});
    withdraw_orphans();  // those handed over after this one
    m_pacer.soon();
    return;
  }
  const json& failure = outcome.first_failure;
  event::Ended end{JobState::failed, "", outcome.exit_code, outcome.exit_signal, failure, outcome.ended_at.value_or(now),
                   outcome.external_id};
  // Where another system held it after the launch (pending in Slurm), the run began when its
  // supervisor started: the record's runtime is the job's, not its wait there.
  if (m_executor->places_work() && outcome.started_at) end.started_at = std::min(*outcome.started_at, end.at);

  bool retryable = false;
  if (!hung.empty() && !rec.run.cancel_requested) {
    end.state = JobState::failed;
    end.reason = hung;
    retryable = true;
  } else if (rec.run.cancel_requested || outcome.cancelled) {
    end.state = JobState::cancelled;
    // Who, when not gpuq: the executor's word ("cancelled in Slurm (scancel), not through gpuq").
    end.reason = rec.run.cancel_requested ? "cancelled while running" : outcome.error.value_or("cancelled while running");
  } else if (outcome.timed_out) {
    end.state = JobState::timed_out;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "timed out after %g s", rec.spec.timeout_s);
    end.reason = buf;
  } else if (outcome.all_ok && !failure.is_object()) {
    end.state = JobState::succeeded;
  } else {
    end.reason = outcome.error ? *outcome.error : describe_exit(failure, gpu_failure_notes(rec, failure));
    retryable = !outcome.final;  // the executor's word: another attempt would fare the same
  }

  m_gpu_processes.forget(rec.id);
  if (rec.run.started_at > 0 && end.at >= rec.run.started_at) m_metrics.run_time.observe(end.at - rec.run.started_at);
  // Fair share remembers its GPU time, once the end is stored (`rec` is gone by then).
  const uid_t owner = rec.uid;
  const double gpu_s = rec.run.started_at > 0 ? static_cast<double>(rec.run.gpus.size()) *
                                                    std::max(0.0, end.at - rec.run.started_at)
                                              : 0;
  const int run = rec.attempt - rec.attempt_base;  // attempts since the job was submitted or restarted
  if (retryable && run <= rec.spec.retries && rec.spec_error.empty()) {  // lifecycle refuses it a retry
    double delay = std::min(m_config.retry_backoff_max_s, m_config.retry_backoff_s * std::pow(2.0, run - 1));
    end.reason = "attempt " + std::to_string(rec.attempt) + " failed (" + end.reason + "); retry " +
                 std::to_string(run) + "/" + std::to_string(rec.spec.retries) + " in " +
                 std::to_string(static_cast<int>(std::ceil(delay))) + " s";
    // Record the failed attempt's end, then the requeue, as two transitions of one transaction.
    JobRecord failed = next_record(rec, end);
    JobRecord queued = next_record(failed, event::Retried{now + delay, end.reason});
    ++m_metrics.retries;
    commit({std::move(failed), std::move(queued)});
    if (gpu_s > 0) m_users.add_use(owner, gpu_s, now);
    withdraw_orphans();
    m_pacer.soon();
    return;
  }
  const bool succeeded = end.state == JobState::succeeded;
  commit({next_record(rec, end)});  // `a` is gone: the job has ended
  if (gpu_s > 0) m_users.add_use(owner, gpu_s, now);
  if (!succeeded) withdraw_orphans();
  m_pacer.soon();
}

void Daemon::commit(std::vector<JobRecord> changed, const std::vector<std::string>& why, std::vector<JobRecord> also) {
  if (changed.empty() && also.empty()) return;
  for (std::size_t i = 0; i < changed.size(); ++i) {
    // A job's last record here that ends it (not the failed attempt a retry follows) makes its
    // on_finish hooks due, in the same transaction (update_many stores them).
    JobRecord& r = changed[i];
    r.hook_due = is_terminal(r.state) && (i + 1 == changed.size() || changed[i + 1].id != r.id) &&
                 m_jobs.contains(r.id) && !is_terminal(m_jobs.at(r.id).rec.state) && m_hooks.any_for(r.spec);
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
  for (const auto& r : changed)
    if (r.hook_due) {
      m_hooks.due(r.id);
      hooks = true;
    }
  if (hooks) asio::post(m_io, [this] { m_hooks.run(); });
  for (std::size_t i = 0; i < changed.size(); ++i)
    if (i + 1 == changed.size() || changed[i + 1].id != changed[i].id) apply(std::move(changed[i]));
}

void Daemon::apply(JobRecord rec) {
  const std::int64_t id = rec.id;
  const auto applied = m_jobs.apply(std::move(rec), [this](Active& a, std::optional<JobState> was, const JobRecord& now) {
    count_transition(a, was, now);
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
  if (is_terminal(now.state) && was && !is_terminal(*was)) ++m_metrics.finished[std::string(gpuq::to_string(now.state))];
}

}  // namespace gpuq::daemon
