// Launch documents, environments and supervisor spawning (see launcher.hpp).
#include "daemon/launcher.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/command.hpp"
#include "common/json_input.hpp"
#include "supervisor/boost_process.hpp"
#include "supervisor/serve.hpp"

namespace gpuq::daemon {

std::string job_dir(const std::string& state_dir, std::int64_t id) {
  return state_dir + "/jobs/" + std::to_string(id);
}

std::string attempt_dir(const std::string& state_dir, std::int64_t id, int attempt) {
  return job_dir(state_dir, id) + "/attempt-" + std::to_string(attempt);
}

std::string rank_log_path(const std::string& dir, int rank) { return dir + "/rank-" + std::to_string(rank) + ".log"; }
std::string rank_events_path(const std::string& dir, int rank) {
  return dir + "/events-" + std::to_string(rank) + ".jsonl";
}
std::string preempt_file_path(const std::string& dir) {
  return dir + "/preempt";
}
bool launched_with_preempt(const std::string& dir) {
  // The attempt's directory is the job's to write: a regular file only (a FIFO there would block
  // gpuqd's thread), no symlink, bounded.
  const auto text = common::read_job_file(dir + "/launch.json", 8 << 20, "the attempt's launch document");
  return text && text->find("\"preempt\":{") != std::string::npos;
}
std::string rank_report_path(const std::string& dir, int rank) {
  return dir + "/report-" + std::to_string(rank) + ".jsonl";
}

namespace {

Result<bool> made(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0 || errno == EEXIST) return true;
  return Error{ErrorCode::internal, "cannot create directory " + dir + ": " + std::strerror(errno)};
}

// `dir` as gpuqd's own, mode 0711.
Result<bool> passable_dir(const std::string& dir) {
  if (auto m = made(dir); !m) return m;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
    return Error{ErrorCode::forbidden, dir + " is not a directory of gpuqd's own; refusing to use it"};
  if ((st.st_mode & 07777) != 0711 && ::chmod(dir.c_str(), 0711) != 0)
    return Error{ErrorCode::internal, "cannot set the mode of " + dir + ": " + std::strerror(errno)};
  return true;
}

// `dir` as `owner`'s, in `group`.
Result<bool> owned_dir(const std::string& dir, uid_t owner, gid_t group, mode_t mode) {
  if (auto m = made(dir); !m) return m;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return Error{ErrorCode::internal, "cannot open " + dir + ": " + std::strerror(err)};
  }
  Result<bool> out = true;
  if (st.st_uid == ::geteuid() && st.st_uid != owner) {
    if (::fchown(fd, owner, group) != 0 || ::fchmod(fd, mode) != 0)
      out = Error{ErrorCode::internal, "cannot hand " + dir + " to uid " + std::to_string(owner) + ": " + std::strerror(errno)};
  } else if (st.st_uid != owner) {
    out = Error{ErrorCode::forbidden, dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to the job's owner"};
  }
  ::close(fd);
  return out;
}

}  // namespace

Result<bool> make_owned_dirs(const std::string& state_dir, std::int64_t id, int attempt, uid_t owner,
                             std::optional<gid_t> group, gid_t owner_gid) {
  for (const auto& dir : {state_dir + "/jobs", job_dir(state_dir, id)})
    if (auto ok = passable_dir(dir); !ok) return ok;
  const mode_t mode = group ? 02750 : 0700;
  for (const auto& dir : {attempt_dir(state_dir, id, attempt), job_dir(state_dir, id) + "/checkpoints"})
    if (auto ok = owned_dir(dir, owner, group.value_or(owner_gid), mode); !ok) return ok;
  return true;
}

Result<bool> make_owned_subdir(const std::string& state_dir, std::int64_t id, const std::string& name, uid_t owner,
                               std::optional<gid_t> group, gid_t owner_gid) {
  for (const auto& dir : {state_dir + "/jobs", job_dir(state_dir, id)})
    if (auto ok = passable_dir(dir); !ok) return ok;
  return owned_dir(job_dir(state_dir, id) + "/" + name, owner, group.value_or(owner_gid), group ? 02750 : 0700);
}

