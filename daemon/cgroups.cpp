// Cgroups per attempt (see cgroups.hpp): the host's layout read from /proc/self, a cgroup named for
// gpuqd's state dir under its own, and an attempt's cgroup made, killed, watched until empty and
// removed.
#include "daemon/cgroups.hpp"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "common/paths.hpp"

namespace gpuq::daemon {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep))
    out.push_back(part);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto octal = [&](std::size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '7'; };
    if (s[i] == '\\' && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A stable name for a state dir (as the kernel resolves it, where it exists): FNV-1a, 64 bits, in hex.
std::string tag_of(const std::string& state_dir) {
  char resolved[PATH_MAX];
  const std::string path = ::realpath(state_dir.c_str(), resolved) ? std::string(resolved) : state_dir;
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : path)
    h = (h ^ c) * 1099511628211ULL;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Where a v1 hierarchy serves best: any controller tracks processes; cpuset's children need their
// CPUs set first, and name=systemd is systemd's.
int v1_rank(const CgroupHierarchy& h) {
  static const std::vector<std::string> order = {"pids", "freezer", "memory", "devices", "blkio", "cpu", "cpuacct"};
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const auto& c : h.controllers)
      if (c == order[i]) return static_cast<int>(i);
  return -1;
}

std::vector<int> pids_in(const std::string& dir) {
  std::vector<int> out;
  std::istringstream in(read_small(dir + "/cgroup.procs"));
  for (int pid = 0; in >> pid;)
    if (pid > 0) out.push_back(pid);
  return out;
}

}  // namespace

std::string CgroupHierarchy::own_dir() const {
  if (root == "/") return own == "/" ? mount : mount + own;
  if (own == root) return mount;
  if (own.rfind(root + "/", 0) == 0) return mount + own.substr(root.size());
  return {};
}

std::vector<CgroupHierarchy> parse_cgroup_layout(const std::string& mountinfo, const std::string& proc_cgroup) {
  struct Mount {
    bool v2;
    std::set<std::string> options;
    std::string root, point;
  };
  std::vector<Mount> mounts;
  std::istringstream lines(mountinfo);
  for (std::string line; std::getline(lines, line);) {
    const auto fields = split(line, ' ');
    std::size_t dash = 0;
    while (dash < fields.size() && fields[dash] != "-")
      ++dash;
    if (dash < 5 || dash + 3 > fields.size()) continue;
    const std::string& type = fields[dash + 1];
    if (type != "cgroup" && type != "cgroup2") continue;
    Mount m{type == "cgroup2", {}, unescape(fields[3]), unescape(fields[4])};
    for (auto& o : split(fields[dash + 3], ','))
      m.options.insert(o);
    mounts.push_back(std::move(m));
  }
  std::vector<CgroupHierarchy> out;
  std::istringstream groups(proc_cgroup);
  for (std::string line; std::getline(groups, line);) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    const bool v2 = line.compare(0, first, "0") == 0 && controllers.empty();
    const auto wanted = controllers.empty() ? std::vector<std::string>{} : split(controllers, ',');
    // The last mount that shows this process's cgroup: one mounted over an earlier is the one seen.
    std::optional<CgroupHierarchy> seen;
    for (const auto& m : mounts) {
      if (m.v2 != v2) continue;
      bool all = true;
      for (const auto& c : wanted)
        all = all && m.options.count(c);
      if (!all || (!v2 && wanted.empty())) continue;
      CgroupHierarchy h{v2, wanted, m.point, m.root, path};
      if (h.own_dir().empty()) continue;  // a mount of another part of the hierarchy
      seen = std::move(h);
    }
    if (seen) out.push_back(std::move(*seen));
  }
  return out;
}

Result<Cgroups> Cgroups::open(const std::string& state_dir) {
  return open(state_dir, parse_cgroup_layout(read_small("/proc/self/mountinfo"), read_small("/proc/self/cgroup")));
}

