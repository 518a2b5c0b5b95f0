// The local executor (executor.hpp): each attempt under gpuq-shim, a process in a session of its
// own that outlives gpuqd and is the parent of the job's ranks (supervisor/supervisor.hpp), forked
// by gpuq-shim --serve (launcher.hpp's SupervisorServer) or, where that cannot, exec'd. gpuqd
// watches the shim, not the ranks: through a pidfd, readable once it exits (polling its liveness
// every 200 ms on kernels without pidfd_open). It finds a shim again after a restart by the pid
// file the shim writes in the attempt directory, with the process's start time, so a recycled pid
// is not taken for it.
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <algorithm>
#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "common/failure_class.hpp"
#include "common/json_input.hpp"
#include "common/paths.hpp"
#include "daemon/cgroups.hpp"
#include "daemon/executor.hpp"
#include "daemon/launcher.hpp"
#include "daemon/readiness.hpp"

namespace gpuq::daemon {

namespace asio = boost::asio;
using json = nlohmann::json;

Outcome Outcome::from_record(const json& record) {
  Outcome o;
  if (!record.is_object()) return failed("the job's supervisor ended without recording an outcome");
  const auto flag = [&](const char* key) {
    const auto it = record.find(key);
    return it != record.end() && it->is_boolean() && it->get<bool>();
  };
  const auto number = [&](const char* key) -> std::optional<double> {
    const auto it = record.find(key);
    return it != record.end() && it->is_number() ? std::optional<double>(it->get<double>()) : std::nullopt;
  };
  if (const auto ranks = record.find("ranks"); ranks != record.end() && ranks->is_array() && !ranks->empty()) {
    o.all_ok = true;
    for (const auto& r : *ranks) o.all_ok = o.all_ok && r.is_object() && r.value("exit_code", json()) == json(0);
  }
  if (const auto f = record.find("first_failure"); f != record.end() && f->is_object()) {
    o.first_failure = *f;
    if (auto it = f->find("exit_code"); it != f->end() && it->is_number_integer()) o.exit_code = it->get<int>();
    if (auto it = f->find("signal"); it != f->end() && it->is_number_integer()) o.exit_signal = it->get<int>();
  } else if (o.all_ok) {
    o.exit_code = 0;
  }
  o.cancelled = flag("cancelled");
  o.timed_out = flag("timed_out");
  o.withdrawn = flag("withdrawn");
  o.final = flag("final");
  if (const auto e = record.find("error"); e != record.end() && e->is_string()) o.error = e->get<std::string>();
  if (const auto x = record.find("external_id"); x != record.end() && x->is_string())
    o.external_id = x->get<std::string>();
  o.ended_at = number("ended_at");
  return o;
}

Outcome Outcome::failed(std::string why) {
  Outcome o;
  o.error = std::move(why);
  return o;
}

json read_exit_record(const std::string& path, std::size_t max_bytes, std::optional<uid_t> owner) {
  auto raw = common::read_untrusted_file(path, max_bytes, "exit record", owner);
  if (!raw || !raw->is_object()) return json{{"error", "the job's supervisor ended without recording an outcome"}};
  const auto is_int = [](const json& v) { return v.is_number_integer(); };
  const auto is_num = [](const json& v) { return v.is_number(); };
  const auto is_bool = [](const json& v) { return v.is_boolean(); };
  const auto keep = [&](const json& from, json& to, const char* key, auto type_ok) {
    if (auto it = from.find(key); it != from.end() && type_ok(*it)) to[key] = *it;
  };
  json out = json::object();
  keep(*raw, out, "started_at", is_num);
  keep(*raw, out, "ended_at", is_num);
  keep(*raw, out, "cancelled", is_bool);
  keep(*raw, out, "timed_out", is_bool);
  keep(*raw, out, "preempted", is_bool);  // its supervisor took a preemption (the Slurm executor asks)
  if (auto it = raw->find("error"); it != raw->end() && it->is_string()) out["error"] = it->get<std::string>().substr(0, 1000);
  if (auto it = raw->find("ranks"); it != raw->end() && it->is_array()) {
    out["ranks"] = json::array();
    for (const auto& r : *it) {
      json rank = json::object();
      if (r.is_object()) keep(r, rank, "exit_code", is_int);
      out["ranks"].push_back(std::move(rank));
    }
  }
  if (auto it = raw->find("first_failure"); it != raw->end() && it->is_object()) {
    json f = json::object();
    keep(*it, f, "rank", is_int);
    keep(*it, f, "exit_code", is_int);
    keep(*it, f, "signal", is_int);
    keep(*it, f, "oom_kill", is_bool);
    keep(*it, f, "at", is_num);
    // What the failing rank said last, and the line that named its failure's class: the job's
    // own words, so bounded and kept printable here too. (Valid UTF-8, as the JSON parser took
    // it; cut only between characters.)
    auto words = [&](const char* key) {
      if (auto m = it->find(key); m != it->end() && m->is_string()) {
        std::string text;
        for (unsigned char c : m->get_ref<const std::string&>())
          if (c >= 0x20 && c != 0x7f) text += static_cast<char>(c);
        if (text.size() > 600) {
          std::size_t cut = 600;
          while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
          text.resize(cut);
        }
        if (!text.empty()) f[key] = std::move(text);
      }
    };
    words("message");
    if (auto c = it->find("class"); c != it->end() && c->is_string() && common::is_failure_class(c->get<std::string>())) {
      f["class"] = *c;
      words("class_line");
    }
    out["first_failure"] = std::move(f);
  }
  return out;
}

namespace {

int pidfd_open(int pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

class LocalExecutor final : public Executor {
 public:
  LocalExecutor(asio::io_context& io, std::string shim_path, Ended ended, std::optional<Cgroups> cgroups,
                LocalBounds bounds)
      : m_io(io),
        m_shim_path(std::move(shim_path)),
        m_ended(std::move(ended)),
        m_cgroups(std::move(cgroups)),
        m_grace_s(bounds.grace_s),
        m_unkillable_s(bounds.unkillable_s) {}
  ~LocalExecutor() override {
    // Stays while attempts' cgroups are in it (jobs outlive gpuqd).
    if (m_cgroups) m_cgroups->remove_base(m_shims.empty() && m_lingering.empty());
  }

  Result<bool> start(const Attempt& attempt) override {
    std::vector<AttemptCgroup> cgroups;  // the attempt's in each hierarchy, the tracking one first
    if (m_cgroups) {
      auto made = m_cgroups->make(cgroup_name(attempt), attempt.limits);
      if (!made) return made.error();
      cgroups = std::move(*made);
    }
    // Forked by the server; exec'd by gpuqd where the server cannot start it.
    auto forked = m_server.start(attempt.dir, cgroups);
    Result<int> pid = forked ? Result<int>(forked->pid.pid) : Result<int>(0);
    if (!forked) {
      if (!m_said_exec) std::cerr << "gpuqd: " << forked.error().message << "; starting supervisors one exec each\n";
      m_said_exec = true;
      pid = spawn_supervisor(m_shim_path, attempt.dir, cgroups);
    }
    if (!pid) {
      if (m_cgroups) m_cgroups->remove(cgroups.front().dir);
      return pid.error();
    }
    Shim& s = track(attempt.id);
    s.pid = forked ? forked->pid : ProcessId{*pid, process_start_time(*pid).value_or(0)};
    s.own_child = !forked;
    if (!cgroups.empty()) s.cgroup = cgroups.front().dir;
    s.handles_preempt = true;  // this gpuqd's launch document has its `preempt`
    watch(attempt.id, s, forked ? forked->pidfd : -1);
    enforce_timeout(attempt, s);
    return true;
  }

  Found adopt(const Attempt& attempt) override {
    // A live supervisor first: an exit record may also be a file the running job wrote itself.
    // The pid file is in the job's directory, and its owner could point it at any process: only
    // this attempt's supervisor, running as gpuqd does, is taken for it (and signalled on cancel).
    const std::string pid_file = attempt.dir + "/shim.pid";
    auto pid = read_pid_file(pid_file, attempt.owner);
    // None there: its supervisor may have its go-ahead and be about to claim the attempt (the
    // last gpuqd died in between). This gpuqd claims it first, for nobody: a supervisor that
    // comes later starts nothing (supervisor.cpp), and the attempt runs again under the next
    // number, in a directory of its own. Beaten to it, the supervisor's file is read again.
    if (!pid && !common::path_exists(pid_file)) {
      const json withdrawn = {{"withdrawn_by", ::getpid()}, {"at", common::wall_now()}};
      const auto made = common::create_file_once(pid_file, withdrawn.dump());
      if (!made)
        std::cerr << "gpuqd: job " << attempt.id << ": " << made.error().message << "\n";
      else if (!*made)
        pid = read_pid_file(pid_file, attempt.owner);
    }
    const std::string cgroup = m_cgroups ? m_cgroups->path(cgroup_name(attempt)) : std::string();
    if (pid && is_alive(*pid) && common::process_owner(pid->pid) == ::geteuid() && supervises(pid->pid, attempt)) {
      Shim& s = track(attempt.id);
      s.pid = *pid;
      s.cgroup = cgroup;
      s.handles_preempt = launched_with_preempt(attempt.dir);
      std::cerr << "gpuqd: re-adopted job " << attempt.id << " (supervisor pid " << pid->pid << ")\n";
      watch(attempt.id, s);
      enforce_timeout(attempt, s);
      return Found::alive;
    }
    // Its supervisor is gone while processes of it live on (it was killed while no gpuqd ran):
    // they are killed, and the attempt ends once none is left, as if its supervisor had just gone.
    // Without a pid file its supervisor never started a rank (it announces itself first), unless
    // the job removed or spoilt that file: what is there is killed all the same, and given a moment
    // at start-up to go, so that the attempt runs again (never started) only on an empty cgroup;
    // what outlasts that ends the attempt as above.
    if (!cgroup.empty() && !m_cgroups->empty(cgroup) && (pid || !emptied_soon(cgroup))) {
      Shim& s = track(attempt.id);
      s.cgroup = cgroup;
      std::cerr << "gpuqd: job " << attempt.id << ": its supervisor is gone and processes of it are left in " << cgroup
                << "; killing them\n";
      asio::post(m_io, [this, id = attempt.id] { gone(id); });
      return Found::alive;
    }
    if (!cgroup.empty()) {                  // empty: a start makes it again
      count_oom_kills(attempt.id, cgroup);  // an attempt that ended while no gpuqd ran
      m_cgroups->remove(cgroup);
    }
    // With an exit record it ended while no gpuqd ran; with a pid file and none, its supervisor
    // is gone without one (outcome() says so). Without either it was never started.
    if (pid || common::path_exists(attempt.dir + "/exit.json")) return Found::ended;
    return Found::never_started;
  }

  bool withdraws_numbers() const override { return true; }

  bool can_suspend() const override { return m_cgroups && m_cgroups->can_freeze(); }

  bool suspend(std::int64_t id, bool frozen) override {
    auto it = m_shims.find(id);
    if (it == m_shims.end() || it->second.pid.pid <= 0) return false;
    Shim& s = it->second;
    const bool written = !s.cgroup.empty() && can_suspend() && m_cgroups->freeze(s.cgroup, frozen);
    const double now = steady_s();
    if (frozen) {
      if (!written) return false;
      if (s.suspended_since == 0) s.suspended_since = now;
      if (s.overdue && s.overdue_for_timeout) {  // the timeout's clock stands still
        s.overdue->cancel();
        s.overdue_at = 0;
      }
      return true;
    }
    // Thawed (or, the write refused, maybe not): the backstop runs again all the same, so that no
    // attempt is ever left without one.
    if (s.suspended_since > 0) s.suspended_s += now - s.suspended_since;
    s.suspended_since = 0;
    if (s.timeout_s > 0 && (!s.overdue || s.overdue_at == 0))
      enforce_in(id, s, s.timeout_s + m_grace_s + k_overdue_s - process_age_s(s.pid).value_or(0) + s.suspended_s, true);
    return written;
  }

  void stop(std::int64_t id) override {
    auto it = m_shims.find(id);
    if (it == m_shims.end() || it->second.pid.pid <= 0) return;
    thaw(it->second);
    signal_shim(it->second, SIGTERM);
    enforce_in(id, it->second, m_grace_s + k_overdue_s, false);
  }

  void preempt(std::int64_t id, double grace_s) override {
    auto it = m_shims.find(id);
    if (it == m_shims.end() || it->second.pid.pid <= 0) return;
    if (!it->second.handles_preempt) {  // a supervisor of an earlier gpuqd: SIGUSR1 would kill it
      stop(id);
      return;
    }
    thaw(it->second);
    signal_shim(it->second, SIGUSR1);  // supervisor.cpp: the preemption's file, signal and grace
    enforce_in(id, it->second, grace_s + k_overdue_s, false);
  }

  // A supervisor that cannot write its exit record (the state dir full or read-only) keeps
  // trying, and says so in its process name: until it succeeds the job's outcome is unknown.
  std::string detail(std::int64_t id) const override {
    auto it = m_shims.find(id);
    if (it == m_shims.end() || it->second.pid.pid <= 0) return {};
    std::ifstream comm("/proc/" + std::to_string(it->second.pid.pid) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != common::k_shim_recording_name) return {};
    return "its outcome is unknown: its ranks have ended, and its supervisor cannot write the exit record "
           "(is the state dir full or read-only?); it keeps trying";
  }

  std::string lingering(const Attempt& attempt) const override {
    if (!m_cgroups || !m_lingering.count(m_cgroups->path(cgroup_name(attempt)))) return {};
    return lingering_words();
  }

  std::vector<std::int64_t> adopt_lingering() override {
    std::vector<std::int64_t> out;
    if (!m_cgroups) return out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(m_cgroups->base(), ec)) {
      const std::string name = e.path().filename().string();
      const auto dash = name.find("-attempt-");
      if (!e.is_directory(ec) || dash == std::string::npos || dash == 0 || name.find_first_not_of("0123456789") != dash)
        continue;
      const std::string cgroup = e.path().string();
      const std::int64_t id = std::stoll(name.substr(0, dash));
      const bool watched = m_lingering.count(cgroup) || std::any_of(m_shims.begin(), m_shims.end(), [&](const auto& s) {
                             return s.second.cgroup == cgroup;
                           });
      if (watched) continue;
      if (m_cgroups->empty(cgroup)) {  // an attempt that ended, whose cgroup a stop of gpuqd left
        m_cgroups->remove(cgroup);
        continue;
      }
      std::cerr << "gpuqd: job " << id << ": processes of an ended attempt are left in " << cgroup
                << "; watching them until they are gone\n";
      m_lingering[cgroup].id = id;
      out.push_back(id);
      asio::post(m_io, [this, cgroup] { look_at_lingering(cgroup); });
    }
    return out;
  }

  std::string lingering_words() const {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", m_unkillable_s);
    return std::string("processes of it did not die within ") + bound + " s of SIGKILL (stuck in the kernel?)";
  }

  std::string containment() const override {
    return m_cgroups ? "a cgroup per attempt, under " + m_cgroups->describe() + "; " + m_cgroups->describe_limits()
                     : "the supervisor's process tree (no cgroup could be made: gpuqd's log says why)";
  }

  int supervisor_pid(std::int64_t id) const override {
    auto it = m_shims.find(id);
    return it != m_shims.end() ? it->second.pid.pid : 0;
  }

  Outcome outcome(const Attempt& attempt) override {
    Outcome o = Outcome::from_record(read_exit_record(attempt.dir + "/exit.json", 4 << 20, attempt.owner));
    // Killed past its timeout before it wrote a record; one it wrote says how the attempt ended.
    if (m_killed_at_timeout.erase(attempt.id) && !o.all_ok && !o.first_failure.is_object() && o.error)
      o.timed_out = true;
    if (auto it = m_oom_kills.find(attempt.id); it != m_oom_kills.end()) {
      o.oom_kills = it->second;
      m_oom_kills.erase(it);
    }
    return o;
  }

 private:
  struct Shim {
    ProcessId pid;
    std::unique_ptr<asio::posix::stream_descriptor> pidfd;  // readable when the shim exits
    std::unique_ptr<asio::steady_timer> poll;               // where pidfd_open is missing
    bool own_child = false;  // spawned by this gpuqd: reaped with waitpid
    std::string cgroup;      // the attempt's cgroup; "" where gpuqd has none
    double gone_at = 0;      // when the supervisor was found gone (steady seconds), 0 before
    std::unique_ptr<asio::steady_timer> overdue;  // when gpuqd kills a supervisor that did not end it
    double overdue_at = 0;                        // (steady seconds), 0: not armed
    double overdue_since = 0;                     // when it was first found overdue (steady seconds)
    std::uint64_t serial = 0;                     // tells this watch from a later one of the same job
    bool handles_preempt = false;                 // its launch document has `preempt`: it takes SIGUSR1 for one
    bool overdue_for_timeout = false;             // `overdue` is armed for the timeout (not a stop)
    double timeout_s = 0;                         // its spec's; 0: none
    double suspended_s = 0;                       // seconds frozen so far (suspend())
    double suspended_since = 0;                   // frozen since (steady seconds); 0: not frozen
  };

  // A suspended attempt is thawed before it is told to stop: frozen, it could act on no signal.
  // Asked of the freezer itself, not of memory: after a restart of gpuqd's it may be frozen still.
  void thaw(Shim& s) {
    if (s.cgroup.empty() || !can_suspend() || (s.suspended_since == 0 && !m_cgroups->frozen(s.cgroup))) return;
    m_cgroups->freeze(s.cgroup, false);
    if (s.suspended_since > 0) s.suspended_s += steady_s() - s.suspended_since;
    s.suspended_since = 0;
  }

  // Signals the supervisor, through its pidfd where there is one (never a process that reused
  // its pid).
  static void signal_shim(const Shim& s, int sig) {
    if (s.pidfd && ::syscall(SYS_pidfd_send_signal, s.pidfd->native_handle(), sig, nullptr, 0) == 0) return;
    if (!s.pidfd && is_alive(s.pid)) ::kill(s.pid.pid, sig);
  }

  // The supervisor enforces the attempt's timeout and a stop, SIGKILL after the grace period. One
  // that has not ended the attempt k_overdue_s after that is stopped (a job in single-user mode may
  // SIGSTOP its supervisor, which runs as its user): gpuqd kills it, and so the attempt's cgroup
  // (gone()). The timeout counts from the supervisor's own start (the boot clock, as /proc gives
  // it), which a step of the wall clock while gpuqd was down does not move.
  void enforce_timeout(const Attempt& attempt, Shim& s) {
    if (!attempt.spec || attempt.spec->timeout_s <= 0) return;
    s.timeout_s = attempt.spec->timeout_s;
    s.suspended_s = attempt.suspended_s;  // the time it stood frozen does not count
    if (attempt.suspended) return;        // frozen still: armed once thawed (suspend())
    const double age = process_age_s(s.pid).value_or(0);
    enforce_in(attempt.id, s, attempt.spec->timeout_s + m_grace_s + k_overdue_s - age + s.suspended_s, true);
  }

  void enforce_in(std::int64_t id, Shim& s, double in_s, bool timeout) {
    const double at = steady_s() + std::max(0.0, in_s);
    if (s.overdue_at > 0 && s.overdue_at <= at) return;  // an earlier deadline holds
    s.overdue_at = at;
    s.overdue_for_timeout = timeout;
    if (!s.overdue) s.overdue = std::make_unique<asio::steady_timer>(m_io);
    s.overdue->expires_after(std::chrono::milliseconds(static_cast<std::int64_t>(std::max(0.0, in_s) * 1000)));
    s.overdue->async_wait([this, id, timeout, serial = s.serial](const boost::system::error_code& ec) {
      if (!ec) overdue(id, timeout, serial);
    });
  }

  // Past the deadline: a supervisor stopped (SIGSTOP, or traced) is killed at once; one that runs
  // is given up to k_overdue_running_s more (its last processes may take long to die, a GPU's
  // teardown say), as is one whose ranks have ended and which keeps trying to write their record
  // (detail()), once nothing of the attempt is left in its cgroup.
  void overdue(std::int64_t id, bool timeout, std::uint64_t serial) {
    auto it = m_shims.find(id);
    if (it == m_shims.end() || it->second.serial != serial || it->second.pid.pid <= 0) return;
    Shim& s = it->second;
    const double now = steady_s();
    if (s.overdue_since == 0) s.overdue_since = now;
    const auto fields = common::proc_stat_fields(s.pid.pid);
    const bool stopped = fields && !fields->empty() && ((*fields)[0] == "T" || (*fields)[0] == "t");
    const bool recording = !detail(id).empty() && (s.cgroup.empty() || m_cgroups->empty(s.cgroup));
    if (recording || (!stopped && now - s.overdue_since < k_overdue_running_s)) {
      s.overdue_at = 0;
      enforce_in(id, s, k_overdue_s, timeout);
      return;
    }
    std::cerr << "gpuqd: job " << id << ": its supervisor (pid " << s.pid.pid << ", "
              << (stopped ? "stopped" : "running") << ") has not ended it " << m_grace_s + k_overdue_s
              << " s after its " << (timeout ? "timeout" : "stop") << "; killing it and what is left of the attempt\n";
    if (timeout) m_killed_at_timeout.insert(id);
    signal_shim(s, SIGKILL);  // gone() follows, through the pidfd or the poll
  }

  // Seconds since process `p` started, by the boot clock; nothing where /proc does not say.
  static std::optional<double> process_age_s(const ProcessId& p) {
    std::ifstream in("/proc/uptime");
    double uptime = 0;
    const long hz = ::sysconf(_SC_CLK_TCK);
    if (!(in >> uptime) || hz <= 0 || p.start_time == 0) return std::nullopt;
    return std::max(0.0, uptime - static_cast<double>(p.start_time) / static_cast<double>(hz));
  }

  // Whether process `pid` is the supervisor gpuqd started for `attempt`: its command line, which
  // only it (or root) may change, is `gpuq-shim DIR/launch.json ...` (spawn_supervisor; one the
  // server forked writes it over the server's own before it writes its pid file: serve.cpp).
  // And its executable is gpuq-shim's, the one this gpuqd runs (or was, before an upgrade replaced
  // it): a set-user-ID program the job's owner ran with the launch document as its argument (sudo)
  // has the command line and the identity, not the executable.
  bool supervises(int pid, const Attempt& attempt) const {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string shim, launch;
    if (!std::getline(in, shim, '\0') || !std::getline(in, launch, '\0') || launch != attempt.dir + "/launch.json")
      return false;
    std::error_code ec;
    std::string exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
    if (constexpr std::string_view deleted = " (deleted)"; exe.ends_with(deleted))
      exe.resize(exe.size() - deleted.size());
    return !ec && !m_shim_exe.empty() && exe == m_shim_exe;
  }

  // A new watch of the attempt of job `id`: what an earlier one left is forgotten.
  Shim& track(std::int64_t id) {
    Shim& s = m_shims[id];
    s.serial = ++m_serials;
    m_killed_at_timeout.erase(id);
    m_oom_kills.erase(id);
    return s;
  }

  // Unique among this gpuqd's attempts, and the same after a restart.
  static std::string cgroup_name(const Attempt& attempt) {
    return std::to_string(attempt.id) + "-" + attempt.dir.substr(attempt.dir.rfind('/') + 1);
  }

  // `pidfd`: one the server handed over with the pid, or -1 (opened here, and kept only if the
  // pid is still the supervisor's: one the server forked is not gpuqd's child, whose zombie would
  // hold the pid, and may have been reaped already).
  void watch(std::int64_t id, Shim& s, int pidfd = -1) {
    int fd = pidfd >= 0 ? pidfd : pidfd_open(s.pid.pid);
    if (pidfd < 0 && fd >= 0 && !s.own_child && !is_alive(s.pid)) {
      ::close(fd);
      asio::post(m_io, [this, id] { gone(id); });
      return;
    }
    if (fd >= 0) {
      s.pidfd = std::make_unique<asio::posix::stream_descriptor>(m_io, fd);
      when_readable(*s.pidfd, [this, id](const boost::system::error_code& ec) {  // not before it ends
        if (!ec) gone(id);
      });
      return;
    }
    if (errno == ESRCH) {
      asio::post(m_io, [this, id] { gone(id); });
      return;
    }
    s.poll = std::make_unique<asio::steady_timer>(m_io);
    poll(id);
  }

  void poll(std::int64_t id) {
    auto it = m_shims.find(id);
    if (it == m_shims.end()) return;
    it->second.poll->expires_after(std::chrono::milliseconds(200));
    it->second.poll->async_wait([this, id](const boost::system::error_code& ec) {
      if (ec) return;
      auto shim = m_shims.find(id);
      if (shim == m_shims.end()) return;
      if (is_alive(shim->second.pid))
        poll(id);
      else
        gone(id);
    });
  }

  // The supervisor is gone: what is left in the attempt's cgroup is killed (`setsid` children,
  // double forks, ranks of a supervisor the job killed), and the attempt ends once none is left.
  void gone(std::int64_t id) {
    auto it = m_shims.find(id);
    if (it == m_shims.end()) return;
    Shim& s = it->second;
    if (s.own_child && s.pid.pid > 0) ::waitpid(s.pid.pid, nullptr, WNOHANG);  // reap our zombie
    s.own_child = false;
    s.pid = {};
    if (!s.cgroup.empty()) {
      const double now = steady_s();
      if (s.gone_at == 0) s.gone_at = now;
      m_cgroups->kill(s.cgroup);
      if (!m_cgroups->empty(s.cgroup)) {
        if (now - s.gone_at < m_unkillable_s) {  // they die as the kernel gets to them: look again shortly
          if (!s.poll) s.poll = std::make_unique<asio::steady_timer>(m_io);
          s.poll->expires_after(std::chrono::milliseconds(20));
          s.poll->async_wait([this, id](const boost::system::error_code& ec) {
            if (!ec) gone(id);
          });
          return;
        }
        std::cerr << "gpuqd: job " << id << ": processes in its cgroup " << s.cgroup << " did not die within "
                  << m_unkillable_s << " s of SIGKILL (stuck in the kernel?); its attempt is recorded as ended, "
                  << "its GPUs out of service until they are gone\n";
        const std::string cgroup = s.cgroup;
        count_oom_kills(id, cgroup);
        m_lingering[cgroup].id = id;
        m_shims.erase(it);
        m_ended(id);
        look_at_lingering(cgroup);
        return;
      }
      count_oom_kills(id, s.cgroup);
      m_cgroups->remove(s.cgroup);
    }
    m_shims.erase(it);
    m_ended(id);
  }

  // The attempt's OOM kills, read while its cgroup is there, for outcome().
  void count_oom_kills(std::int64_t id, const std::string& cgroup) {
    if (const auto n = m_cgroups->oom_kills(cgroup)) m_oom_kills[id] = *n;
  }

  // What is left of an attempt that ended lingering: killed again, and once none of it is left,
  // its cgroup goes; once no attempt of the job lingers, gpuqd hears that it is released.
  void look_at_lingering(const std::string& cgroup) {
    auto it = m_lingering.find(cgroup);
    if (it == m_lingering.end()) return;
    Lingering& l = it->second;
    m_cgroups->kill(cgroup);
    if (m_cgroups->empty(cgroup)) {
      const std::int64_t id = l.id;
      std::cerr << "gpuqd: job " << id << ": the processes left in " << cgroup << " are gone\n";
      m_cgroups->remove(cgroup);
      m_lingering.erase(it);
      const bool job_lingers =
          std::any_of(m_lingering.begin(), m_lingering.end(), [&](const auto& other) { return other.second.id == id; });
      if (m_released && !job_lingers) m_released(id);
      return;
    }
    if (!l.look) l.look = std::make_unique<asio::steady_timer>(m_io);
    l.look->expires_after(std::chrono::milliseconds(static_cast<int>(k_linger_look_s * 1000)));
    l.look->async_wait([this, cgroup](const boost::system::error_code& ec) {
      if (!ec) look_at_lingering(cgroup);
    });
  }

  // Kills what is in `cgroup` and waits, at most 2 s, for it to be empty: at start-up only (adopt),
  // before gpuqd serves anyone.
  bool emptied_soon(const std::string& cgroup) const {
    for (int i = 0; i < 200; ++i) {
      m_cgroups->kill(cgroup);
      if (m_cgroups->empty(cgroup)) return true;
      ::usleep(10000);
    }
    return false;
  }

  static std::string real_path(const std::string& path) {
    std::error_code ec;
    auto p = std::filesystem::canonical(path, ec);
    return ec ? std::string() : p.string();
  }

  static double steady_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  static constexpr double k_linger_look_s = 1;
  static constexpr double k_overdue_running_s = 30;

  asio::io_context& m_io;
  std::string m_shim_path;
  std::string m_shim_exe = real_path(m_shim_path);  // as /proc/PID/exe names it
  SupervisorServer m_server{m_shim_path};
  bool m_said_exec = false;  // that a supervisor was exec'd, the server unable to fork it
  Ended m_ended;
  std::optional<Cgroups> m_cgroups;
  double m_grace_s = 10;
  double m_unkillable_s = 30;
  // Attempts ended with processes left that SIGKILL did not end, by cgroup (two attempts of one job
  // may linger), looked at every k_linger_look_s until empty.
  struct Lingering {
    std::int64_t id = 0;
    std::unique_ptr<asio::steady_timer> look;
  };
  std::map<std::string, Lingering> m_lingering;
  std::map<std::int64_t, Shim> m_shims;  // attempts running, by job
  std::uint64_t m_serials = 0;
  std::map<std::int64_t, std::int64_t> m_oom_kills;  // by job: its ended attempt's, outcome not yet read
  std::set<std::int64_t> m_killed_at_timeout;  // ended by overdue() at their timeout, outcome not yet read
};

}  // namespace

std::unique_ptr<Executor> make_local_executor(asio::io_context& io, std::string shim_path, Executor::Ended ended,
                                              std::optional<Cgroups> cgroups, LocalBounds bounds) {
  return std::make_unique<LocalExecutor>(io, std::move(shim_path), std::move(ended), std::move(cgroups), bounds);
}

}  // namespace gpuq::daemon