Env rank_environment(const JobRecord& job, const Env& base_env, const std::vector<std::string>& gpu_uuids,
                     const std::string& jdir, const std::string& adir, int rank, const std::vector<int>& cores) {
  Env env = base_env;
  for (const auto& [k, v] : job.spec.env) env[k] = v;

  std::string visible, uuids;
  for (std::size_t i = 0; i < job.run.gpus.size(); ++i) {
    visible += (i ? "," : "") + std::to_string(job.run.gpus[i]);
    if (i < gpu_uuids.size()) uuids += (i ? "," : "") + gpu_uuids[i];
  }
  // NVML and CUDA agree on numbering only in PCI bus order; indices here are NVML's.
  env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  env["CUDA_VISIBLE_DEVICES"] = visible;  // empty: no GPU (CUDA sees none)
  env["GPUQ_GPU_UUIDS"] = uuids;
  env["GPUQ_JOB_ID"] = std::to_string(job.id);
  env["GPUQ_JOB_NAME"] = job.spec.name;
  env["GPUQ_JOB_DIR"] = jdir;
  env["GPUQ_CHECKPOINT_DIR"] = jdir + "/checkpoints";
  env["GPUQ_ATTEMPT"] = std::to_string(job.attempt);
  env["GPUQ_EVENTS"] = rank_events_path(adir, rank);
  // Appears when the job is preempted (its supervisor writes it before the preemption's signal).
  env["GPUQ_PREEMPT_FILE"] = preempt_file_path(adir);
  // The job's share of each GPU, for programs that size themselves to it (gpuq-worker does): its
  // budget, raised where gpuq raised it.
  if (gpu_budget_mb(job) > 0) env["GPUQ_GPU_MEMORY_MB"] = std::to_string(gpu_budget_mb(job));
  if (!cores.empty()) {
    // As Slurm's --cpus-per-task: OpenMP (and so PyTorch's intra-op pool) sizes itself to the
    // rank's cores instead of every core of the machine.
    env["GPUQ_CPUS"] = common::format_cpu_list(cores);
    if (!job.spec.env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = std::to_string(cores.size());
  }

  if (job.spec.mode == common::Mode::ddp) {
    // The ranks lie in node order, `per_node` on each, as srun's block distribution lays them
    // (one node here; under Slurm the rank's own supervisor takes Slurm's word for where it is).
    const std::string world = std::to_string(job.spec.ranks);
    const int nodes = std::max(1, job.spec.nodes), per_node = std::max(1, job.spec.ranks / nodes);
    env["RANK"] = std::to_string(rank);
    env["LOCAL_RANK"] = std::to_string(rank % per_node);
    env["WORLD_SIZE"] = world;
    env["LOCAL_WORLD_SIZE"] = std::to_string(per_node);
    env["GROUP_RANK"] = std::to_string(rank / per_node);
    env["GROUP_WORLD_SIZE"] = std::to_string(nodes);
    env["ROLE_RANK"] = std::to_string(rank);
    env["ROLE_WORLD_SIZE"] = world;
    env["ROLE_NAME"] = "default";
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(job.run.master_port);
    // torchrun's count is of restarts within this run, as its max is: since submission or `restart`.
    env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(std::max(0, job.attempt - job.attempt_base - 1));
    env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(job.spec.retries);
    env["TORCHELASTIC_RUN_ID"] = "gpuq-" + std::to_string(job.id);
    env["TORCHELASTIC_ERROR_FILE"] = adir + "/error-" + std::to_string(rank) + ".json";
    // torchrun's agent hosts the rendezvous store and tells the workers so ("True": rank 0
    // connects to it instead of hosting one). gpuq runs no agent: rank 0 hosts it, as env:// does.
    env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
    // As torchrun: NCCL errors abort the collective instead of hanging the survivors (torch 2.2
    // renamed the variable; both are set, so every torch reads it, and the new name, read first,
    // keeps newer ones from warning about the old), and several ranks on one node do not
    // oversubscribe the cores with OpenMP threads.
    for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"})
      if (!env.count(name)) env[name] = "1";
    if (!env.count("OMP_NUM_THREADS") && job.spec.ranks > 1) env["OMP_NUM_THREADS"] = "1";
  }
  return env;
}

std::vector<std::vector<int>> rank_cores(const JobRecord& job, const std::vector<int>& cores) {
  const int n = job.spec.mode == common::Mode::ddp ? job.spec.ranks : 1;
  if (job.spec.cpus <= 0 || job.run.cpu_slots.empty() || cores.empty()) return {};
  std::vector<std::vector<int>> out(n);
  const std::size_t slots = job.run.cpu_slots.size();
  for (int r = 0; r < n; ++r) {
    std::set<int> mine;
    for (int k = 0; k < job.spec.cpus && mine.size() < slots; ++k) {
      const int slot = job.run.cpu_slots[(static_cast<std::size_t>(r) * job.spec.cpus + k) % slots];
      mine.insert(cores[static_cast<std::size_t>(slot) % cores.size()]);
    }
    out[r].assign(mine.begin(), mine.end());
  }
  return out;
}

std::vector<int> job_cores(const JobRecord& job, const std::vector<int>& cores) {
  std::set<int> all;
  for (const auto& rank : rank_cores(job, cores)) all.insert(rank.begin(), rank.end());
  return {all.begin(), all.end()};
}

std::vector<int> numa_nodes_of(const std::vector<int>& subset, const std::vector<int>& cores,
                               const std::vector<int>& core_nodes) {
  std::set<int> nodes;
  for (int core : subset) {
    const auto it = std::find(cores.begin(), cores.end(), core);
    const auto i = static_cast<std::size_t>(it - cores.begin());
    if (it == cores.end() || i >= core_nodes.size() || core_nodes[i] < 0) return {};
    nodes.insert(core_nodes[i]);
  }
  return {nodes.begin(), nodes.end()};
}

std::vector<int> slots_on_cores(const std::vector<int>& job_cores, const std::vector<int>& cores, int total) {
  std::vector<int> out;
  if (cores.empty()) return out;
  const std::set<int> wanted(job_cores.begin(), job_cores.end());
  for (int s = 0; s < total; ++s)
    if (wanted.count(cores[static_cast<std::size_t>(s) % cores.size()])) out.push_back(s);
  return out;
}

std::vector<int> usable_cores() {
  std::vector<int> out;
  // Machines with more CPUs than a cpu_set_t holds: grow the mask until the kernel accepts it.
  for (int ncpu = CPU_SETSIZE; ncpu <= (1 << 20); ncpu *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpu);
    const std::size_t size = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(size, set);
    const bool ok = ::sched_getaffinity(0, size, set) == 0;
    if (ok)
      for (int c = 0; c < ncpu; ++c)
        if (CPU_ISSET_S(c, size, set)) out.push_back(c);
    CPU_FREE(set);
    if (ok || errno != EINVAL) break;
  }
  if (out.empty()) out.push_back(0);
  return out;
}

