// Default locations and private-directory creation.
#include "common/paths.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

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

std::string current_dir() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof(buf)) ? std::string(buf) : std::string("/");
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

Result<bool> make_dirs(const std::string& dir) {
  if (dir.empty()) return Error{ErrorCode::bad_request, "cannot create a directory with an empty name"};
  for (std::size_t pos = 0; pos != std::string::npos;) {
    pos = dir.find('/', pos + 1);
    const std::string part = dir.substr(0, pos);
    if (part.empty() || part.back() == '/') continue;  // "//" in the path
    if (::mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
      return Error{ErrorCode::internal, "cannot create directory " + part + ": " + std::strerror(errno)};
  }
  if (!is_directory(dir)) return Error{ErrorCode::internal, "cannot create directory " + dir + ": something else is there"};
  return true;
}

namespace {
// The first leading part of `path` that is there and is not a directory; "" when none is.
std::string first_non_directory(const std::string& path) {
  for (std::size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const std::string prefix = path.substr(0, at);
    struct stat st {};
    if (!prefix.empty() && ::stat(prefix.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) return prefix;
    if (at == std::string::npos) return "";
  }
}

Error cannot_create(const std::string& dir, int err) {
  const std::string blocker = err == ENOTDIR ? first_non_directory(dir) : std::string();
  return Error{ErrorCode::internal, "cannot create directory " + dir + ": " +
                                        (blocker.empty() ? std::strerror(err) : blocker + " is not a directory")};
}
}  // namespace

Result<bool> ensure_private_dir(const std::string& dir) {
  // Parents are created with the default mode; only the last component must be private. The
  // directory itself first, then up from it only as far as one is missing (a new job's first
  // attempt: its job's directory), not from the root for every attempt of every job.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    if (errno != ENOENT) return cannot_create(dir, errno);
    std::vector<std::string> missing{dir};  // the deepest first
    for (std::string at = dir;;) {
      const auto slash = at.find_last_of('/', at.find_last_not_of('/'));
      if (slash == 0 || slash == std::string::npos) break;  // up to the root (or a relative path's first)
      at = at.substr(0, slash);
      if (::mkdir(at.c_str(), 0755) == 0 || errno == EEXIST) break;
      if (errno != ENOENT) return cannot_create(at, errno);
      missing.push_back(at);
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it)
      if (::mkdir(it->c_str(), *it == dir ? 0700 : 0755) != 0 && errno != EEXIST) return cannot_create(*it, errno);
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

namespace {

constexpr int k_max_tree_depth = 256;

// Deletes `name` in the directory `parent` (a descriptor), as remove_tree.
void remove_at(int parent, const std::string& name, const std::string& shown, int depth, std::int64_t& bytes,
               std::string& error) {
  const auto fail = [&](const std::string& what) {
    if (error.empty()) error = what + " " + shown + ": " + std::strerror(errno);
  };
  struct stat st {};
  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) fail("cannot look at");
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    if (depth >= k_max_tree_depth) {
      if (error.empty()) error = shown + " lies over " + std::to_string(k_max_tree_depth) + " directories deep; left there";
      return;
    }
    const int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      if (DIR* dir = ::fdopendir(fd)) {
        std::vector<std::string> names;  // read whole before deleting: no reading a changing directory
        while (dirent* e = ::readdir(dir))
          if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
        for (const auto& n : names) remove_at(::dirfd(dir), n, shown + "/" + n, depth + 1, bytes, error);
        ::closedir(dir);
      } else {
        ::close(fd);
      }
      if (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) fail("cannot delete");
      return;
    }
    if (errno != ELOOP && errno != ENOTDIR) return fail("cannot open");
    // Swapped for something else since fstatat: deleted as a file below.
  } else if (S_ISREG(st.st_mode)) {
    bytes += st.st_size;
  }
  if (::unlinkat(parent, name.c_str(), 0) != 0 && errno != ENOENT) fail("cannot delete");
}

}  // namespace

std::int64_t remove_tree(const std::string& path, std::string& error) {
  std::int64_t bytes = 0;
  error.clear();
  const std::string parent = parent_dir(path);
  const std::string name = path.substr(path.find_last_of('/') + 1);
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) error = "cannot open " + parent + ": " + std::strerror(errno);
    return 0;
  }
  remove_at(fd, name, path, 0, bytes, error);
  ::close(fd);
  return bytes;
}

}  // namespace gpuq::common
