// The job supervisor (see supervisor.hpp). Single-threaded: every signal it cares about is
// blocked and read from a signalfd in the same poll() as the ranks' output pipes (when logs are
// capped), so there are no async-signal-safety traps.
//
// Longer than the ~600 lines a file is held to: it is the one loop of a program exec'd once per
// attempt (start the ranks, watch signals, pipes and deadlines, tear the gang down, write the
// exit record), whose steps share the loop's state; supervision out of the job's reach (a root
// supervisor, a cgroup per attempt) will reshape it, and split it along the new seams.
#include "supervisor/supervisor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/failure_class.hpp"
#include "common/json_input.hpp"
#include "common/paths.hpp"
#include "common/process.hpp"
#include "common/spec.hpp"
#include "supervisor/boost_process.hpp"
#include "supervisor/log_sink.hpp"
#include "supervisor/output_report.hpp"

extern char** environ;

namespace gpuq::supervisor {

using json = nlohmann::json;
using common::mark_inherited_fds_cloexec;
using common::proc_stat_fields;
using common::process_start_time;
using common::resolve_executable;
using common::wall_now;
using common::write_file_atomic;

namespace {

double mono_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

// A rank's CPU affinity mask, built before the fork (the child may only make system calls).
class CpuMask {
 public:
  explicit CpuMask(const std::vector<int>& cores) {
    if (cores.empty()) return;
    const int ncpu = std::max(CPU_SETSIZE, *std::max_element(cores.begin(), cores.end()) + 1);
    m_set = CPU_ALLOC(ncpu);
    m_size = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(m_size, m_set);
    for (int c : cores) CPU_SET_S(c, m_size, m_set);
    m_failed = "gpuq: cannot pin this rank to CPUs " + common::format_cpu_list(cores) + "; it runs unpinned\n";
  }
  ~CpuMask() {
    if (m_set) CPU_FREE(m_set);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  // In the child. A core that went offline since gpuqd started must not stop the job.
  void apply() const {
    if (m_set && ::sched_setaffinity(0, m_size, m_set) != 0) {
      [[maybe_unused]] ssize_t n = ::write(2, m_failed.data(), m_failed.size());
    }
  }

 private:
  cpu_set_t* m_set = nullptr;
  std::size_t m_size = 0;
  std::string m_failed;
};

// A rank's NUMA memory policy (`mem_bind`), built before the fork like CpuMask and set in the
// child with set_mempolicy(2), which exec keeps: every allocation of the job's processes then
// comes from its cores' nodes (local) or from them first (prefer).
class MemPolicy {
 public:
  explicit MemPolicy(const json& bind) {
    if (!bind.is_object()) return;
    const std::string policy = bind.value("policy", "");
    const auto nodes = bind.value("nodes", std::vector<int>{});
    if (nodes.empty() || *std::min_element(nodes.begin(), nodes.end()) < 0) {
      m_message = "gpuq: mem_bind: the NUMA nodes of this rank's cores are unknown; its memory is not bound\n";
      return;
    }
    constexpr int k_bits = 8 * sizeof(unsigned long);
    const int max_node = *std::max_element(nodes.begin(), nodes.end());
    m_mask.assign(static_cast<std::size_t>(max_node / k_bits + 1), 0UL);
    for (int n : nodes) m_mask[static_cast<std::size_t>(n / k_bits)] |= 1UL << (n % k_bits);
    m_max_node = static_cast<unsigned long>(m_mask.size() * k_bits + 1);  // the kernel reads one bit fewer
    m_mode = policy == "local" ? k_bind : nodes.size() == 1 ? k_preferred : k_preferred_many;
    m_message = "gpuq: cannot set this rank's memory policy (mem_bind " + policy + ", NUMA node(s) " +
                common::format_cpu_list(nodes) + "); its memory is not bound\n";
  }
  // In the child: system calls only.
  void apply() const {
    long r = -1;
    if (!m_mask.empty()) {
      r = ::syscall(SYS_set_mempolicy, m_mode, m_mask.data(), m_max_node);
      // Kernels before 5.15 have no MPOL_PREFERRED_MANY: prefer the first node.
      if (r != 0 && m_mode == k_preferred_many) {
        const unsigned long first = m_mask[0] & (~m_mask[0] + 1);  // lowest set bit (node 0-63)
        r = first ? ::syscall(SYS_set_mempolicy, k_preferred, &first, 65UL) : -1;
      }
    }
    if (r != 0 && !m_message.empty()) [[maybe_unused]] ssize_t n = ::write(2, m_message.data(), m_message.size());
  }

 private:
  // <linux/mempolicy.h>, whose copy in older kernel headers lacks MPOL_PREFERRED_MANY.
  static constexpr int k_preferred = 1, k_bind = 2, k_preferred_many = 5;
  std::vector<unsigned long> m_mask;
  unsigned long m_max_node = 0;
  int m_mode = 0;
  std::string m_message;  // written to the rank's log when no policy could be set
};

// The user a root supervisor runs the job's processes as (the launch document's `run_as`, lab
// mode). The supervisor itself stays root (see take_owners_files); only the ranks take this
// identity, between fork and exec (Owner::become), as slurmstepd's tasks do.
struct Owner {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  std::string cannot;  // what a rank says in its log when it cannot become the owner

  // In a vfork child, the last step before exec (from here the owner's processes may signal it,
  // and its memory is the supervisor's until exec): raw system calls, which change this task's
  // credentials alone (glibc's wrappers would broadcast the change to every thread of the parent's
  // process, whose memory a vfork child shares); the ids read back, root's gone for good, not
  // dumpable until exec gives it memory of its own, then no_new_privs: no set-user-ID program the
  // job runs gains privileges. False: the rank must not run.
  bool become() const {
    if (::syscall(k_setgroups, groups.size(), groups.data()) != 0 || ::syscall(k_setresgid, gid, gid, gid) != 0 ||
        ::syscall(k_setresuid, uid, uid, uid) != 0)
      return false;
    ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    uid_t r = 0, e = 0, s = 0;
    gid_t rg = 0, eg = 0, sg = 0;
    if (::syscall(k_getresuid, &r, &e, &s) != 0 || r != uid || e != uid || s != uid ||
        ::syscall(k_getresgid, &rg, &eg, &sg) != 0 || rg != gid || eg != gid || sg != gid)
      return false;
    if (uid != 0 && ::syscall(k_setresuid, 0, 0, 0) == 0) return false;  // root must be gone for good
    return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
  }