int omp_share(const common::JobSpec& spec, int cores, int machine_gpus, std::int64_t gpu_total_mb) {
  if (spec.cpus > 0) return 0;
  if (spec.gpus <= 0 || machine_gpus <= 0 || cores <= 0) return 1;
  const int ranks = spec.mode == common::Mode::ddp ? std::max(1, spec.ranks) : 1;
  double share = static_cast<double>(cores) * (static_cast<double>(spec.gpus) / ranks) / machine_gpus;
  if (spec.shared && spec.gpu_memory_mb > 0 && gpu_total_mb > 0)
    share *= std::min(1.0, static_cast<double>(spec.gpu_memory_mb) / static_cast<double>(gpu_total_mb));
  return std::max(1, static_cast<int>(share));
}

nlohmann::json launch_document(const JobRecord& job, const Env& base_env, const std::vector<std::string>& gpu_uuids,
                               const std::string& state_dir, double grace_s, std::int64_t log_limit_bytes,
                               const std::vector<int>& cores, const std::vector<int>& core_nodes, const RunsAs& runs_as) {
  const std::string jdir = job_dir(state_dir, job.id);
  const std::string adir = attempt_dir(state_dir, job.id, job.attempt);
  nlohmann::json ranks = nlohmann::json::array();
  const int n = job.spec.mode == common::Mode::ddp ? job.spec.ranks : 1;
  const auto pinned = rank_cores(job, cores);
  for (int r = 0; r < n; ++r) {
    const std::vector<int> mine = pinned.empty() ? std::vector<int>{} : pinned[r];
    Env env = rank_environment(job, base_env, gpu_uuids, jdir, adir, r, mine);
    if (runs_as.inherit_env)
      for (const char* name : {"CUDA_VISIBLE_DEVICES", "GPUQ_GPU_UUIDS", "MASTER_ADDR", "MASTER_PORT"}) env.erase(name);
    if (mine.empty() && runs_as.omp_threads > 0 && !env.count("OMP_NUM_THREADS"))
      env["OMP_NUM_THREADS"] = std::to_string(runs_as.omp_threads);
    if (const common::Account* a = runs_as.account) {
      env["HOME"] = a->home;
      env["USER"] = a->name;
      env["LOGNAME"] = a->name;
      env["SHELL"] = a->shell;
    }
    nlohmann::json rank = {{"rank", r},
                           {"argv", job.spec.command},
                           {"env", std::move(env)},
                           {"cwd", job.spec.cwd},
                           {"log", rank_log_path(adir, r)}};
    if (!mine.empty()) rank["cpus"] = mine;
    if (!mine.empty() && job.spec.mem_bind != common::MemBind::none)
      rank["mem_bind"] = {{"policy", common::to_string(job.spec.mem_bind)},
                          {"nodes", numa_nodes_of(mine, cores, core_nodes)}};
    ranks.push_back(std::move(rank));
  }
  nlohmann::json doc = {{"job_id", job.id},
                        {"attempt", job.attempt},
                        {"timeout_s", job.spec.timeout_s},
                        {"grace_s", grace_s},
                        {"log_limit_bytes", log_limit_bytes},
                        {"ranks", ranks},
                        {"pid_file", adir + "/shim.pid"},
                        {"exit_file", adir + "/exit.json"}};
  if (runs_as.inherit_env) doc["inherit_env"] = true;
  if (const auto& r = job.spec.report; !r.empty())  // read by the supervisor (supervisor/output_report.hpp)
    doc["report"] = {{"progress", r.progress}, {"result", r.result}, {"rank", r.rank}, {"file", r.file}};
  if (const common::Account* a = runs_as.account)
    doc["run_as"] = {{"uid", a->uid}, {"gid", a->gid}, {"groups", a->groups}, {"user", a->name}};
  return doc;
}

