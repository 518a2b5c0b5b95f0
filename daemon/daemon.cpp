// gpuqd's core (see daemon.hpp): construction, recovery at start, request dispatch and `wait`. The
// handlers live in files by group: queries.cpp (hello, status, show, why, events, results, usage,
// gpus: functions of reads.hpp's Reads), control.cpp (cancel, hold, release, update, drain,
// undrain: functions of control.hpp's Changes), submit.cpp; restart and clean are their owners'
// (restarter.hpp, cleaner.hpp).
// running.cpp schedules the jobs (attempts.cpp launches them and records their ends); metrics.cpp
// answers Prometheus.
#include "daemon/daemon.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "common/paths.hpp"
#include "common/spec.hpp"
#include "common/users.hpp"
#include "daemon/cpu_topology.hpp"
#include "daemon/dependencies.hpp"
#include "daemon/lifecycle.hpp"

namespace gpuq::daemon {

namespace {
// The cgroup each local attempt runs in, where this host lets gpuqd make one; said at start.
std::optional<Cgroups> attempt_cgroups(const Config& config) {
  auto cgroups = config.cgroups ? *config.cgroups : Cgroups::open(config.state_dir, config.cgroup_parent);
  if (!cgroups) {
    std::cerr << "gpuqd: attempts get no cgroup of their own (" << cgroups.error().message
              << "); a job's processes are tracked by its supervisor's process tree\n";
    return std::nullopt;
  }
  std::cerr << "gpuqd: each attempt runs in a cgroup of its own, under " << cgroups->describe() << "; "
            << cgroups->describe_limits() << "\n";
  return std::move(*cgroups);
}
}  // namespace

Daemon::Daemon(asio::io_context& io, Config config, std::unique_ptr<Store> store, Inventory inventory)
    : m_io(io),
      m_config(std::move(config)),
      m_store(std::move(store)),
      m_machine(
          io, std::move(inventory), sysfs_slot_cores(m_config.sysfs_root, usable_cores()), *m_store,
          {m_config.health_interval_s, m_config.gpu_process_interval_s},
          [this] {
            std::vector<GpuProcesses::Running> out;
            for (std::int64_t id : m_jobs.running_ids())
              out.push_back({id, m_executor->supervisor_pid(id), m_jobs.at(id).rec.run.gpus});
            return out;
          },
          [this] { m_pacer.soon(); }),
      m_users({m_config.multi_user, m_config.user_limits, m_config.usage_half_life_s, m_config.max_priority,
               m_config.admin_gid, m_config.admin_group}),
      m_hooks(io,
              {m_config.on_finish, m_config.on_preempt, m_config.max_hooks, m_config.hook_timeout_s, m_config.grace_s,
               m_config.multi_user, m_config.state_dir, m_config.admin_gid, m_config.shim_path},
              *m_store, m_users,
              [this](std::int64_t id) { return json(queries::show(reads(), Caller::self(), common::IdRequest{id})); }),
      m_waiters(io, [this](const Caller& caller, const std::set<std::int64_t>& ids,
                           bool timed_out) { return queries::wait_answer(reads(), caller, ids, timed_out); }),
      m_watches(
          io,
          [this](const Caller& caller, const std::vector<std::int64_t>& ids, common::WatchReply& out) {
            return queries::watch_answer(reads(), caller, ids, out);
          },
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count()),
      m_pacer(
          io, [this] { schedule_now(); }, k_write_retry_s),
      m_executor(m_config.make_executor ? m_config.make_executor(io, [this](std::int64_t id) { m_attempts.ended(id); })
                 : m_config.executor == "slurm"
                     ? make_slurm_executor(io,
                                           {m_config.slurm, m_config.shim_path, m_config.state_dir, m_config.grace_s,
                                            m_config.slurm_poll_s},
                                           [this](std::int64_t id) { m_attempts.ended(id); })
                     : make_local_executor(
                           io, m_config.shim_path, [this](std::int64_t id) { m_attempts.ended(id); },
                           attempt_cgroups(m_config), LocalBounds{m_config.grace_s})),
      m_events(io, m_config, *m_store, m_jobs, *m_executor, m_machine.inventory,
               {[this](std::vector<JobRecord> changed, const WriteRows& write) { land(std::move(changed), write); }}),
      m_attempts(io, m_config, *m_store, m_jobs, m_users, m_machine, *m_executor, m_events, m_metrics,
                 {commit_fn(), [this] { withdraw_orphans(); }, [this] { m_pacer.soon(); }}),
      m_ops(io, m_config, *m_store, m_jobs, m_users, m_waiters,
            {[this] { return reads(); },
             [this](std::vector<JobRecord> changed, const WriteRows& write) { land(std::move(changed), write); },
             [this] { m_pacer.soon(); }, [this](Submissions::Batch& b) { return accept_submission(b); },
             [this](Submissions::Batch& b) { submission_written(b); }}) {
  if (m_config.cpu_slots <= 0) m_config.cpu_slots = static_cast<int>(m_machine.cores.cores.size());
  m_executor->on_handed([this](std::int64_t) {
    if (m_jobs.any_with_deps()) m_pacer.soon();  // a job may wait for this one to be handed over
  });
  m_executor->on_released([this](std::int64_t id) { m_attempts.released(id); });
  m_machine.gpu_processes.after_each_look([this] { m_attempts.hold_budgets(wall_now()); });
  for (const auto& [batch, limit] : m_store->batch_limits()) m_jobs.set_batch_limit(batch, limit);
}

Daemon::~Daemon() = default;

Reads Daemon::reads() {
  return {m_config,       *m_store,  m_jobs,      m_users,           m_last_pass,
          m_machine.health, m_machine.gpu_processes, m_events, *m_executor, m_machine.inventory,
          m_machine.cores};
}

Changes Daemon::changes() {
  return {reads(),
          m_jobs,
          *m_store,
          m_users,
          m_machine.health,
          *m_executor,
          commit_fn(),
          [this](std::vector<JobRecord> changed, const WriteRows& write) { land(std::move(changed), write); },
          [this] { m_pacer.soon(); },
          [this](const std::vector<std::int64_t>& ids, const std::vector<std::string>& by) {
            m_attempts.preempt(ids, by, wall_now());
          }};
}

// ---- recovery -----------------------------------------------------------------------------------

// A running job's slots map to the cores it was pinned to only under the affinity mask of the
// gpuqd that launched it. Under another mask (say a restart under a new taskset or systemd
// CPUAffinity) it holds instead the slots of its real cores in this mapping, and none for cores
// outside this gpuqd's mask, so no other job is pinned onto them.
std::optional<JobRecord> Daemon::rederive_slots(const JobRecord& was) const {
  if (was.run.cores.empty() || job_cores(was, m_machine.cores.cores) == was.run.cores) return std::nullopt;
  JobRecord rec = was;
  rec.run.cpu_slots = slots_on_cores(rec.run.cores, m_machine.cores.cores, m_config.cpu_slots);
  std::cerr << "gpuqd: job " << rec.id << " runs on cores " << common::format_cpu_list(rec.run.cores)
            << ", launched under another CPU mask; it holds CPU slots " << json(rec.run.cpu_slots).dump()
            << " of this gpuqd's pool (cores " << common::format_cpu_list(m_machine.cores.cores) << ")\n";
  return rec;
}

void Daemon::recover() {
  m_metrics.started_at = wall_now();
  m_ops.trash.empty_leftover();
  // Hooks due from before (a job that ended, its hooks not yet started); those started and cut
  // off by a crash run on by themselves.
  m_store->forget_started_hooks();
  for (const DueHook& h : m_store->due_hooks())
    m_hooks.due(h);
  for (auto& rec : m_store->load_active()) {
    const std::int64_t id = rec.id;
    const double queued_since = rec.attempt == 0 ? rec.submitted_at : m_metrics.started_at;  // a retry's wait: from now on
    Active& a = m_jobs.load(std::move(rec), queued_since);
    if (!a.rec.spec_error.empty()) {
      // A spec this gpuqd cannot read (written by a later gpuq, or damaged): a queued job fails
      // now, not launched with an empty command; a running one is adopted and ends as it ends,
      // with no retry (lifecycle.cpp). Its stored spec stays as it is.
      std::cerr << "gpuqd: " << job_label(a.rec) << "'s stored spec does not parse: " << a.rec.spec_error << "\n";
      if (a.rec.state == JobState::queued) {
        commit({next_record(a.rec, event::Unrunnable{unrunnable_reason(a.rec), wall_now()})});
        continue;
      }
    }
    if (a.rec.state != JobState::running) continue;
    if (auto moved = rederive_slots(a.rec))  // not a change of state: no transition
      land({std::move(*moved)}, [&](const std::vector<const JobRecord*>& rows) { m_store->update(*rows.front(), false); });
    for (int r = 0; r < a.rec.spec.ranks; ++r) a.event_offsets[r] = m_store->event_offset(id, a.rec.attempt, r);
    if (!a.rec.spec.report.empty())
      a.event_offsets[report_offset_key(a.rec.spec.report.rank)] =
          m_store->event_offset(id, a.rec.attempt, report_offset_key(a.rec.spec.report.rank));
    switch (m_executor->adopt(m_attempts.attempt_of(a.rec))) {
      case Executor::Found::alive:
        // A cancel, requeue or preemption asked before the last gpuqd died may never have reached the job (it
        // died between storing the intent and the stop): asked again, with its deadline.
        if (a.rec.run.cancel_requested || a.rec.run.requeue_requested) m_executor->stop(id);
        else if (a.rec.run.preempt_requested)
          m_executor->preempt(id, m_attempts.preempt_grace_s(a.rec.spec));
        else if (a.rec.run.suspended_for != 0)  // frozen still, for a job that may run yet: the first pass sees
          m_attempts.keep_suspended(id, wall_now());
        break;
      case Executor::Found::ended:  // while no gpuqd ran: recorded now
        asio::post(m_io, [this, id] { m_attempts.ended(id); });
        break;
      case Executor::Found::never_started: {
        // Marked running, but gpuqd stopped before handing it over: it starts again, as the next
        // attempt where the executor withdrew this one's number (the local one does).
        commit({next_record(a.rec, back_in_line(a.rec, "requeued: gpuqd stopped before the job started", wall_now(),
                                                m_executor->withdraws_numbers()))});
        break;
      }
    }
  }
  m_attempts.resume_holds(m_executor->adopt_lingering());  // GPUs kept from jobs by processes left behind
  withdraw_orphans();  // a dependency that ended while no gpuqd ran
  if (m_config.multi_user) {  // fair share's memory: the GPU time of attempts that ended lately
    const double now = wall_now();
    for (const auto& [uid, gpu_s, at] : m_store->gpu_time_since(now - 10 * m_config.usage_half_life_s))
      m_users.add_use(uid, gpu_s, at);
  }
  m_ops.restarter.resume();
  m_events.arm();
  m_machine.start(m_executor->places_work());
  m_hooks.run();
  m_ops.cleaner.forget_old_jobs();
  m_pacer.soon();
}

// ---- dispatch -----------------------------------------------------------------------------------

const std::vector<Daemon::Command>& Daemon::commands() {
  namespace cmd = common::cmd;
  static const std::vector<Command> k_commands{
      now<cmd::hello, &queries::hello>(),
      later<cmd::submit, &Daemon::cmd_submit>(),
      now<cmd::status, &queries::status>(),
      now<cmd::show, &queries::show>(),
      now<cmd::cancel, &control::cancel>(),
      now<cmd::requeue, &control::requeue>(),
      now<cmd::preempt, &control::preempt>(),
      later<cmd::restart, [](Daemon& d, const Caller& c, const common::RestartRequest& q,
                             Later<common::RestartReply>& r) { d.m_ops.restarter.start(c, q, r); }>(),
      now<cmd::hold, [](const Changes& c, const Caller& who,
                        const common::SelectRequest& q) { return control::set_held(c, who, q, true); }>(),
      now<cmd::release, [](const Changes& c, const Caller& who,
                           const common::SelectRequest& q) { return control::set_held(c, who, q, false); }>(),
      now<cmd::update, &control::update>(),
      later<cmd::clean, [](Daemon& d, const Caller& c, const common::CleanRequest& q,
                           Later<common::CleanReply>& r) { d.m_ops.cleaner.start(c, q, r); }>(),
      later<cmd::wait, &Daemon::cmd_wait>(),
      now<cmd::results, &queries::results>(),
      now<cmd::events, &queries::events>(),
      later<cmd::watch, &Daemon::cmd_watch>(),
      now<cmd::gpus,
          [](Daemon& d, const Caller& c, const common::NoFields& q) {
            auto out = queries::gpus(d.reads(), c, q);
            if (c.admin) {  // how often others' watches are answered would tell of their jobs' progress
              out.watches_held = d.m_watches.held();
              out.waits_held = d.m_waiters.size();
              out.watch_answers = d.m_watches.answers();
              out.replies_unread_bytes = d.m_outbox->unsent();
              out.connections_dropped = d.m_outbox->dropped();
              out.connections_open = d.m_outbox->connections();
            }
            return out;
          }>(),
      now<cmd::drain, [](const Changes& c, const Caller& who,
                         const common::DrainRequest& q) { return control::set_drained(c, who, q, true); }>(),
      now<cmd::undrain, [](const Changes& c, const Caller& who,
                           const common::DrainRequest& q) { return control::set_drained(c, who, q, false); }>(),
      now<cmd::why, &queries::why>(),
      now<cmd::usage, &queries::usage>(),
      now<cmd::shutdown, &Daemon::cmd_shutdown>(),
  };
  return k_commands;
}

namespace {
// A refusal, through `reply`; where a later handler had taken its Later already (and so will
// answer through it), only said on stderr: one request, one reply.
void answer_error(Reply& reply, std::string_view command, json error) {
  if (reply) return reply(std::move(error));
  std::cerr << "gpuqd: " << command
            << " failed after it was taken in hand: " << error["error"].value("message", std::string()) << "\n";
}
}  // namespace

void Daemon::dispatch(const Caller& caller, const json& request, Reply reply_to) {
  const auto cmd = request.is_object() ? request.find("cmd") : request.end();
  const auto& table = commands();
  auto row = cmd != request.end() && cmd->is_string()
                 ? std::find_if(table.begin(), table.end(), [&](const Command& c) { return c.name == cmd->get_ref<const std::string&>(); })
                 : table.end();
  // Counted by command: a known one's name or "unknown", so that no client can make new series.
  const std::string_view counted = row != table.end() ? row->name : "unknown";
  ++m_metrics.requests[std::string(counted)];
  Reply reply = [this, counted, reply_to = std::move(reply_to)](json r) {
    if (r.is_object() && r.value("ok", true) == false)
      if (auto e = r.find("error"); e != r.end() && e->is_object() && e->contains("code") && (*e)["code"].is_string())
        ++m_metrics.request_errors[{std::string(counted), (*e)["code"].get<std::string>()}];
    reply_to(std::move(r));
  };
  try {
    if (!request.is_object() || cmd == request.end() || !cmd->is_string())
      throw RequestError(ErrorCode::bad_request, "a request is a JSON object with a string field `cmd`");
    if (row == table.end()) {
      const auto& name = cmd->get_ref<const std::string&>();
      std::string known;
      for (const auto& c : table) known += (known.empty() ? "" : ", ") + std::string(c.name);
      throw RequestError(ErrorCode::unknown_command, "unknown command `" + name.substr(0, 64) + "`; known: " + known);
    }
    (this->*(row->run))(caller, request, reply);
  } catch (const std::exception& e) {
    answer_error(reply, counted, common::error_reply(error_of(e)));
  }
}

common::NoFields Daemon::cmd_shutdown(const Caller& caller) {
  reads().authorize_admin(caller, "stop gpuqd");
  if (on_shutdown) asio::post(m_io, on_shutdown);  // after the reply
  return {};
}

// ---- wait ---------------------------------------------------------------------------------------

void Daemon::cmd_wait(const Caller& caller, const common::IdsRequest& q, Later<common::JobsReply>& reply) {
  const Reads known = reads();
  for (auto id : q.ids) known.require_job(id);  // all known, or no wait
  m_waiters.add(caller, std::set<std::int64_t>(q.ids.begin(), q.ids.end()), std::move(reply), q.timeout_s);
  m_jobs.need_changed();
  notify_waiters();
}

void Daemon::cmd_watch(const Caller& caller, const common::WatchRequest& q, Later<common::WatchReply>& reply) {
  const Reads known = reads();
  for (auto id : q.ids)
    known.require_job(id);  // all known, or no watch
  if (q.batch != 0 && m_store->batch_page(q.batch, 0, 1).empty()) throw known.missing_batch(q.batch);
  m_watches.add(caller, q, std::move(reply));
}

Commit Daemon::commit_fn() {
  return [this](std::vector<JobRecord> changed, const std::vector<std::string>& why, std::vector<JobRecord> also) {
    commit(std::move(changed), why, std::move(also));
  };
}

void Daemon::withdraw_orphans() { dependencies::withdraw_orphans(reads(), *m_executor); }

void Daemon::notify_waiters() {
  m_waiters.notify([this](std::int64_t id) { return m_jobs.contains(id); });
}

}  // namespace gpuq::daemon