  // Where a 32-bit ABI has 16-bit ids in the plain calls (i386, arm), the 32-bit ones.
#ifdef SYS_setresuid32
  static constexpr long k_setgroups = SYS_setgroups32, k_setresgid = SYS_setresgid32, k_setresuid = SYS_setresuid32,
                        k_getresuid = SYS_getresuid32, k_getresgid = SYS_getresgid32;
#else
  static constexpr long k_setgroups = SYS_setgroups, k_setresgid = SYS_setresgid, k_setresuid = SYS_setresuid,
                        k_getresuid = SYS_getresuid, k_getresgid = SYS_getresgid;
#endif
};

// Writes `what`, the decimal `err` and "); not started" to stderr: system calls only (a vfork child).
void say_errno(const std::string& what, int err) {
  char digits[16];
  int at = sizeof(digits);
  do {
    digits[--at] = static_cast<char>('0' + err % 10);
    err /= 10;
  } while (err > 0 && at > 0);
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, what.data(), what.size());
  n = ::write(STDERR_FILENO, digits + at, sizeof(digits) - static_cast<std::size_t>(at));
  static constexpr char k_end[] = "); not started\n";
  n = ::write(STDERR_FILENO, k_end, sizeof(k_end) - 1);
}

// In the rank, between fork and exec: the attempt's cgroup first (every process of the rank is in
// it from the start), the rank's cores when it has some, its own process group (so the whole group
// can be signalled), default signal mask (the shim blocks signals; a blocked mask survives exec),
// then the owner's identity (lab mode), its working directory, and death with the shim (after the
// identity change, which clears it). Runs in a vfork child: system calls only. A working
// directory that cannot be entered ends the rank with 127 and `chdir_failed` in its log
// (bp::start_dir ignores a failed chdir: the job ran in the shim's).
struct RankSetup : bp::extend::handler {
  const std::string& cwd;
  const std::string& chdir_failed;
  const CpuMask& cpus;
  const MemPolicy& memory;
  // The attempt's cgroup in each hierarchy (O_PATH descriptors the shim opened), the rank's
  // `cgroup.procs` in each (`rank-R/cgroup.procs`, or the attempt's own where its ranks have no
  // cgroup of their own there), and what to say where one cannot be joined (the errno follows).
  const std::vector<int>& cgroups;
  const std::vector<std::string>& rank_procs;
  const std::vector<std::string>& join_failed;
  const Owner* owner = nullptr;  // lab mode: who the rank runs as; nullptr: the shim's own user
  int parent = 0;                // the supervisor's pid
  template <class Executor>
  void on_exec_setup(Executor&) const {
    // A root supervisor acts on files as the owner; the cgroup is joined as root (a kernel before
    // 5.16 judges the write by the writer's file-system identity, not the opener's).
    if (owner) ::syscall(SYS_setfsuid, 0), ::syscall(SYS_setfsgid, 0);
    for (std::size_t i = 0; i < cgroups.size(); ++i) {
      const int procs = ::openat(cgroups[i], rank_procs[i].c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
      if (procs < 0 || ::write(procs, "0", 1) != 1) {  // "0": the writer
        say_errno(join_failed[i], errno);
        ::_exit(126);
      }
      ::close(procs);
    }
    cpus.apply();
    memory.apply();
    ::setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    mark_inherited_fds_cloexec();
    if (owner && !owner->become()) {
      [[maybe_unused]] auto n = ::write(STDERR_FILENO, owner->cannot.data(), owner->cannot.size());
      ::_exit(126);
    }
    // As the owner, with no privilege left: a path they could not enter (through a link they
    // turned since submit) is not entered.
    if (::chdir(cwd.c_str()) != 0) {
      [[maybe_unused]] auto n = ::write(STDERR_FILENO, chdir_failed.data(), chdir_failed.size());
      ::_exit(127);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // after the change of identity, which clears it
    if (::getppid() != parent) ::_exit(126);  // the supervisor died before that: the rank dies with it
  }
};

// Calls `use` with the descriptor `fd` opened as a stream (`mode`), and closes it after, whatever
// `use` does; an error (in `fd`, or of fdopen) is thrown, naming `what`.
template <class Use>
void with_stream(Result<int> fd, const char* mode, const std::string& what, Use&& use) {
  if (!fd) throw std::runtime_error(fd.error().message);
  FILE* stream = ::fdopen(*fd, mode);
  if (!stream) {
    ::close(*fd);
    throw std::runtime_error("cannot open " + what + ": " + std::strerror(errno));
  }
  try {
    use(stream);
  } catch (...) {
    std::fclose(stream);
    throw;
  }
  std::fclose(stream);
}

struct Rank {
  int rank = 0;
  int pid = 0;
  bool exited = false;
  std::optional<int> exit_code, signal;
};

// The last `bytes` of a rank's log (or, just after a rotation, of its older part), read as its
// user reads it: not through a link, never waiting on a fifo.
std::string log_tail(const std::string& log, std::size_t bytes) {
  for (const auto& path : {log, log + ".1"}) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    std::string tail;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      const off_t from = std::max<off_t>(0, st.st_size - static_cast<off_t>(bytes));
      tail.resize(static_cast<std::size_t>(st.st_size - from));
      const ssize_t n = ::pread(fd, tail.data(), tail.size(), from);
      tail.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    }
    ::close(fd);
    if (tail.find_first_not_of(" \t\r\n") != std::string::npos) return tail;
  }
  return "";
}

// What a failing rank said last: the last line of its log with something in it (a Python
// traceback's `ValueError: …`, gpuq-worker's own error, CUDA's out-of-memory message), from the
// log's last 8 KiB, as a terminal shows it (common::printable_line); "" when it said nothing.
std::string last_words(const std::string& tail) {
  const std::string_view t = std::string_view(tail).substr(tail.size() > 8192 ? tail.size() - 8192 : 0);
  std::size_t end = t.size();
  while (end > 0) {
    const std::size_t nl = t.rfind('\n', end - 1);
    const std::size_t begin = nl == std::string_view::npos ? 0 : nl + 1;
    std::string text = common::printable_line(t.substr(begin, end - begin));
    end = nl == std::string_view::npos ? 0 : nl;
    if (!text.empty()) return text;
  }
  return "";
}

// Direct children of this process: ranks, plus orphans re-parented to us as subreaper.
std::vector<int> direct_children() {
  std::vector<int> out;
  const int self = ::getpid();
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  while (dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int pid = std::atoi(e->d_name);
    auto fields = proc_stat_fields(pid);
    if (fields && fields->size() > 4 - 3 && std::atoi((*fields)[4 - 3].c_str()) == self) out.push_back(pid);  // field 4: ppid
  }
  ::closedir(proc);
  return out;
}

// The kernel's count of OOM kills so far (/proc/vmstat), or -1 where it cannot be read.
std::int64_t oom_kills() {
  std::ifstream in("/proc/vmstat");
  std::string key;
  std::int64_t value = 0;
  while (in >> key >> value)
    if (key == "oom_kill") return value;
  return -1;
}

// The shim's own messages (it cannot record its pid or its outcome, say) go to shim.log beside the
// launch document, made on the first one: gpuqd starts it with no output, so that a job attempt
// costs no file nobody reads (each file made on ext4 was ~0.4 ms of gpuqd's time under load).
std::string g_complaints;
void complain(const std::string& message) {
  const std::string line = "gpuq-shim: " + message + "\n";
  // In the job's directory, and maybe before the shim acts on files as the owner: never through a
  // link the job put there, nor into a fifo (open_log).
  int fd = -1;
  if (g_complaints.empty()) {
    fd = ::dup(STDERR_FILENO);
  } else if (auto log = open_log(g_complaints, false)) {
    fd = *log;
  }
  if (fd < 0) return;
  [[maybe_unused]] auto n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

// A job's `report` (a spec's, common/spec.hpp) as its supervisor carries it out: the chosen
// rank's output read through the job's patterns (output_report.hpp), and the results file read
// once every rank has ended, both written as event lines into report-R.jsonl beside the rank's
// events file (events-R.jsonl; daemon/launcher.hpp rank_report_path), which gpuqd reads as it
// reads that one. Never into the rank's own: a line the job writes there in pieces (a buffered
// file flushed mid-line) would take the supervisor's line into its middle, and both be lost.
class Reporting {
 public:
  Reporting() = default;
  Reporting(const Reporting&) = delete;
  Reporting& operator=(const Reporting&) = delete;
  ~Reporting() {
    if (m_events_fd >= 0) ::close(m_events_fd);
  }

  // The launch document's `report`: its patterns compiled. A problem (gpuqd checked them when the
  // job came) is said in the shim's log and the job runs unreported.
  void take(const json& doc) {
    const auto it = doc.find("report");
    if (it == doc.end() || !it->is_object()) return;
    common::Report r;
    try {
      r.progress = it->value("progress", std::vector<std::string>{});
      r.result = it->value("result", std::vector<std::string>{});
      r.rank = it->value("rank", 0);
      r.file = it->value("file", std::string());
    } catch (const std::exception&) {
      complain("the launch document's report is not {progress, result, rank, file}");
      return;
    }
    m_file = r.file;
    m_rank = r.rank;
    if (r.progress.empty() && r.result.empty()) return;
    auto made = OutputReport::make(r);
    if (!made) return complain("the job's report patterns: " + made.error().message);
    m_patterns = std::move(*made);
  }

  // Rank `rank` starts: where its events go, its working directory and its log, if it reports.
  void spawning(int rank, const std::string& events, const std::string& cwd, const std::string& log) {
    if (rank != m_rank) return;
    m_events = report_path(events);
    m_cwd = cwd;
    m_log = log;
  }
  // Whether rank `rank`'s output goes through the patterns (then through a pipe: watch()).
  bool reads_output_of(int rank) const { return m_patterns && rank == m_rank; }
  void watch(int pipe) { m_pipe = pipe; }
  // Output read from pipe `fd`; its end.
  void output(int fd, const char* data, std::size_t n) {
    if (fd != m_pipe) return;
    m_patterns->feed(data, n, m_out);
    write_events();
  }
  void closed(int fd) {
    if (fd != m_pipe) return;
    m_patterns->finish(m_out);  // its last line, if it did not end with one
    write_events(true);
    m_pipe = -1;
  }
  // A turn of the supervisor's loop: what waited for its pace.
  void tick() {
    if (m_pipe >= 0) write_events();
  }

  // The results file the report names, once every rank has ended: a JSON object (at most 1 MiB),
  // read as the owner from the reporting rank's directory, never through a link, and written as
  // a result event. A file that is missing or not an object is said in the rank's log.
  // ".../events-R.jsonl" -> ".../report-R.jsonl"; another name gets ".report" after it.
  static std::string report_path(const std::string& events) {
    if (events.empty()) return "";
    const auto slash = events.rfind('/');
    const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
    if (events.compare(base, 7, "events-") == 0) return events.substr(0, base) + "report-" + events.substr(base + 7);
    return events + ".report";
  }

  void read_results_file() {
    if (m_file.empty() || m_events.empty()) return;
    const std::string path = m_file[0] == '/' ? m_file : m_cwd + "/" + m_file;
    std::string problem;
    auto text = common::read_job_file(path, 1 << 20, "its results file " + m_file);
    if (!text) {
      problem = text.error().message;
    } else if (auto doc = common::parse_untrusted(*text, "its results file " + m_file); !doc) {
      problem = doc.error().message;
    } else if (!doc->is_object()) {
      problem = "its results file " + m_file + " holds " + std::string(doc->type_name()) + ", not an object";
    } else {
      json result = std::move(*doc);
      result["type"] = "result";
      if (result.dump().size() < (1 << 20)) {  // an event line gpuqd reads (k_max_event_line)
        m_out.push_back(std::move(result));
        write_events(true);
        return;
      }
      problem = "its results file " + m_file + ": over 1 MiB as an event line";
    }
    if (auto fd = open_log(m_log, false)) {
      const std::string line = "gpuq: no result from " + problem + "\n";
      [[maybe_unused]] auto n = ::write(*fd, line.data(), line.size());
      ::close(*fd);
    }
  }

 private:
  // The events the report made, appended to the report's events file as lines the job could have
  // written (O_APPEND, a line a write), made as the owner and never through a link the job put at
  // its name (open_log). gpuqd reads them with the rank's own.
  // What a chatty program's lines make is paced: a progress event at most every 0.5 s and the
  // result at most once a second, the fields of the lines between merged (the later winning), so
  // a rank's events file (of which gpuqd reads 64 MiB) lasts days; both are written out when the
  // rank's output ends (`all`).
  void write_events(bool all = false) {
    const double now = mono_now();
    for (auto& e : m_out) {
      json& pending = e.value("type", "") == "result" ? m_pending_result : m_pending_progress;
      for (auto& [k, v] : e.items())
        pending[k] = std::move(v);
    }
    m_out.clear();
    if (!m_pending_progress.empty() && (all || now - m_progress_at >= 0.5)) {
      m_out.push_back(std::move(m_pending_progress));
      m_pending_progress = json::object();
      m_progress_at = now;
    }
    if (!m_pending_result.empty() && (all || now - m_result_at >= 1.0)) {
      m_out.push_back(std::move(m_pending_result));
      m_pending_result = json::object();
      m_result_at = now;
    }
    if (m_out.empty()) return;
    if (m_events_fd < 0 && !m_events.empty() && !m_events_failed) {
      auto fd = open_log(m_events, false);
      if (fd)
        m_events_fd = *fd;
      else
        complain("cannot write the job's reported events: " + fd.error().message), m_events_failed = true;
    }
    for (const auto& e : m_out) {
      if (m_events_fd < 0) break;
      const std::string line = e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
      if (::write(m_events_fd, line.data(), line.size()) < 0) break;
    }
    m_out.clear();
  }

  std::unique_ptr<OutputReport> m_patterns;  // none: the output is not read
  int m_rank = 0;
  int m_pipe = -1;  // the reporting rank's output
  std::string m_events, m_cwd, m_log, m_file;
  std::vector<json> m_out;                                                      // events made, not yet written
  json m_pending_progress = json::object(), m_pending_result = json::object();  // paced (write_events)
  double m_progress_at = -1, m_result_at = -1;
  int m_events_fd = -1;
  bool m_events_failed = false;
};

class Supervisor {
 public:
  // `stop_on_urg`: one task of a Slurm gang, where gpuq stops the supervisors with SIGURG (see
  // run_slurm_task).
  // `stop_file`: a file whose presence, once signals are caught, is a stop that came before.
  // `cgroups`: the attempt's cgroup in each hierarchy, as O_PATH descriptors, and their
  // directories (for what a rank says when it cannot join); none: no cgroup. `per_rank`: for each,
  // whether rank R joins `rank-R` below it (the default) or the cgroup itself.
  // `owner`: who the ranks run as, when this process is root and they are not to be (lab mode).
  explicit Supervisor(json doc, bool stop_on_urg = false, std::string stop_file = "", std::vector<int> cgroups = {},
                      std::vector<std::string> cgroup_dirs = {}, std::optional<Owner> owner = std::nullopt,
                      std::vector<bool> per_rank = {})
      : m_doc(std::move(doc)),
        m_stop_on_urg(stop_on_urg),
        m_stop_file(std::move(stop_file)),
        m_cgroups(std::move(cgroups)),
        m_cgroup_dirs(std::move(cgroup_dirs)),
        m_per_rank(std::move(per_rank)),
        m_owner(std::move(owner)) {}

  ~Supervisor() { release_cgroup(); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Every rank has joined the cgroup (or none will): the descriptor opened with gpuqd's identity
  // goes, so that no process of the attempt's (a leftover the shim reaps) could ever hold it.
  void release_cgroup() {
    for (int fd : m_cgroups)
      ::close(fd);
    m_cgroups.clear();
  }

  // After run(): a rank of its own failed first (not one torn down, timed out or stopped).
  bool rank_failed() const { return !m_first_failure.is_null(); }

  // After run(): every rank exited 0, and nothing stopped the attempt.
  bool succeeded() const {
    if (m_cancelled || m_timed_out || !m_first_failure.is_null()) return false;
    for (const auto& r : m_ranks)
      if (r.exit_code != 0) return false;
    return true;
  }

  int run() {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigemptyset(&m_signals);
    for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&m_signals, s);
    if (m_stop_on_urg) sigaddset(&m_signals, SIGURG);
    // SIGUSR1 from gpuqd (or Slurm's --signal=B:USR1): a preemption (the launch document's
    // `preempt`). A task of a Slurm gang takes one as SIGURG with `preempt` in the stop file:
    // Slurm signals every process of a step, and SIGUSR1 would end ranks that do not catch it.
    const json preempt = m_doc.value("preempt", json());
    if (preempt.is_object()) {
      m_preempt_signal = preempt.value("signal", SIGTERM);
      m_preempt_grace_s = preempt.value("grace_s", 30.0);
      m_preempt_file = preempt.value("file", std::string());
      if (!m_stop_on_urg) sigaddset(&m_signals, SIGUSR1);
    }
    ::sigprocmask(SIG_BLOCK, &m_signals, nullptr);

    // Announce ourselves before starting anything: the daemon adopts us through this file. With
    // `claim`, the file is made only where there is none: a gpuqd restarted before this moment
    // found no supervisor and withdrew the attempt by making it first (it runs it again under
    // another number), and this one then starts nothing.
    auto start = process_start_time(::getpid());
    json pid = {{"pid", ::getpid()}, {"start_time", start.value_or(0)}};
    const std::string& pid_file = m_doc["pid_file"].get_ref<const std::string&>();
    auto w = m_doc.value("claim", false) ? common::create_file_once(pid_file, pid.dump())
                                         : write_file_atomic(pid_file, pid.dump());
    if (!w) {
      complain(w.error().message);
      return 2;
    }
    if (!*w) {
      complain("the attempt was withdrawn before this supervisor claimed it (" + pid_file +
               " is there); starting nothing");
      return 3;
    }

    m_started_at = wall_now();
    m_oom_kills_at_start = oom_kills();
    const double timeout_s = m_doc.value("timeout_s", 0.0);
    m_grace_s = m_doc.value("grace_s", 10.0);
    double deadline = timeout_s > 0 ? mono_now() + timeout_s : 0;
    double clock_at = mono_now();  // the clocks stand still while the attempt is frozen (below)

    m_log_limit = m_doc.value("log_limit_bytes", std::int64_t{0});
    m_sigfd = ::signalfd(-1, &m_signals, SFD_CLOEXEC | SFD_NONBLOCK);
    if (m_sigfd < 0) {
      complain(std::string("signalfd: ") + std::strerror(errno));
      return 2;
    }
    // A stop sent before the signals above were caught was lost (SIGURG is ignored by default);
    // the file gpuqd writes before sending it says so. One written after this look comes with a
    // signal that is caught.
    if (!m_stop_file.empty() && common::path_exists(m_stop_file)) {
      m_cancelled = true;
      m_preempted = stop_is_preemption();  // `preempt` in it: a preemption (a Slurm gang's)
    }
    m_report.take(m_doc);
    if (!m_cancelled)
      for (const auto& r : m_doc["ranks"]) spawn(r);
    release_cgroup();

    for (;;) {
      // As subreaper, every leftover descendant ends up our child: no children means done.
      if (!reap()) break;
      if (m_ranks_left == 0 && !m_tearing_down) begin_teardown();  // only leftovers remain
      if (m_tearing_down) {
        if (!m_killing && mono_now() >= m_kill_at) m_killing = true;
        signal_all(m_killing ? SIGKILL : m_first_signal);
      }
      // Wait for a signal, at most until the next deadline (or a short tick while tearing down,
      // to catch processes re-parented to us in the meantime).
      double wait_s = 1.0;
      if (deadline > 0 && !m_tearing_down) wait_s = std::max(0.0, std::min(wait_s, deadline - mono_now()));
      if (m_tearing_down) wait_s = 0.05;
      if (wait_for_events(wait_s) && !m_cancelled) m_cancelled = true, begin_teardown();
      // The timeout's clock, and a teardown's grace, stand still while gpuqd holds the attempt
      // frozen (a suspension, which may come while the attempt's own timeout tears it down): a
      // frozen process can neither work nor act on its signal.
      const double now = mono_now();
      if ((deadline <= 0 || m_tearing_down) && (!m_tearing_down || m_killing)) {
        clock_at = now;
      } else if (now - clock_at >= 0.25) {
        if (attempt_frozen()) (m_tearing_down ? m_kill_at : deadline) += now - clock_at;
        clock_at = now;
      }
      if (deadline > 0 && !m_tearing_down && mono_now() >= deadline) {
        m_timed_out = true;
        begin_teardown();
      }
    }
    // A stop signal that came with the ranks' end, unread: under Slurm, an scancel signals the
    // whole step, and a rank's death may reach this loop before the supervisor's own SIGTERM.
    if (wait_for_events(0) && !m_cancelled && !m_timed_out) m_cancelled = true;
    // Every writer is gone: what is left in the pipes ends with EOF.
    std::vector<int> all;
    for (const auto& [fd, _] : m_pipes) all.push_back(fd);
    pump_pipes(all, true);
    m_report.read_results_file();
    return record_outcome();
  }

 private:
  void spawn(const json& r) {
    Rank rank;
    rank.rank = r["rank"].get<int>();
    const auto argv = r["argv"].get<std::vector<std::string>>();
    auto env_map = r["env"].get<std::map<std::string, std::string>>();
    // `inherit_env` (the Slurm executor): the rank starts from this process's environment, the
    // node's, with the job's variables over it.
    if (m_doc.value("inherit_env", false))
      for (char** e = environ; *e; ++e)
        if (const char* eq = std::strchr(*e, '=')) env_map.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), eq + 1);
    const auto cwd = r["cwd"].get<std::string>();
    const auto log = r["log"].get<std::string>();
    const CpuMask cpus(r.value("cpus", std::vector<int>{}));
    const MemPolicy memory(r.value("mem_bind", json()));
    m_report.spawning(rank.rank, env_map.count("GPUQ_EVENTS") ? env_map.at("GPUQ_EVENTS") : "", cwd, log);
    auto path_it = env_map.find("PATH");
    std::string exe = resolve_executable(argv[0], path_it == env_map.end() ? "" : path_it->second, cwd);
    std::string error;
    if (exe.empty()) {
      error = "gpuq: cannot run `" + argv[0] + "`: no such executable (looked in PATH and " + cwd + ")";
    } else {
      try {
        std::vector<std::string> env_strings;
        for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
        std::vector<char*> envp;
        for (auto& e : env_strings) envp.push_back(e.data());
        envp.push_back(nullptr);
        const EnvSetup env{envp.data()};
        std::vector<std::string> args(argv.begin() + 1, argv.end());
        // stdout and stderr go to `output`: the log file, or a pipe the shim copies from.
        const std::string chdir_failed = "gpuq: cannot enter the job's working directory " + cwd + "; not started\n";
        // Its cgroup below the attempt's in each hierarchy, or the attempt's (Cgroups::make made it).
        std::vector<std::string> rank_procs, join_failed;
        for (std::size_t i = 0; i < m_cgroup_dirs.size(); ++i) {
          rank_procs.push_back(i >= m_per_rank.size() || m_per_rank[i]
                                   ? "rank-" + std::to_string(rank.rank) + "/cgroup.procs"
                                   : std::string("cgroup.procs"));
          join_failed.push_back("gpuq: cannot join the rank's cgroup " + m_cgroup_dirs[i] + "/" + rank_procs.back() +
                                " (errno ");
        }
        // stdin: nothing, or a file the doc names (an on_finish hook's job document), opened as
        // the user this process runs as.
        const std::string input = r.value("stdin", std::string());
        auto start = [&](auto&& output) {
          auto child = [&](auto&& in) {
            // Redirections, not a template's brackets:
            // clang-format off
            bp::child c(bp::exe = exe, bp::args = args, env, bp::std_in < in, (bp::std_out & bp::std_err) > output,
                        RankSetup{{}, cwd, chdir_failed, cpus, memory, m_cgroups, rank_procs, join_failed,
                                  m_owner ? &*m_owner : nullptr, ::getpid()},
                        bp::posix::use_vfork);
            // clang-format on
            rank.pid = c.id();
            c.detach();  // reaped below with waitpid(-1), with any orphans
          };
          if (input.empty()) return child(bp::null);
          // In a directory the job's owner can write: no symlink followed, no fifo waited on.
          with_stream(common::open_job_file(input, "its input"), "r", "its input " + input, child);
        };
        const bool reported = m_report.reads_output_of(rank.rank);
        if (m_log_limit > 0 || reported) {
          // Capped log: the rank writes into a pipe, the shim copies it to a rotating LogSink
          // (and, for the rank whose output reports, through the job's patterns).
          LogSink sink(log, m_log_limit);
          if (auto o = sink.open(); !o) throw std::runtime_error(o.error().message);
          bp::pipe pipe;
          start(pipe);
          const int fd = pipe.native_source();
          pipe.assign_source(-1);  // ours now
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
          ::fcntl(fd, F_SETFD, FD_CLOEXEC);
          m_pipes.emplace(fd, std::move(sink));
          if (reported) m_report.watch(fd);
        } else {
          with_stream(open_log(log, false), "a", "the log " + log, start);
        }
      } catch (const std::exception& e) {
        error = std::string("gpuq: cannot start rank: ") + e.what();
      }
    }
    if (rank.pid == 0) {
      if (auto fd = open_log(log, false)) {
        error += "\n";
        [[maybe_unused]] auto n = ::write(*fd, error.data(), error.size());
        ::close(*fd);
      }
      rank.exited = true;
      rank.exit_code = 127;
      m_ranks.push_back(rank);
      note_failure(m_ranks.back());
      return;
    }
    m_ranks.push_back(rank);
    m_ranks_left++;
  }