namespace {
// Runs in the child before exec: a new session detaches the supervisor from the daemon's
// terminal and process group, so signals aimed at the daemon never reach jobs. The child is
// created with vfork (no copy of the daemon's page tables), so this may only make system calls.
// `keep` (the supervisors' server's end of its socket pair) becomes descriptor 3, kept across exec.
struct NewSession : bp::extend::handler {
  int keep = -1;
  template <class Executor>
  void on_exec_setup(Executor&) const {
    ::setsid();
    mark_inherited_fds_cloexec();
    common::restore_children_descriptor_limit();
    if (keep >= 0 && (keep == 3 ? ::fcntl(3, F_SETFD, 0) != 0 : ::dup2(keep, 3) != 3)) ::_exit(127);
  }
};
}  // namespace

Result<bool> SupervisorServer::launch() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    return Error{ErrorCode::internal, std::string("cannot make the supervisors' socket: ") + std::strerror(errno)};
  const std::vector<std::string> env = common::supervisor_environment();
  std::vector<char*> envp;
  for (const auto& e : env)
    envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  try {
    // The last argument is room for a supervisor's command line, `gpuq-shim DIR/launch.json`
    // (supervisor::CommandLine): a path as long as the kernel takes.
    const std::vector<std::string> args{"--serve", "3", std::string(PATH_MAX + 16, '.')};
    bp::child c(bp::exe = m_shim, bp::args = args, bp::std_in<bp::null, (bp::std_out & bp::std_err)> bp::null,
                NewSession{{}, pair[1]}, EnvSetup{envp.data()}, bp::posix::use_vfork);
    m_pid = c.id();
    c.detach();  // reaped by end()
  } catch (const std::exception& e) {
    ::close(pair[0]);
    ::close(pair[1]);
    return Error{ErrorCode::internal, "cannot start " + m_shim + " --serve: " + e.what()};
  }
  ::close(pair[1]);
  m_sock = pair[0];
  return true;
}

