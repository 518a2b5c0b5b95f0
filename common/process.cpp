// Processes and files, for gpuqd and gpuq-shim alike (see process.hpp).
#include "common/process.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/json_input.hpp"

namespace gpuq::common {

double wall_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
}

std::string resolve_executable(const std::string& name, const std::string& path_env, const std::string& cwd) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    // access() alone says yes to root for any file; require an execute bit as exec does.
    // AT_EACCESS: as the thread's file-system identity, which a root gpuqd sets to the job owner's.
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) &&
           ::faccessat(AT_FDCWD, p.c_str(), X_OK, AT_EACCESS) == 0;
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

namespace {

// Writes `text` whole to a new file at `tmp`, which is `mode` and not shared with anyone's.
Result<bool> write_new_file(const std::string& tmp, const std::string& text, unsigned mode) {
  // The directory may be the job's, and the job may have put a symlink at the temporary name
  // (to /etc/shadow, for a root gpuqd to write through): it is replaced, never followed.
  // Created, never opened: one there already (a crash's, or the job's) is removed first.
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), flags, static_cast<mode_t>(mode));
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0)
    fd = ::open(tmp.c_str(), flags, static_cast<mode_t>(mode));
  if (fd < 0) return Error{ErrorCode::store_error, "cannot write " + tmp + ": " + std::strerror(errno)};
  // The mode asked for, not less: under the units' UMask=0027 a hook's input (read by the job's
  // owner) or the metrics textfile (read by node_exporter) would be closed to its reader.
  if (::fchmod(fd, static_cast<mode_t>(mode)) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Error{ErrorCode::store_error, "cannot set the mode of " + tmp + ": " + std::strerror(err)};
  }
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
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error{ErrorCode::store_error, "cannot write " + tmp + ": " + std::strerror(err)};
  }
  return true;
}

}  // namespace

Result<bool> write_file_atomic(const std::string& path, const std::string& text, unsigned mode) {
  const std::string tmp = path + ".tmp";
  if (auto w = write_new_file(tmp, text, mode); !w) return w;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error{ErrorCode::store_error, "cannot write " + path + ": " + std::strerror(err)};
  }
  return true;
}

Result<bool> create_file_once(const std::string& path, const std::string& text, unsigned mode) {
  // Its own temporary name: two writers racing for `path` must not take each other's.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (auto w = write_new_file(tmp, text, mode); !w) return w;
  // link() never replaces what is there, and what it puts there is whole. Refused for another
  // reason (a filesystem without hard links), it is an error, never taken for "already there".
  int linked = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  // Over NFS a retransmitted link() may answer EEXIST for the link it made: the temporary file's
  // two links say so (open(2)'s advice for O_EXCL there).
  struct stat st {};
  if (linked != 0 && err == EEXIST && ::stat(tmp.c_str(), &st) == 0 && st.st_nlink == 2) linked = 0;
  ::unlink(tmp.c_str());
  if (linked == 0) return true;
  if (err == EEXIST) return false;
  return Error{ErrorCode::store_error, "cannot create " + path + ": " + std::strerror(err)};
}

std::vector<std::string> supervisor_environment() {
  std::vector<std::string> out{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  for (const char* name : {"ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"})
    if (const char* v = std::getenv(name)) out.push_back(std::string(name) + "=" + v);
  return out;
}

void mark_inherited_fds_cloexec() {
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  mark_listed_fds_cloexec();  // kernels before 5.11
}

void mark_listed_fds_cloexec() {
  // Only system calls (this runs in a vfork child): the descriptors open, from /proc/self/fd read
  // with getdents64 into the stack, not every number up to a limit gpuqd raised to 524,288.
  const int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {  // no /proc: the table, as far as a launch can afford
    for (int fd = 3, max = static_cast<int>(::sysconf(_SC_OPEN_MAX)); fd < max && fd < 65536; ++fd) {
      int flags = ::fcntl(fd, F_GETFD);
      if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    }
    return;
  }
  alignas(8) char buf[4096];
  for (long n; (n = ::syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0;) {
    for (long at = 0; at < n;) {
      struct Entry {
        std::uint64_t ino;
        std::int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* e = reinterpret_cast<const Entry*>(buf + at);
      int fd = 0;
      bool number = e->name[0] != '\0';
      for (const char* c = e->name; *c && number; ++c) number = *c >= '0' && *c <= '9', fd = fd * 10 + (*c - '0');
      if (number && fd >= 3 && fd != dir) {
        const int flags = ::fcntl(fd, F_GETFD);
        if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
      }
      at += e->reclen;
    }
  }
  ::close(dir);
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

std::optional<uid_t> process_owner(int pid) {
  // From `Uid:` in status (real, effective, saved, fs), not the owner of /proc/PID, which is root's
  // for a process that is not dumpable, as one is after it changed its uid.
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      unsigned long real = 0, effective = 0;
      if (fields >> real >> effective) return static_cast<uid_t>(effective);
      return std::nullopt;
    }
  return std::nullopt;
}

std::optional<ProcessId> read_pid_file(const std::string& path, std::optional<uid_t> owner) {
  // In the job's directory, so the job could have written it: checked like any input.
  auto j = read_untrusted_file(path, 4096, "pid file", owner);
  if (!j || !j->is_object()) return std::nullopt;
  const auto pid = j->find("pid"), start = j->find("start_time");
  if (pid == j->end() || start == j->end() || !pid->is_number_unsigned() || !start->is_number_unsigned() ||
      pid->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<int>::max()) || pid->get<std::uint64_t>() == 0)
    return std::nullopt;
  return ProcessId{pid->get<int>(), start->get<std::uint64_t>()};
}

bool is_alive(const ProcessId& p) {
  // A zombie has ended (its parent has not collected it yet, and may never: gpuqd, after a
  // restart, is not the parent of the supervisors it adopts).
  auto fields = proc_stat_fields(p.pid);
  if (!fields || fields->size() <= 22 - 3 || (*fields)[0] == "Z" || (*fields)[0] == "X") return false;
  return std::stoull((*fields)[22 - 3]) == p.start_time;
}

}  // namespace gpuq::common