  // Waits up to `wait_s` for a signal or rank output, copying any output to the logs; returns
  // whether a stop signal (SIGTERM, SIGINT, SIGHUP; SIGUSR1, a preemption) arrived. SIGCHLD just
  // ends the wait.
  bool wait_for_events(double wait_s) {
    std::vector<pollfd> fds{{m_sigfd, POLLIN, 0}};
    for (const auto& [fd, _] : m_pipes) fds.push_back({fd, POLLIN, 0});
    const int timeout_ms = static_cast<int>(wait_s * 1000 + 0.5);
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) {
      m_report.tick();  // what waited for its pace, while the program is silent
      return false;
    }
    bool stop = false;
    signalfd_siginfo info{};
    while (::read(m_sigfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      stop = stop || sig == SIGTERM || sig == SIGINT || sig == SIGHUP || (m_stop_on_urg && sig == SIGURG);
      // A preemption stops an attempt that is not ending already: one whose timeout, failure or
      // end began its teardown ends as that, not as preempted.
      if (sig == SIGUSR1 && !m_stop_on_urg && !m_preempt_file.empty() && !m_tearing_down) m_preempted = stop = true;
      if (sig == SIGURG && m_stop_on_urg && !m_tearing_down && stop_is_preemption()) m_preempted = true;
    }
    std::vector<int> ready;
    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) ready.push_back(fds[i].fd);
    pump_pipes(ready, false);
    m_report.tick();  // what waited for its pace
    return stop;
  }