Result<Cgroups> Cgroups::open(const std::string& state_dir, const std::vector<CgroupHierarchy>& hierarchies) {
  std::vector<const CgroupHierarchy*> order;
  for (const auto& h : hierarchies)
    if (h.v2) order.push_back(&h);
  for (int rank = 0; rank < 16; ++rank)
    for (const auto& h : hierarchies)
      if (!h.v2 && v1_rank(h) == rank) order.push_back(&h);
  std::string tried;  // why each hierarchy would not do
  const auto refused = [&](const std::string& kind, const std::string& why) {
    tried += (tried.empty() ? "" : "; ") + kind + ": " + why;
  };
  for (const CgroupHierarchy* h : order) {
    const std::string base = h->own_dir() + "/gpuq-" + tag_of(state_dir);
    const std::string kind = h->v2 ? "v2" : "v1 (" + h->controllers.front() + ")";
    if (::mkdir(base.c_str(), 0755) != 0 && errno != EEXIST) {
      refused(kind, "cannot make " + base + ": " + std::strerror(errno));
      continue;
    }
    if (!common::path_exists(base + "/cgroup.procs")) {
      refused(kind, base + " is not a cgroup");
      continue;
    }
    return Cgroups(base, h->v2, h->v2 && common::path_exists(base + "/cgroup.kill"), h->mount, h->root,
                   h->v2 ? std::string() : h->controllers.front());
  }
  return Error{ErrorCode::unavailable, tried.empty() ? "no cgroup hierarchy places gpuqd" : tried};
}

std::string Cgroups::describe() const {
  return std::string(m_v2 ? "cgroup v2" : "cgroup v1") + " at " + m_base + (m_has_kill ? " (cgroup.kill)" : "");
}

Result<std::string> Cgroups::make(const std::string& name) const {
  const std::string dir = path(name);
  // gpuqd's own may have been removed meanwhile (by an admin, or by a service manager that took
  // the cgroup back): made again.
  if (::mkdir(dir.c_str(), 0755) != 0 && errno == ENOENT) ::mkdir(m_base.c_str(), 0755);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return Error{ErrorCode::internal, "cannot make the attempt's cgroup " + dir + ": " + std::strerror(errno)};
  return dir;
}

void Cgroups::kill(const std::string& dir) const {
  if (m_has_kill) {
    if (std::ofstream out(dir + "/cgroup.kill"); out << "1\n" && out.flush()) return;
  }
  const std::string name = named(dir);
  // Whether `pid` is in this cgroup, on this hierarchy's line of /proc/PID/cgroup ("0::/x" on v2;
  // "4:pids:/x" on v1).
  const auto inside = [&](int pid) {
    std::istringstream lines(read_small("/proc/" + std::to_string(pid) + "/cgroup"));
    for (std::string line; std::getline(lines, line);) {
      const auto first = line.find(':');
      const auto second = first == std::string::npos ? first : line.find(':', first + 1);
      if (second == std::string::npos || line.compare(second + 1, std::string::npos, name) != 0) continue;
      const auto controllers = split(line.substr(first + 1, second - first - 1), ',');
      if (m_v2 ? line.compare(0, second + 1, "0::") == 0
               : std::find(controllers.begin(), controllers.end(), m_controller) != controllers.end())
        return true;
    }
    return false;
  };
  for (int pid : pids_in(dir)) {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0 && errno == ENOSYS) {  // before Linux 5.3: checked, then signalled by its pid
      if (inside(pid)) ::kill(pid, SIGKILL);
      continue;
    }
    if (pidfd < 0) continue;                                                        // gone
    if (inside(pid)) ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);  // the process the pidfd holds
    ::close(pidfd);
  }
}

std::string Cgroups::named(const std::string& dir) const {
  const std::string below = dir.substr(std::min(dir.size(), m_mount.size()));  // "/gpuq-.../12-attempt-1"
  return m_root == "/" ? below : m_root + below;
}

bool Cgroups::empty(const std::string& dir) const {
  if (!common::path_exists(dir)) return true;
  if (m_v2) {
    std::istringstream events(read_small(dir + "/cgroup.events"));
    for (std::string key, value; events >> key >> value;)
      if (key == "populated") return value == "0";
  }
  return pids_in(dir).empty();
}

void Cgroups::remove(const std::string& dir) const {
  ::rmdir(dir.c_str());
}

}  // namespace gpuq::daemon
