// Launch documents, environments and supervisor spawning (see launcher.hpp).
#include "daemon/launcher.hpp"

#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/json_input.hpp"
#include "daemon/boost_process.hpp"

namespace gpuq::daemon {

double wall_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

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

Env rank_environment(const JobRecord& job, const Env& base_env, const std::vector<std::string>& gpu_uuids,
                     const std::string& jdir, const std::string& adir, int rank, const std::vector<int>& cores) {
  Env env = base_env;
  for (const auto& [k, v] : job.spec.env) env[k] = v;

  std::string visible, uuids;
  for (std::size_t i = 0; i < job.gpus.size(); ++i) {
    visible += (i ? "," : "") + std::to_string(job.gpus[i]);
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
  // The job's share of each GPU, for programs that size themselves to it (gpuq-worker does).
  if (job.spec.gpu_memory_mb > 0) env["GPUQ_GPU_MEMORY_MB"] = std::to_string(job.spec.gpu_memory_mb);
  if (!cores.empty()) {
    // As Slurm's --cpus-per-task: OpenMP (and so PyTorch's intra-op pool) sizes itself to the
    // rank's cores instead of every core of the machine.
    env["GPUQ_CPUS"] = common::format_cpu_list(cores);
    if (!job.spec.env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = std::to_string(cores.size());
  }

  if (job.spec.mode == common::Mode::ddp) {
    const std::string world = std::to_string(job.spec.ranks);
    env["RANK"] = std::to_string(rank);
    env["LOCAL_RANK"] = std::to_string(rank);
    env["WORLD_SIZE"] = world;
    env["LOCAL_WORLD_SIZE"] = world;
    env["GROUP_RANK"] = "0";
    env["GROUP_WORLD_SIZE"] = "1";
    env["ROLE_RANK"] = std::to_string(rank);
    env["ROLE_WORLD_SIZE"] = world;
    env["ROLE_NAME"] = "default";
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(job.master_port);
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
  if (job.spec.cpus <= 0 || job.cpu_slots.empty() || cores.empty()) return {};
  std::vector<std::vector<int>> out(n);
  const std::size_t slots = job.cpu_slots.size();
  for (int r = 0; r < n; ++r) {
    std::set<int> mine;
    for (int k = 0; k < job.spec.cpus && mine.size() < slots; ++k) {
      const int slot = job.cpu_slots[(static_cast<std::size_t>(r) * job.spec.cpus + k) % slots];
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

nlohmann::json launch_document(const JobRecord& job, const Env& base_env, const std::vector<std::string>& gpu_uuids,
                               const std::string& state_dir, double grace_s, std::int64_t log_limit_bytes,
                               const std::vector<int>& cores, const std::vector<int>& core_nodes) {
  const std::string jdir = job_dir(state_dir, job.id);
  const std::string adir = attempt_dir(state_dir, job.id, job.attempt);
  nlohmann::json ranks = nlohmann::json::array();
  const int n = job.spec.mode == common::Mode::ddp ? job.spec.ranks : 1;
  const auto pinned = rank_cores(job, cores);
  for (int r = 0; r < n; ++r) {
    const std::vector<int> mine = pinned.empty() ? std::vector<int>{} : pinned[r];
    nlohmann::json rank = {{"rank", r},
                           {"argv", job.spec.command},
                           {"env", rank_environment(job, base_env, gpu_uuids, jdir, adir, r, mine)},
                           {"cwd", job.spec.cwd},
                           {"log", rank_log_path(adir, r)}};
    if (!mine.empty()) rank["cpus"] = mine;
    if (!mine.empty() && job.spec.mem_bind != common::MemBind::none)
      rank["mem_bind"] = {{"policy", common::to_string(job.spec.mem_bind)},
                          {"nodes", numa_nodes_of(mine, cores, core_nodes)}};
    ranks.push_back(std::move(rank));
  }
  return {{"job_id", job.id},
          {"attempt", job.attempt},
          {"timeout_s", job.spec.timeout_s},
          {"grace_s", grace_s},
          {"log_limit_bytes", log_limit_bytes},
          {"ranks", ranks},
          {"pid_file", adir + "/shim.pid"},
          {"exit_file", adir + "/exit.json"}};
}

std::string resolve_executable(const std::string& name, const std::string& path_env, const std::string& cwd) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    // access() alone says yes to root for any file; require an execute bit as exec does.
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    std::string p = name[0] == '/' ? name : cwd + "/" + name;
    return executable(p) ? p : "";
  }
  std::stringstream dirs(path_env.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_env);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) dir = ".";
    std::string p = (dir[0] == '/' ? dir : cwd + "/" + dir) + "/" + name;
    if (executable(p)) return p;
  }
  return "";
}

Result<bool> write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Error{ErrorCode::store_error, "cannot write " + tmp + ": " + std::strerror(errno)};
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Error{ErrorCode::store_error, "cannot write " + tmp + ": " + std::strerror(err)};
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error{ErrorCode::store_error, "cannot write " + path + ": " + std::strerror(err)};
  }
  return true;
}

void mark_inherited_fds_cloexec() {
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  // Kernels before 5.11: walk the descriptor table.
  for (int fd = 3, max = static_cast<int>(::sysconf(_SC_OPEN_MAX)); fd < max && fd < 65536; ++fd) {
    int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

namespace {
// Runs in the child before exec: a new session detaches the supervisor from the daemon's
// terminal and process group, so signals aimed at the daemon never reach jobs. The child is
// created with vfork (no copy of the daemon's page tables), so this may only make system calls.
struct NewSession : bp::extend::handler {
  template <class Executor>
  void on_exec_setup(Executor&) const {
    ::setsid();
    mark_inherited_fds_cloexec();
  }
};
}  // namespace

Result<int> spawn_supervisor(const std::string& shim_path, const std::string& adir) {
  try {
    bp::child c(bp::exe = shim_path, bp::args = {adir + "/launch.json"}, bp::std_in<bp::null,
                (bp::std_out & bp::std_err) > adir + "/shim.log", NewSession{}, bp::posix::use_vfork);
    int pid = c.id();
    c.detach();  // the daemon reaps it through its pidfd, or init does after a daemon restart
    return pid;
  } catch (const std::exception& e) {
    return Error{ErrorCode::internal, "cannot start the job supervisor " + shim_path + ": " + e.what()};
  }
}

std::optional<std::vector<std::string>> proc_stat_fields(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return std::nullopt;
  std::istringstream rest(stat.substr(close + 2));
  std::vector<std::string> fields;
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

std::optional<std::uint64_t> process_start_time(int pid) {
  auto fields = proc_stat_fields(pid);
  if (!fields || fields->size() <= 22 - 3) return std::nullopt;
  return std::stoull((*fields)[22 - 3]);  // field 22: starttime
}

std::optional<ProcessId> read_pid_file(const std::string& path) {
  // In the job's directory, so the job could have written it: checked like any input.
  auto j = common::read_untrusted_file(path, 4096, "pid file");
  if (!j || !j->is_object()) return std::nullopt;
  const auto pid = j->find("pid"), start = j->find("start_time");
  if (pid == j->end() || start == j->end() || !pid->is_number_unsigned() || !start->is_number_unsigned() ||
      pid->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<int>::max()) || pid->get<std::uint64_t>() == 0)
    return std::nullopt;
  return ProcessId{pid->get<int>(), start->get<std::uint64_t>()};
}

bool is_alive(const ProcessId& p) {
  auto st = process_start_time(p.pid);
  return st && *st == p.start_time;
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
