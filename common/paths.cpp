// Default locations and private-directory creation.
#include "common/paths.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace gpuq::common {

namespace {
std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
std::string uid_tmp_dir() { return "/tmp/gpuq-" + std::to_string(::getuid()); }
}  // namespace

std::string default_socket_path() {
  std::string runtime = env_or_empty("XDG_RUNTIME_DIR");
  if (!runtime.empty()) return runtime + "/gpuq/gpuqd.sock";
  return uid_tmp_dir() + "/gpuqd.sock";
}

std::string default_state_dir() {
  std::string state = env_or_empty("XDG_STATE_HOME");
  if (!state.empty()) return state + "/gpuq";
  std::string home = env_or_empty("HOME");
  if (!home.empty()) return home + "/.local/state/gpuq";
  return uid_tmp_dir() + "/state";
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::string parent_dir(const std::string& path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

std::string self_dir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return parent_dir(buf);
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<bool> ensure_private_dir(const std::string& dir) {
  // Parents are created with the default mode; only the last component must be private.
  for (std::size_t pos = 1; pos != std::string::npos;) {
    pos = dir.find('/', pos + 1);
    std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), pos == std::string::npos ? 0700 : 0755) != 0 && errno != EEXIST)
      return Error{ErrorCode::internal, "cannot create directory " + part + ": " + std::strerror(errno)};
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Error{ErrorCode::internal, dir + " is not a directory"};
  if (st.st_uid != ::getuid())
    return Error{ErrorCode::forbidden, dir + " belongs to uid " + std::to_string(st.st_uid) +
                                           ", not to this user; refusing to use it"};
  if ((st.st_mode & 077) != 0 && ::chmod(dir.c_str(), 0700) != 0)
    return Error{ErrorCode::forbidden, dir + " is open to other users and cannot be made private: " +
                                           std::strerror(errno)};
  return true;
}

}  // namespace gpuq::common