  // Whether gpuqd holds the attempt frozen (a suspension): its freezer, v2's cgroup.freeze or a v1
  // freezer.state, in the attempt's cgroups (gpuqd's to write, never the job's).
  bool attempt_frozen() const {
    for (const std::string& dir : m_cgroup_dirs)
      for (const char* file : {"/cgroup.freeze", "/freezer.state"}) {
        char state[16] = {};
        const int fd = ::open((dir + file).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        const ssize_t n = ::read(fd, state, sizeof state - 1);
        ::close(fd);
        const std::string_view word(state, n > 0 ? static_cast<std::size_t>(n) : 0);
        if (word.starts_with("1") || word.starts_with("FROZEN") || word.starts_with("FREEZING")) return true;
      }
    return false;
  }

  // A Slurm gang's stop file says `preempt` (gpuqd's preempt(), or the batch script's trap of
  // Slurm's preemption signal), and the launch document says how a preemption goes.
  bool stop_is_preemption() const {
    if (m_stop_file.empty() || m_preempt_file.empty()) return false;
    char word[8] = {};
    const int fd = ::open(m_stop_file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) return false;
    const ssize_t n = ::read(fd, word, sizeof word - 1);
    ::close(fd);
    return n >= 7 && std::string_view(word, 7) == "preempt";
  }

  // Copies what the pipes `fds` hold to their logs; a pipe at EOF is closed. With `drain` (the
  // final pass, every rank gone) each pipe is read to its end.
  void pump_pipes(const std::vector<int>& fds, bool drain) {
    static char buf[1 << 16];
    // The final pass reads for at most 2 s: a process outside the job's tree that holds a pipe
    // (handed it, or opened /proc/<pid>/fd/1) and writes on cannot keep the attempt from ending.
    const double drain_until = mono_now() + 2.0;
    for (int fd : fds) {
      bool done = false;
      int idle_polls = 0;
      for (int rounds = 0; !done && (drain || rounds < 16); ++rounds) {  // bounded: signals stay prompt
        if (drain && mono_now() >= drain_until) {
          done = true;
          break;
        }
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n > 0) {
          m_pipes.at(fd).write(buf, static_cast<std::size_t>(n));
          m_report.output(fd, buf, static_cast<std::size_t>(n));
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else if (n < 0 && errno == EAGAIN) {
          if (!drain) break;
          // Only a process outside the job's tree (handed the pipe) could still hold it open:
          // give it two seconds, then stop reading.
          pollfd one{fd, POLLIN, 0};
          done = ++idle_polls > 20 || ::poll(&one, 1, 100) < 0;
        } else {
          done = true;  // EOF: every writer is gone (or a read error)
        }
      }
      if (done) {
        m_report.closed(fd);
        ::close(fd);
        m_pipes.erase(fd);
      }
    }
  }

  // Collects exited children; returns whether any child (rank or orphan) is still alive.
  bool reap() {
    int status = 0;
    int pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& r : m_ranks) {
        if (r.pid != pid || r.exited) continue;
        r.exited = true;
        m_ranks_left--;
        if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
        else if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
        if (r.exit_code != 0) note_failure(r);
      }
    }
    return pid == 0;  // 0: children remain; -1 (ECHILD): none left
  }

  void note_failure(const Rank& r) {
    if (m_first_failure.is_null() && !m_tearing_down) {
      m_first_failure = {{"rank", r.rank}, {"exit_code", r.exit_code ? json(*r.exit_code) : json()},
                         {"signal", r.signal ? json(*r.signal) : json()}, {"at", wall_now()}};
      // A SIGKILL the shim did not send, while the kernel's OOM-kill count went up: most likely
      // the OOM killer (the count is system-wide, so this is a strong hint, not proof).
      if (r.signal == SIGKILL && m_oom_kills_at_start >= 0 && oom_kills() > m_oom_kills_at_start)
        m_first_failure["oom_kill"] = true;
    }
    if (!m_tearing_down) begin_teardown();
  }

  void begin_teardown() {
    if (m_tearing_down) return;  // a second stop (a cancel after the timeout) keeps the first's grace
    m_tearing_down = true;
    m_kill_at = mono_now() + m_grace_s;
    if (m_preempted) {
      // A preemption: the file the job may test appears first (written as the owner: the job's
      // own attempt directory), then the ranks get the spec's signal and its grace to checkpoint.
      m_first_signal = m_preempt_signal;
      m_kill_at = mono_now() + m_preempt_grace_s;
      const json said = {{"preempted_at", wall_now()}, {"grace_s", m_preempt_grace_s}};
      if (auto w = write_file_atomic(m_preempt_file, said.dump() + "\n"); !w)
        complain("cannot write the preempt file " + m_preempt_file + ": " + w.error().message);
    }
  }

  // The first signal (SIGTERM, or a preemption's) reaches each process group and process once (a
  // handler may be slow to act); SIGKILL
  // is repeated every tick until nothing is left. Only ids that cannot have been reused are
  // signalled (this process may be root): a rank's process group while the rank is not reaped
  // (its zombie holds the id), and children not reaped; what a reaped rank leaves is re-parented
  // here, and signalled as a child.
  void signal_all(int sig) {
    auto signal_once = [&](int target, bool group) {
      if (sig != SIGKILL && !m_termed.insert(group ? -target : target).second) return;
      // A rank's main process leads the group just signalled: it got the signal with its group, and
      // a second one (a second SIGINT or SIGTERM is "quit now" to many programs, and would run a
      // checkpoint handler twice) is not sent.
      if (!group && sig != SIGKILL && m_termed.count(-target) && ::getpgid(target) == target) return;
      group ? ::killpg(target, sig) : ::kill(target, sig);
    };
    for (const auto& r : m_ranks)
      if (r.pid > 0 && !r.exited) signal_once(r.pid, true);  // the rank's process group
    for (int pid : direct_children()) signal_once(pid, false);
  }

  // Writes the exit record, and keeps trying while it cannot be written (a state dir that turned
  // read-only, a full disk): a record missing for good would read as a failure, and the job may
  // have succeeded. Meanwhile gpuqd sees the supervisor alive and the job running. Its own job
  // cannot keep it out: an attempt directory it made unwritable is made the owner's to write
  // again, as this process writes files as the owner. A stop signal (a cancel) ends the trying.
  int record_outcome() {
    const std::string exit_file = m_doc["exit_file"].get<std::string>();
    const std::string dir = exit_file.substr(0, exit_file.rfind('/'));
    double delay_s = 1;
    for (;;) {
      struct stat st {};
      if (::stat(dir.c_str(), &st) == 0 && st.st_uid == files_uid() && (st.st_mode & 0700) != 0700)
        ::chmod(dir.c_str(), (st.st_mode & 07777) | 0700);
      if (write_outcome() == 0) return 0;
      // Said where gpuqd looks (the process's name; the state dir cannot be written): the job's
      // outcome is unknown until this succeeds (local_executor.cpp's detail()).
      ::prctl(PR_SET_NAME, common::k_shim_recording_name, 0, 0, 0);
      if (wait_for_events(delay_s)) return 1;  // stopped: the outcome stays unrecorded
      delay_s = std::min(delay_s * 2, 30.0);
    }
  }

  int write_outcome() {
    if (m_first_failure.is_object()) {  // every rank's output is in its log by now
      const int rank = m_first_failure.value("rank", -1);
      for (const auto& r : m_doc["ranks"])
        if (r.value("rank", -2) == rank && r.contains("log") && r["log"].is_string()) {
          // Its last line, and what its last 64 KiB say went wrong (a traceback or NCCL's
          // watchdog report may follow the line that names the failure).
          const std::string tail = log_tail(r["log"].get<std::string>(), 64 << 10);
          if (auto words = last_words(tail); !words.empty()) m_first_failure["message"] = words;
          if (auto cls = common::classify_failure(tail)) {
            m_first_failure["class"] = cls->name;
            m_first_failure["class_line"] = cls->line;
          }
        }
    }
    json ranks = json::array();
    for (const auto& r : m_ranks)
      ranks.push_back({{"rank", r.rank}, {"pid", r.pid}, {"exit_code", r.exit_code ? json(*r.exit_code) : json()},
                       {"signal", r.signal ? json(*r.signal) : json()}});
    json out = {{"ranks", ranks},         {"first_failure", m_first_failure}, {"cancelled", m_cancelled},
                {"timed_out", m_timed_out}, {"started_at", m_started_at},       {"ended_at", wall_now()}};
    if (m_preempted) out["preempted"] = true;  // said, not trusted: gpuqd knows whom it preempted
    // A rank's last words may be any bytes: invalid UTF-8 becomes U+FFFD, so the record is JSON.
    if (auto w = write_file_atomic(m_doc["exit_file"].get<std::string>(),
                                   out.dump(-1, ' ', false, json::error_handler_t::replace));
        !w) {
      complain(w.error().message);
      return 1;
    }
    return 0;
  }

  // Whose the files this process makes are (its file-system identity).
  uid_t files_uid() const { return m_owner ? m_owner->uid : ::geteuid(); }

  json m_doc;
  bool m_stop_on_urg = false;
  std::string m_stop_file;
  std::vector<int> m_cgroups;  // O_PATH, gpuqd's identity; closed once every rank has joined
  std::vector<std::string> m_cgroup_dirs;
  std::vector<bool> m_per_rank;
  std::optional<Owner> m_owner;
  sigset_t m_signals{};
  std::vector<Rank> m_ranks;
  int m_ranks_left = 0;
  bool m_tearing_down = false, m_killing = false, m_cancelled = false, m_timed_out = false;
  double m_kill_at = 0, m_grace_s = 10, m_started_at = 0;
  json m_first_failure;
  std::set<int> m_termed;        // pids, and -pgids, already sent the first signal
  int m_first_signal = SIGTERM;  // what a stop sends before SIGKILL (a preemption: its preempt_signal)
  // A preemption (SIGUSR1, with the launch document's `preempt`): its signal, grace and file.
  bool m_preempted = false;
  int m_preempt_signal = SIGTERM;
  double m_preempt_grace_s = 30;
  std::string m_preempt_file;
  int m_sigfd = -1;
  std::int64_t m_oom_kills_at_start = -1;
  std::int64_t m_log_limit = 0;  // 0: ranks write their log files directly
  std::map<int, LogSink> m_pipes;  // read end of a rank's output pipe -> its log
  Reporting m_report;              // the job's `report`: its output read through its patterns, its results file
};