void SupervisorServer::end() {
  if (m_sock >= 0) ::close(m_sock);  // it ends on reading that
  m_sock = -1;
  if (m_pid > 0) {
    ::kill(m_pid, SIGKILL);  // one that stopped answering; what it started is not touched
    m_dead.push_back(m_pid);
  }
  m_pid = 0;
  std::erase_if(m_dead, [](int pid) { return ::waitpid(pid, nullptr, WNOHANG) != 0; });
}

Result<SupervisorServer::Started> SupervisorServer::start(const std::string& adir,
                                                          const std::vector<AttemptCgroup>& cgroups) {
  const auto now = std::chrono::steady_clock::now();
  if (now < m_rest_until) return Error{ErrorCode::unavailable, "the supervisors' server is resting after failing"};
  nlohmann::json request = {{"launch", adir + "/launch.json"}, {"cgroups", nlohmann::json::array()}};
  for (const auto& c : cgroups)
    request["cgroups"].push_back({c.dir, c.per_rank});
  std::string text;
  try {
    text = request.dump();  // strict: a path that is not UTF-8 is exec'd as it is, not mangled
  } catch (const std::exception&) {
    return Error{ErrorCode::internal, "an attempt's paths are not UTF-8, which the supervisors' server takes"};
  }
  const auto deadline = now + std::chrono::milliseconds(k_answer_ms);
  Error failed{ErrorCode::unavailable, ""};
  for (int tries = 0; tries < 2; ++tries) {
    if (m_sock < 0)
      if (auto l = launch(); !l) {
        failed = l.error();
        break;
      }
    auto started = ask(text, deadline);
    if (started || started.error().code != ErrorCode::unavailable) return started;
    failed = started.error();
    end();  // it died or hung: a new one (nothing it forked for this request goes on)
  }
  m_rest_until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(k_rest_s));
  return failed;
}

