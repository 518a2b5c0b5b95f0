// Hooks (hooks.hpp). Each runs under a gpuq-shim of its own, as the job's owner, in
// jobs/<id>/on-finish-<restarts>-<k>/ (on-preempt-<preemptions>-<k>/: launch.json, rank-0.log,
// exit.json), with the job as `gpuq show --json` gives it on stdin and GPUQ_HOOK, GPUQ_JOB_ID,
// GPUQ_JOB_STATE, GPUQ_JOB_NAME (and GPUQ_PREEMPTED_BY) in its environment.
// Its time is bounded by hook_timeout_s, its log by 64 KiB (rotated once), and at most max_hooks
// run at once, so a thousand jobs ending together queue their hooks instead of a thousand
// processes. A hook's end is watched through a pidfd on gpuqd's thread: nothing here waits. Due
// hooks are in the store in the transaction that ends the job, marked started before they start: a
// job that ended while gpuqd was down has its hooks run at the next start, and none runs twice.
#include "daemon/hooks.hpp"

#include "daemon/executor.hpp"
#include "daemon/launcher.hpp"
#include "daemon/readiness.hpp"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <memory>

#include "common/paths.hpp"

namespace gpuq::daemon {

namespace asio = boost::asio;
using json = nlohmann::json;

namespace {
constexpr std::int64_t k_hook_log_bytes = 64 << 10;
int pidfd_open(int pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
const char* hook_key(HookEvent e) {
  return e == HookEvent::preempt ? "on_preempt" : "on_finish";
}
}  // namespace

Hooks::Hooks(asio::io_context& io, Setup setup, Store& store, Users& users, Describe describe, Spawn spawn)
    : m_io(io),
      m_setup(std::move(setup)),
      m_store(store),
      m_users(users),
      m_describe(std::move(describe)),
      m_spawn(spawn ? std::move(spawn) : [shim = m_setup.shim_path](const std::string& dir) { return spawn_supervisor(shim, dir); }) {}

void Hooks::run() {
  // Each job in line once round at most: one whose earlier hooks still run (it ended again after a
  // restart) keeps its place for a later round.
  for (std::size_t n = m_due.size(); n > 0 && m_processes < m_setup.max_hooks; --n) {
    const DueHook h = m_due.front();
    m_due.pop_front();
    if (m_jobs.count(h)) {
      m_due.push_back(h);
      continue;
    }
    m_waiting.erase(h);
    try {
      start(h);
    } catch (const std::exception& e) {
      std::cerr << "gpuqd: job " << h.id << ": cannot run its " << hook_key(h.event) << " hooks: " << e.what() << "\n";
    }
  }
}

void Hooks::start(const DueHook& due) {
  const std::int64_t id = due.id;
  const bool preempt = due.event == HookEvent::preempt;
  const auto found = m_store.get(id);
  // Forgotten meanwhile, or restarted after its end: nothing to say. (A preempted job may have
  // started again or ended since: its preemption happened all the same.)
  if (!found || (!preempt && !is_terminal(found->state))) {
    m_store.hooks_started(due);
    m_store.hooks_done(due);
    return;
  }
  const JobRecord& rec = *found;
  std::vector<std::vector<std::string>> hooks;
  const auto& every_job = preempt ? m_setup.on_preempt : m_setup.on_finish;  // the configuration's first
  const auto& its_own = preempt ? rec.spec.on_preempt : rec.spec.on_finish;
  for (const auto* h : {&every_job, &its_own})
    if (!h->empty()) hooks.push_back(*h);
  m_store.hooks_started(due);  // from here on, never again: a crash leaves them to run on their own
  if (hooks.empty()) return m_store.hooks_done(due);

  const bool as_owner = m_setup.multi_user && rec.uid != ::geteuid();
  const common::Account* owner = as_owner ? m_users.account(rec.uid) : nullptr;
  const json input = m_describe(id);
  Env env;
  const json batch_env = m_store.batch_env(rec.batch);
  for (const auto& [k, v] : batch_env.items())
    if (v.is_string()) env[k] = v.get<std::string>();
  for (const auto& [k, v] : rec.spec.env) env[k] = v;
  env["GPUQ_HOOK"] = preempt ? "preempt" : "finish";
  if (preempt) env["GPUQ_PREEMPTED_BY"] = due.by;
  env["GPUQ_JOB_ID"] = std::to_string(id);
  env["GPUQ_JOB_STATE"] = std::string(to_string(rec.state));
  env["GPUQ_JOB_NAME"] = rec.spec.name;
  env["GPUQ_JOB_DIR"] = job_dir(m_setup.state_dir, id);
  if (owner) {
    env["HOME"] = owner->home;
    env["USER"] = env["LOGNAME"] = owner->name;
    env["SHELL"] = owner->shell;
  }
  int started = 0;
  for (std::size_t k = 0; k < hooks.size(); ++k) {
    const std::string name = preempt ? "on-preempt-" + std::to_string(rec.preemptions) + "-" + std::to_string(k)
                                     : "on-finish-" + std::to_string(rec.restarts) + "-" + std::to_string(k);
    const std::string dir = job_dir(m_setup.state_dir, id) + "/" + name;
    auto made = !as_owner ? common::ensure_private_dir(dir)
                : owner   ? make_owned_subdir(m_setup.state_dir, id, name, owner->uid, m_setup.admin_gid, owner->gid)
                          : Result<bool>(Error{ErrorCode::not_found, "its owner, uid " + std::to_string(rec.uid) +
                                                                         ", has no account in the user database"});
    // Readable by the hook, which runs as the job's owner; the directory keeps everyone else out.
    if (made)
      made = write_file_atomic(dir + "/input.json", input.dump(-1, ' ', false, json::error_handler_t::replace), 0644);
    json doc = {{"job_id", id},
                {"attempt", rec.attempt},
                {"timeout_s", m_setup.timeout_s},
                {"grace_s", std::min(m_setup.grace_s, 5.0)},
                {"log_limit_bytes", k_hook_log_bytes},
                {"ranks", json::array({{{"rank", 0},
                                        {"argv", hooks[k]},
                                        {"env", env},
                                        {"cwd", rec.spec.cwd},
                                        {"stdin", dir + "/input.json"},
                                        {"log", dir + "/rank-0.log"}}})},
                {"pid_file", dir + "/shim.pid"},
                {"exit_file", dir + "/exit.json"}};
    if (owner) doc["run_as"] = {{"uid", owner->uid}, {"gid", owner->gid}, {"groups", owner->groups}, {"user", owner->name}};
    if (made) made = write_file_atomic(dir + "/launch.json", doc.dump());
    Result<int> pid = made ? m_spawn(dir) : Result<int>(made.error());
    if (!pid) {
      std::cerr << "gpuqd: job " << id << ": cannot run its " << hook_key(due.event) << " hook " << name << ": "
                << pid.error().message << "\n";
      continue;
    }
    const int fd = pidfd_open(*pid);
    if (fd < 0) {  // no pidfds (Linux < 5.3): not watched, reaped by nobody until gpuqd ends
      std::cerr << "gpuqd: job " << id << ": its " << hook_key(due.event) << " hook " << name
                << " runs unwatched (no pidfd)\n";
      continue;
    }
    ++started;
    ++m_processes;
    auto watch = std::make_shared<asio::posix::stream_descriptor>(m_io, fd);
    // Its supervisor ends it at hook_timeout_s, SIGKILL after the grace period; one that has not
    // k_overdue_s after that is stopped (in single-user mode a hook runs as its supervisor's user,
    // and may SIGSTOP it) and is killed here, through the pidfd (its hook dies with it).
    const double overdue_s = m_setup.timeout_s + doc["grace_s"].get<double>() + k_overdue_s;
    auto overdue = std::make_shared<asio::steady_timer>(
        m_io, std::chrono::milliseconds(static_cast<std::int64_t>(overdue_s * 1000)));
    overdue->async_wait([watch, id, overdue_s, key = hook_key(due.event)](const boost::system::error_code& ec) {
      if (ec) return;
      std::cerr << "gpuqd: job " << id << ": its " << key << " hook's supervisor has not ended it " << overdue_s
                << " s after it started (is it stopped?); killing it\n";
      ::syscall(SYS_pidfd_send_signal, watch->native_handle(), SIGKILL, nullptr, 0);
    });
    when_readable(*watch,
                  [this, watch, overdue, due, dir, pid = *pid, uid = rec.uid](const boost::system::error_code&) {
                    overdue->cancel();
                    ended(due, dir, pid, uid);
                  });
  }
  if (started)
    m_jobs[due] = started;
  else
    m_store.hooks_done(due);
}

void Hooks::ended(const DueHook& due, const std::string& dir, int pid, uid_t owner) {
  const std::int64_t id = due.id;
  ::waitpid(pid, nullptr, WNOHANG);  // our child: reap it
  --m_processes;
  const json out = read_exit_record(dir + "/exit.json", 64 << 10, owner);
  std::string how = "ended";
  if (out.value("timed_out", false)) {
    how = "was killed after hook_timeout_s (" + std::to_string(static_cast<long long>(m_setup.timeout_s)) + " s)";
  } else if (const auto f = out.find("first_failure"); f != out.end() && f->is_object()) {
    how = f->contains("signal") ? "was killed by signal " + (*f)["signal"].dump()
                                : "exited with code " + f->value("exit_code", json(-1)).dump();
  } else if (out.contains("error")) {
    how = "failed: " + out.value("error", std::string());
  }
  if (how != "ended")
    std::cerr << "gpuqd: job " << id << ": " << hook_key(due.event) << " hook " << how << " (log " << dir
              << "/rank-0.log)\n";
  if (auto it = m_jobs.find(due); it != m_jobs.end() && --it->second == 0) {
    m_jobs.erase(it);
    try {
      m_store.hooks_done(due);
    } catch (const std::exception& e) {  // still marked started: it will not run again
      std::cerr << "gpuqd: job " << id << ": " << e.what() << "\n";
    }
  }
  run();
}

}  // namespace gpuq::daemon