std::optional<json> read_launch_document(const std::string& launch_path) {
  g_complaints = common::parent_dir(launch_path) + "/shim.log";
  std::string text;
  const int fd = ::open(launch_path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    complain("cannot read " + launch_path + ": " + (fd < 0 ? std::strerror(errno) : "not a regular file"));
    if (fd >= 0) ::close(fd);
    return std::nullopt;
  }
  // Started by a root gpuqd, the shim takes the user to run as from this file: only one that root
  // wrote counts, never one the job's owner put in its place (their own, or a link to another).
  if (::geteuid() == 0 && (st.st_uid != 0 || st.st_nlink != 1)) {
    ::close(fd);
    complain(launch_path + " is not root's own file; refusing to run it as root");
    return std::nullopt;
  }
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0 && text.size() < (std::size_t{64} << 20);)
    text.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  json doc = json::parse(text, nullptr, false);
  if (!doc.is_object() || !doc.contains("ranks") || !doc["ranks"].is_array() || !doc.contains("exit_file") ||
      !doc.contains("pid_file") || !doc["exit_file"].is_string() || !doc["pid_file"].is_string()) {
    complain(launch_path + " is not a launch document");
    return std::nullopt;
  }
  return doc;
}

// A Slurm variable that holds a number in [0, below), or -1.
int slurm_index(const char* name, long below) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::strlen(v) > 9) return -1;
  for (const char* c = v; *c; ++c)
    if (*c < '0' || *c > '9') return -1;
  const long n = std::atol(v);
  return n < below ? static_cast<int>(n) : -1;
}

}  // namespace