// unavailable: the server is gone or did not answer; internal: it answered that it could not.
Result<SupervisorServer::Started> SupervisorServer::ask(const std::string& request,
                                                        std::chrono::steady_clock::time_point deadline) {
  if (::send(m_sock, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()))
    return Error{ErrorCode::unavailable,
                 std::string("the supervisors' server took no request: ") + std::strerror(errno)};
  pollfd p{m_sock, POLLIN, 0};
  int ready = 0;
  do {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0)
    return Error{ErrorCode::unavailable,
                 "the supervisors' server did not answer within " + std::to_string(k_answer_ms) + " ms"};
  supervisor::Received got = supervisor::receive(m_sock, MSG_DONTWAIT);
  std::vector<int>& fds = got.fds;  // the child's go-ahead, then its pidfd where the server had one
  const auto close_all = [&] {
    for (int fd : fds)
      ::close(fd);
  };
  if (got.size <= 0) return Error{ErrorCode::unavailable, "the supervisors' server ended"};
  const auto answer = got.cut ? nlohmann::json() : nlohmann::json::parse(got.text, nullptr, false);
  const auto pid = answer.is_object() ? answer.value("pid", nlohmann::json()) : nlohmann::json();
  const bool with_pidfd = answer.is_object() && answer.value("pidfd", false);
  if (!pid.is_number_integer() || pid.get<long long>() <= 0 || fds.size() != (with_pidfd ? 2u : 1u)) {
    close_all();  // a child waiting for its go-ahead ends at that
    const auto why = answer.is_object() ? answer.value("error", nlohmann::json()) : nlohmann::json();
    return Error{ErrorCode::internal, "the supervisors' server could not start one: " +
                                          (why.is_string() ? why.get<std::string>() : std::string("no answer"))};
  }
  // The go-ahead: from here the supervisor is the caller's to watch.
  const bool went = ::write(fds[0], "g", 1) == 1;
  ::close(fds[0]);
  Started s;
  const auto started = answer.value("start_time", nlohmann::json());
  s.pid = {pid.get<int>(), started.is_number_unsigned() ? started.get<std::uint64_t>() : 0};
  s.pidfd = with_pidfd ? fds[1] : -1;
  if (!went) {  // it is gone already: its pidfd says so
    if (s.pidfd < 0) return Error{ErrorCode::internal, "the supervisor the server forked ended before it began"};
  }
  return s;
}

std::string raise_descriptor_limit() {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return std::string("cannot read the descriptor limit: ") + std::strerror(errno);
  if (l.rlim_cur >= l.rlim_max) return "";
  const rlim_t before = l.rlim_cur;
  // An unlimited hard limit is not a number to allocate tables by: 1,048,576 is the kernel's default nr_open.
  l.rlim_cur = l.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(before, 1 << 20) : l.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &l) != 0)
    return "cannot raise the descriptor limit from " + std::to_string(before) + ": " + std::strerror(errno);
  common::set_children_descriptor_limit(before);  // supervisors, Slurm's commands, the jobs sbatch submits
  return "descriptor limit raised from " + std::to_string(before) + " to " + std::to_string(l.rlim_cur) +
         " (jobs get " + std::to_string(before) + ")";
}

Descriptors descriptors() {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return {};
  const long limit = static_cast<long>(l.rlim_cur);
  const long reserved = std::min(64L, limit / 4);
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) {  // out of descriptors is the case this is for: none free, not unknown
    if (errno == EMFILE || errno == ENFILE) return {0, reserved};
    return {};
  }
  long open = -1;  // the directory's own descriptor is in the listing
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++open;
  ::closedir(d);
  return {limit - open, reserved};
}

Result<int> spawn_supervisor(const std::string& shim_path, const std::string& adir,
                             const std::vector<AttemptCgroup>& cgroups) {
  // Its own small environment, not gpuqd's (common::supervisor_environment).
  const std::vector<std::string> env = common::supervisor_environment();
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  try {
    std::vector<std::string> args{adir + "/launch.json"};
    for (const auto& cgroup : cgroups)
      args.insert(args.end(), {cgroup.per_rank ? "--cgroup" : "--cgroup-whole", cgroup.dir});
    bp::child c(bp::exe = shim_path, bp::args = args, bp::std_in<bp::null, (bp::std_out & bp::std_err)> bp::null,
                NewSession{}, EnvSetup{envp.data()}, bp::posix::use_vfork);
    int pid = c.id();
    c.detach();  // the daemon reaps it through its pidfd, or init does after a daemon restart
    return pid;
  } catch (const std::exception& e) {
    return Error{ErrorCode::internal, "cannot start the job supervisor " + shim_path + ": " + e.what()};
  }
}

int pick_free_port(const std::set<int>& in_use) {
  for (int tries = 0; tries < 64; ++tries) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.sin_port);
    ::close(fd);
    if (port && !in_use.count(port)) return port;
  }
  return 0;
}

}  // namespace gpuq::daemon