std::string task_path(const std::string& path, int rank) {
  const auto slash = path.rfind('/');
  const auto dot = path.rfind('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  const std::string tag = "-" + std::to_string(rank);
  return has_ext ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

// A launch document's `run_as` (lab mode: gpuqd runs as root, the job as its owner). The shim
// stays root, out of its job's reach as slurmstepd is of a step's tasks: no process of the
// owner's may signal, stop, trace or read it, so the timeout, a cancel, the teardown and the exit
// record hold whatever the job does. It is not dumpable and holds only the small environment gpuqd
// gave it. What it does on the file system it does as the owner (setfsuid/setfsgid, with their
// groups): the files it makes (logs, pid file, exit record) are theirs, and no path the job
// controls (a symlink, a fifo, a directory made unreadable) reaches anything its owner could not
// reach. Only the ranks take the owner's identity, for good (Owner::become). `owner` is set to
// whom the ranks run as (left empty: as this process runs); false, said in shim.log, when the
// document's run_as is unusable or this process cannot act for that user.
bool take_owners_files(const json& doc, std::optional<Owner>& owner) {
  const auto it = doc.find("run_as");
  if (it == doc.end()) return true;
  const auto& who = *it;
  if (!who.is_object() || !who.value("uid", json()).is_number_unsigned() || !who.value("gid", json()).is_number_unsigned() ||
      !who.value("groups", json()).is_array()) {
    complain("the launch document's run_as is not {uid, gid, groups}");
    return false;
  }
  Owner o;
  o.uid = who["uid"].get<uid_t>();
  o.gid = who["gid"].get<gid_t>();
  for (const auto& g : who["groups"])
    if (g.is_number_unsigned()) o.groups.push_back(g.get<gid_t>());
  if (::geteuid() != 0) {  // not root: it can only be already the user it is to be
    if (::getuid() == o.uid) return true;
    complain("asked to run the job as uid " + std::to_string(o.uid) + ", but the shim runs as uid " +
             std::to_string(::getuid()) + ", not root");
    return false;
  }
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // a change of file-system identity clears it too; said, not implied
  const std::string who_s = "uid " + std::to_string(o.uid) + " (gid " + std::to_string(o.gid) + ")";
  // setfsuid answers with the identity before the call: a second call shows whether the first took.
  if (::setgroups(o.groups.size(), o.groups.data()) != 0 ||
      (::setfsgid(o.gid), ::setfsgid(o.gid)) != static_cast<int>(o.gid) ||
      (::setfsuid(o.uid), ::setfsuid(o.uid)) != static_cast<int>(o.uid)) {
    complain("cannot act on files as " + who_s + ": " + std::strerror(errno));
    return false;
  }
  ::umask(027);  // the job's files: its owner's, readable by the admin group its directory has
  o.cannot = "gpuq: cannot become " + who_s + "; not started\n";
  owner = std::move(o);
  return true;
}

int run_supervisor(const std::string& launch_path, const std::vector<std::string>& cgroups,
                   const std::vector<bool>& per_rank) {
  auto doc = read_launch_document(launch_path);
  if (!doc) return 2;
  // Opened with gpuqd's identity (root in lab mode), before this process acts as the job's owner:
  // each rank joins `rank-R` below each between fork and exec, before it takes the owner's
  // identity, and holds no descriptor of them once it runs (close-on-exec). One descriptor a
  // hierarchy, however many ranks.
  std::vector<int> dirs;
  const auto close_all = [&] {
    for (int fd : dirs)
      ::close(fd);
  };
  for (const auto& cgroup : cgroups) {
    const int fd = ::open(cgroup.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      complain("cannot open the attempt's cgroup " + cgroup + ": " + std::strerror(errno));
      close_all();
      return 2;
    }
    dirs.push_back(fd);
  }
  std::optional<Owner> owner;
  if (!take_owners_files(*doc, owner)) {
    close_all();
    return 2;
  }
  try {
    Supervisor attempt(std::move(*doc), false, "", std::move(dirs), cgroups, std::move(owner), per_rank);
    const int written = attempt.run();
    return written != 0 ? written : attempt.succeeded() ? 0 : 1;
  } catch (const std::exception& e) {
    complain(e.what());
    return 2;
  }
}

int run_slurm_task(const std::string& launch_path) {
  auto doc = read_launch_document(launch_path);
  if (!doc) return 2;
  json& ranks = (*doc)["ranks"];
  const int rank = slurm_index("SLURM_PROCID", static_cast<long>(ranks.size()));
  if (rank < 0) {
    complain("--slurm-task: SLURM_PROCID is not a rank of " + launch_path + " (" + std::to_string(ranks.size()) +
             " ranks); gpuq-shim --slurm-task runs under srun");
    return 2;
  }
  try {
    json mine;
    for (auto& r : ranks)
      if (r.is_object() && r.value("rank", -1) == rank) mine = std::move(r);
    if (!mine.is_object() || !mine.contains("env") || !mine["env"].is_object()) {
      complain(launch_path + " has no rank " + std::to_string(rank));
      return 2;
    }
    // Where Slurm placed this task (a cluster's distribution may differ from block order).
    json& env = mine["env"];
    if (env.contains("RANK")) {
      env["RANK"] = env["ROLE_RANK"] = std::to_string(rank);
      if (const int local = slurm_index("SLURM_LOCALID", 1 << 20); local >= 0) env["LOCAL_RANK"] = std::to_string(local);
      if (const int node = slurm_index("SLURM_NODEID", 1 << 20); node >= 0) env["GROUP_RANK"] = std::to_string(node);
    }
    ranks = json::array({std::move(mine)});
    (*doc)["pid_file"] = task_path((*doc)["pid_file"].get<std::string>(), rank);
    (*doc)["exit_file"] = task_path((*doc)["exit_file"].get<std::string>(), rank);
    const std::string stop_file = common::parent_dir(launch_path) + "/" + common::k_stop_file;
    Supervisor task(std::move(*doc), true, stop_file);
    const int written = task.run();
    return written != 0 ? written : task.rank_failed() ? 1 : 0;
  } catch (const std::exception& e) {
    complain(e.what());
    return 2;
  }
}

int slurm_gang_outcome(const std::string& launch_path) {
  auto doc = read_launch_document(launch_path);
  if (!doc) return 2;
  const std::string exit_file = (*doc)["exit_file"].get<std::string>();
  const std::size_t ranks = (*doc)["ranks"].size();
  for (std::size_t r = 0; r < ranks; ++r) {
    auto read = common::read_untrusted_file(task_path(exit_file, static_cast<int>(r)), 64 << 10, "a rank's exit record");
    if (!read) return 1;  // a rank whose supervisor left no record did not succeed
    const json& record = *read;
    if (!record.is_object() || record.value("cancelled", true) || record.value("timed_out", true) ||
        !record.value("first_failure", json()).is_null() || !record.value("ranks", json()).is_array())
      return 1;
    for (const auto& rank : record["ranks"])
      if (!rank.is_object() || rank.value("exit_code", json()) != json(0)) return 1;
  }
  return ranks > 0 ? 0 : 1;
}

}  // namespace gpuq::supervisor
