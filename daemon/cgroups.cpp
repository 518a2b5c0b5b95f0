// Cgroups per attempt (see cgroups.hpp): the host's layout read from /proc/self, a cgroup named for
// gpuqd's state dir under its own, and an attempt's cgroup made, killed, watched until empty and
// removed.
#include "daemon/cgroups.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/bpf.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/paths.hpp"
#include "common/spec.hpp"

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

// `dir` and the cgroups below it (its ranks', and any a root job made), deepest last; bounded.
std::vector<std::string> tree(const std::string& dir) {
  std::vector<std::string> out{dir};
  std::error_code ec;
  for (std::size_t i = 0; i < out.size(); ++i)
    for (std::filesystem::directory_iterator it(out[i], ec), end; !ec && it != end && out.size() < 4096;
         it.increment(ec))
      if (it->is_directory(ec) && !it->is_symlink(ec)) out.push_back(it->path().string());
  return out;
}

// Removes the cgroup `dir` and those below it that are empty, the deepest first (a cgroup with a
// process in it, and those above it, stay).
void remove_tree(const std::string& dir) {
  const auto groups = tree(dir);
  for (auto it = groups.rbegin(); it != groups.rend(); ++it)
    ::rmdir(it->c_str());
}

// Writes `text` to the cgroup file `path` in one write(2), as the kernel takes it; an error names
// the file and what the kernel said.
Result<bool> put(const std::string& path, const std::string& text) {
  // O_CREAT for a fake cgroupfs (tests): the kernel's files are there, and it refuses new ones.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    const int err = errno;
    return Error{ErrorCode::internal,
                 "cannot open " + path + ": " + std::strerror(err) +
                     (common::path_exists(path) ? "" : " (no such file: is its controller enabled?)")};
  }
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = n < 0 ? errno : EIO;
  ::close(fd);
  if (n == static_cast<ssize_t>(text.size())) return true;
  return Error{ErrorCode::internal, "cannot write \"" + text + "\" to " + path + ": " + std::strerror(err)};
}

std::string first_line(const std::string& path) {
  std::string text = read_small(path);
  return text.substr(0, text.find('\n'));
}

bool has_word(const std::string& text, const std::string& word) {
  std::istringstream in(text);
  for (std::string w; in >> w;)
    if (w == word) return true;
  return false;
}

// A "key value" line's value in a cgroup's flat-keyed file (memory.events, memory.oom_control).
std::optional<std::int64_t> keyed(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string k;
  for (std::int64_t value = 0; in >> k >> value;)
    if (k == key) return value;
  return std::nullopt;
}

// A v1 cpuset's children start with no CPUs and no memory nodes: `dir` gets its parent's where it
// has none (a child cannot be joined before), or `cpus`.
Result<bool> give_cpuset(const std::string& dir, const std::string& cpus = "") {
  const std::string parent = dir.substr(0, dir.rfind('/'));
  for (const char* file : {"cpuset.mems", "cpuset.cpus"}) {
    const std::string own = first_line(dir + "/" + file);
    const std::string wanted =
        std::string(file) == "cpuset.cpus" && !cpus.empty() ? cpus : first_line(parent + "/" + file);
    if (wanted.empty())  // a cpuset with none cannot be joined: said now, not at each rank's start
      return Error{ErrorCode::internal, parent + "/" + file + " gives no value for " + dir};
    if (own == wanted) continue;
    if (auto ok = put(dir + "/" + file, wanted); !ok) return ok;
  }
  return true;
}

// `try_it` on a cgroup of gpuqd's own under `base`, made for it and removed after (with what was
// attached to it or written in it): what the kernel lets gpuqd do, tried at start.
template <class Try>
Result<bool> on_probe(const std::string& base, Try&& try_it) {
  const std::string probe = base + "/probe-devices";
  if (::mkdir(probe.c_str(), 0700) != 0 && errno != EEXIST)
    return Error{ErrorCode::internal, "cannot make " + probe + ": " + std::strerror(errno)};
  auto tried = try_it(probe);
  ::rmdir(probe.c_str());
  return tried;
}

// How many device programs run for the cgroup `dir` (its own and those above it that still run
// for it); nothing where the kernel does not say.
std::optional<std::uint32_t> device_programs(const std::string& dir) {
  const int group = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (group < 0) return std::nullopt;
  bpf_attr query{};
  query.query.target_fd = static_cast<std::uint32_t>(group);
  query.query.attach_type = BPF_CGROUP_DEVICE;
  query.query.query_flags = BPF_F_QUERY_EFFECTIVE;
  const long ok = ::syscall(SYS_bpf, BPF_PROG_QUERY, &query, sizeof(query));
  ::close(group);
  if (ok != 0) return std::nullopt;
  return query.query.prog_cnt;
}

// Whether the kernel attaches a device program for gpuqd, and the programs above still run beside
// it: tried on a cgroup of its own under `base`. One attached above without BPF_F_ALLOW_MULTI (a
// container runtime's, say) runs only for cgroups with none of their own: gpuqd's would replace
// its policy for the jobs (devices it refuses would open), so none is attached then.
Result<bool> may_deny_devices_bpf(const std::string& base) {
  return on_probe(base, [](const std::string& probe) -> Result<bool> {
    const auto before = device_programs(probe);
    auto attached = deny_devices_bpf(probe, {{195, 255}});
    const auto after = device_programs(probe);
    if (attached && before && after && *after != *before + 1)
      return Error{ErrorCode::internal,
                   "a device program above gpuqd's cgroup (attached without BPF_F_ALLOW_MULTI) "
                   "would no longer run for its jobs beside gpuqd's"};
    return attached;
  });
}

// Whether the kernel takes a deny from gpuqd (it needs CAP_SYS_ADMIN, which a service's bounding
// set may leave out, whatever the file's mode says): tried on a cgroup of its own under `base`.
Result<bool> may_deny_devices(const std::string& base) {
  return on_probe(base, [](const std::string& probe) -> Result<bool> {
    auto denied = put(probe + "/devices.deny", "c 195:255 m");  // nvidiactl, made: harmless, and gone with the probe
    if (!denied) return Error{ErrorCode::internal, denied.error().message + " (the kernel wants CAP_SYS_ADMIN for it)"};
    return true;
  });
}

// The file whose writability says that gpuqd may set a limit in a hierarchy.
const char* limit_file(Limit limit, bool v2) {
  switch (limit) {
    case Limit::memory:
      return v2 ? "memory.max" : "memory.limit_in_bytes";
    case Limit::pids:
      return "pids.max";
    case Limit::cpuset:
      return "cpuset.cpus";
    case Limit::devices:
      return "devices.deny";
  }
  return "";
}

}  // namespace

namespace {
// A BPF_PROG_TYPE_CGROUP_DEVICE program refusing the character devices `denied`: its descriptor.
Result<int> load_deny_program(const std::vector<std::pair<unsigned, unsigned>>& denied) {
  // r1: struct bpf_cgroup_dev_ctx {u32 access_type (access << 16 | type); u32 major; u32 minor}.
  std::vector<bpf_insn> prog;
  const auto insn = [&](int code, int dst, int src, int off, std::int64_t imm) {
    bpf_insn i{};
    i.code = static_cast<std::uint8_t>(code);
    i.dst_reg = static_cast<std::uint8_t>(dst & 0xf);
    i.src_reg = static_cast<std::uint8_t>(src & 0xf);
    i.off = static_cast<std::int16_t>(off);
    i.imm = static_cast<std::int32_t>(imm);
    prog.push_back(i);
  };
  const int n = static_cast<int>(denied.size());
  const int allow = 5 + 2 * n, deny = allow + 2;       // where they start
  insn(BPF_LDX | BPF_MEM | BPF_W, 2, 1, 0, 0);         // r2 = access_type
  insn(BPF_ALU64 | BPF_AND | BPF_K, 2, 0, 0, 0xffff);  // its device type
  insn(BPF_JMP | BPF_JNE | BPF_K, 2, 0, allow - 3, BPF_DEVCG_DEV_CHAR);
  insn(BPF_LDX | BPF_MEM | BPF_W, 3, 1, 4, 0);  // r3 = major
  insn(BPF_LDX | BPF_MEM | BPF_W, 4, 1, 8, 0);  // r4 = minor
  for (int i = 0; i < n; ++i) {
    const auto& [major_no, minor_no] = denied[static_cast<std::size_t>(i)];
    insn(BPF_JMP | BPF_JNE | BPF_K, 3, 0, 1, major_no);                       // another major: the next
    insn(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, deny - (6 + 2 * i) - 1, minor_no);  // this node: refused
  }
  insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1);  // allowed
  insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
  insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0);  // refused
  insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);

  static const char k_license[] = "GPL";
  char log[1024] = {0};
  bpf_attr load{};
  load.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
  load.insns = reinterpret_cast<std::uint64_t>(prog.data());
  load.insn_cnt = static_cast<std::uint32_t>(prog.size());
  load.license = reinterpret_cast<std::uint64_t>(k_license);
  int fd = static_cast<int>(::syscall(SYS_bpf, BPF_PROG_LOAD, &load, sizeof(load)));
  const int load_err = errno;
  if (fd < 0) {
    // Again with the verifier's words, for the error (its log of a program that loads would not
    // fit: ENOSPC; so not the first time).
    load.log_buf = reinterpret_cast<std::uint64_t>(log);
    load.log_size = sizeof(log);
    load.log_level = 1;
    fd = static_cast<int>(::syscall(SYS_bpf, BPF_PROG_LOAD, &load, sizeof(load)));
  }
  if (fd < 0) {
    const int err = load_err;  // the first refusal's (the second may only say the log was short)
    log[sizeof(log) - 1] = 0;
    std::string said(log);
    std::replace(said.begin(), said.end(), '\n', ' ');
    return Error{ErrorCode::internal, std::string("cannot load a BPF device program: ") + std::strerror(err) +
                                          (said.empty() ? std::string() : " (" + said.substr(0, 300) + ")")};
  }
  return fd;
}

Result<bool> attach_deny_program(const std::string& dir, int program) {
  const int group = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (group < 0) return Error{ErrorCode::internal, "cannot open " + dir + ": " + std::strerror(errno)};
  bpf_attr attach{};
  attach.target_fd = static_cast<std::uint32_t>(group);
  attach.attach_bpf_fd = static_cast<std::uint32_t>(program);
  attach.attach_type = BPF_CGROUP_DEVICE;
  attach.attach_flags = BPF_F_ALLOW_MULTI;
  const long attached = ::syscall(SYS_bpf, BPF_PROG_ATTACH, &attach, sizeof(attach));
  const int err = errno;
  ::close(group);
  if (attached != 0)
    return Error{ErrorCode::internal, "cannot attach a BPF device program to " + dir + ": " + std::strerror(err)};
  return true;
}
}  // namespace

Result<bool> deny_devices_bpf(const std::string& dir, const std::vector<std::pair<unsigned, unsigned>>& denied) {
  auto program = load_deny_program(denied);
  if (!program) return program.error();
  auto attached = attach_deny_program(dir, *program);
  ::close(*program);  // the cgroup holds it now
  return attached;
}

Cgroups::Programs::~Programs() {
  for (const auto& [denied, fd] : by_denied)
    ::close(fd);
}

const char* controller_of(Limit limit) {
  switch (limit) {
    case Limit::memory:
      return "memory";
    case Limit::pids:
      return "pids";
    case Limit::cpuset:
      return "cpuset";
    case Limit::devices:
      return "devices";
  }
  return "";
}

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

namespace {
bool on_cgroup2(const std::string& path) {
  struct statfs fs {};
  return ::statfs(path.c_str(), &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC;
}
}  // namespace

Result<std::string> check_cgroup_parent(const std::string& dir) {
  const auto refuse = [&](const std::string& why) {
    return Error{ErrorCode::invalid_spec, "cgroup_parent " + dir + ": " + why};
  };
  if (dir.empty() || dir.front() != '/') return refuse("not an absolute path");
  // cgroupfs is not kept over a reboot: a parent gone with it is made again below one that is a
  // cgroup v2 directory.
  const std::string trimmed = dir.substr(0, dir.find_last_not_of('/') + 1);  // no trailing '/'
  const std::string up = trimmed.substr(0, trimmed.rfind('/'));
  if (!common::path_exists(dir) && !up.empty() && on_cgroup2(up) && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return refuse(std::string("cannot make it: ") + std::strerror(errno));
  char resolved[PATH_MAX];
  if (!::realpath(dir.c_str(), resolved)) return refuse(std::strerror(errno));
  const std::string path = resolved;
  if (!on_cgroup2(path) || !common::path_exists(path + "/cgroup.procs"))
    return refuse(
        "not a cgroup v2 directory (make one with mkdir in the v2 hierarchy, as root or as a service "
        "given it with Delegate=yes)");
  // Whoever may write it may kill, freeze or starve every job below it: gpuqd's user alone.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return refuse(std::strerror(errno));
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0)
    return refuse("owned by uid " + std::to_string(st.st_uid) + " with mode " + std::to_string(st.st_mode & 0777) +
                  ": it must be gpuqd's user's alone (who may write it may kill or freeze every job below it)");
  // The root has no cgroup.events and may hold processes; any other hands no controller down then.
  if (common::path_exists(path + "/cgroup.events") && !pids_in(path).empty())
    return refuse("has processes in it, so it can hand no controller down: name one with none in it");
  return path;
}

Result<Cgroups> Cgroups::open(const std::string& state_dir, const std::string& v2_parent) {
  return open(state_dir, parse_cgroup_layout(read_small("/proc/self/mountinfo"), read_small("/proc/self/cgroup")),
              v2_parent);
}

Result<Cgroups> Cgroups::open(const std::string& state_dir, const std::vector<CgroupHierarchy>& hierarchies,
                              const std::string& v2_parent) {
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
  if (!v2_parent.empty() && std::none_of(order.begin(), order.end(), [&](const CgroupHierarchy* h) {
        return h->v2 && (v2_parent == h->mount || v2_parent.compare(0, h->mount.size() + 1, h->mount + "/") == 0);
      }))
    return Error{ErrorCode::unavailable,
                 "cgroup_parent " + v2_parent + " is not in the cgroup v2 hierarchy gpuqd is in"};
  // Where this state dir's attempts ran before on v2 (its record, or below gpuqd's own cgroup).
  const std::string record = state_dir + "/cgroup-base";
  const std::string recorded = first_line(record);
  for (const CgroupHierarchy* h : order) {
    const std::string base = (h->v2 && !v2_parent.empty() ? v2_parent : h->own_dir()) + "/gpuq-" + tag_of(state_dir);
    const std::string kind = h->v2 ? "v2" : "v1 (" + h->controllers.front() + ")";
    // A base that moved (cgroup_parent set, changed or dropped) while attempts still ran in the
    // old one would find none of them again, and run them a second time beside their processes.
    for (const std::string& before : {recorded, h->own_dir() + "/gpuq-" + tag_of(state_dir)}) {
      if (!h->v2 || before.empty() || before == base || !common::path_exists(before)) continue;
      if (keyed(before + "/cgroup.events", "populated").value_or(0) != 0)
        return Error{ErrorCode::wrong_state, "attempts of this state dir still run in " + before +
                                                 ", where gpuqd put them before cgroup_parent changed to \"" +
                                                 v2_parent + "\": let them end (or cancel them) first"};
      remove_tree(before);
    }
    if (::mkdir(base.c_str(), 0755) != 0 && errno != EEXIST) {
      refused(kind, "cannot make " + base + ": " + std::strerror(errno));
      if (h->v2 && !v2_parent.empty()) break;  // the admin's choice: not another in its place
      continue;
    }
    if (!common::path_exists(base + "/cgroup.procs")) {
      refused(kind, base + " is not a cgroup");
      continue;
    }
    Cgroups c;
    c.m_parent = h->v2 ? v2_parent : std::string();
    c.m_base = base;
    c.m_v2 = h->v2;
    c.m_has_kill = h->v2 && common::path_exists(base + "/cgroup.kill");
    c.m_mount = h->mount;
    c.m_root = h->root;
    c.m_controller = h->v2 ? std::string() : h->controllers.front();
    c.m_hierarchies.push_back({base, h->v2, h->controllers});
    c.find_limits(hierarchies, tag_of(state_dir));
    if (h->v2 && recorded != base) std::ofstream(record) << base << "\n";  // a state dir that is there
    return c;
  }
  return Error{ErrorCode::unavailable, tried.empty() ? "no cgroup hierarchy places gpuqd" : tried};
}

std::string Cgroups::describe() const {
  return std::string(m_v2 ? "cgroup v2" : "cgroup v1") + " at " + m_base +
         (m_has_kill     ? " (cgroup.kill)"
          : can_freeze() ? " (frozen, then killed)"
                         : "");
}

void Cgroups::find_limits(const std::vector<CgroupHierarchy>& hierarchies, const std::string& tag) {
  for (Limit limit : k_limits) {
    const std::string controller = controller_of(limit);
    const auto at = static_cast<std::size_t>(limit);
    const Used& tracking = m_hierarchies.front();
    std::string why;
    if (tracking.v2 && limit == Limit::devices) {
      // v2 keeps devices by a BPF program: in force where the kernel attaches one for gpuqd.
      auto probe = may_deny_devices_bpf(tracking.base);
      if (probe) {
        m_where[at] = 0;
        continue;
      }
      why = "cgroup v2: " + probe.error().message;
    } else if (tracking.v2) {
      // Given to the parent (gpuqd's cgroup, or cgroup_parent) by its own parent's subtree_control,
      // and handed down to gpuqd's base: the attempts' cgroups then have it.
      const std::string own = tracking.base.substr(0, tracking.base.rfind('/'));
      if (!has_word(read_small(own + "/cgroup.controllers"), controller)) {
        why = "cgroup v2: the " + controller + " controller is not given to the cgroup " + own;
      } else if (auto on = has_word(read_small(own + "/cgroup.subtree_control"), controller)
                               ? Result<bool>(true)
                               : put(own + "/cgroup.subtree_control", "+" + controller);
                 !on) {
        // The no-internal-process rule: gpuqd's own cgroup holds gpuqd (a container's, other
        // processes too). gpuqd does not move itself into a leaf below it, as a lone service might:
        // under systemd a restart would then find controllers enabled in the service's cgroup, where
        // jobs kept running, and fail to place the new gpuqd there (EBUSY).
        why =
            "cgroup v2: " + on.error().message +
            " (a cgroup with processes in it hands no controller down unless it is the root" +
            (own == m_parent ? std::string(")") : ": name a cgroup with none in it for the jobs with --cgroup-parent)");
      } else if (auto down = put(tracking.base + "/cgroup.subtree_control", "+" + controller); !down) {
        why = "cgroup v2: " + down.error().message;
      } else {
        m_where[at] = 0;
        continue;
      }
    } else if (limit != Limit::devices &&  // devices: checked below as any v1 hierarchy's
               std::find(tracking.controllers.begin(), tracking.controllers.end(), controller) !=
                   tracking.controllers.end()) {
      m_where[at] = 0;
      continue;
    }
    // A v1 hierarchy with the controller, gpuqd's cgroup in it made as in the tracking one's.
    std::string v1_why = "no v1 hierarchy has it";
    const int index = use_v1(hierarchies, controller, tag, v1_why);
    if (index >= 0) {
      const std::string& base = m_hierarchies[static_cast<std::size_t>(index)].base;
      if (::access((base + "/" + limit_file(limit, false)).c_str(), W_OK) != 0) {
        v1_why = "v1: " + base + "/" + limit_file(limit, false) + ": " + std::strerror(errno);
      } else if (limit == Limit::devices && first_line(base + "/devices.list") != "a *:* rwm") {
        // A devices cgroup that denies by default (a container's) allows by exceptions, which a
        // deny of one node does not narrow ("c 195:* rwm" stays): only one that allows all is used.
        v1_why = "v1: " + base + " allows devices by a list (a container's?), which gpuqd does not narrow";
      } else if (auto probe = limit == Limit::devices ? may_deny_devices(base) : Result<bool>(true); !probe) {
        v1_why = "v1: " + probe.error().message;
      } else {
        m_where[at] = index;
      }
    }
    if (m_where[at] < 0) m_why_not[at] = why.empty() ? v1_why : why + "; " + v1_why;
  }
  // Without cgroup.kill, a fork loop may outpace rounds of SIGKILL: the attempt is frozen first,
  // through v2's cgroup.freeze (Linux 5.2), or a v1 freezer hierarchy.
  // The same freezer suspends an attempt in place (preemption.hpp's suspension).
  const Used& tracking = m_hierarchies.front();
  if (tracking.v2) {
    m_freezer = common::path_exists(tracking.base + "/cgroup.freeze") ? 0 : -1;
  } else {
    std::string unused;
    m_freezer = use_v1(hierarchies, "freezer", tag, unused);
  }
}

std::string Cgroups::freezer_file(const std::string& dir) const {
  if (m_freezer < 0) return {};
  const Used& h = m_hierarchies[static_cast<std::size_t>(m_freezer)];
  return h.base + "/" + name_of(dir) + (h.v2 ? "/cgroup.freeze" : "/freezer.state");
}

bool Cgroups::freeze(const std::string& dir, bool frozen) const {
  const std::string file = freezer_file(dir);
  if (file.empty() || name_of(dir).empty()) return false;
  const bool v2 = m_hierarchies[static_cast<std::size_t>(m_freezer)].v2;
  return put(file, frozen ? (v2 ? "1" : "FROZEN") : (v2 ? "0" : "THAWED")).ok();
}

bool Cgroups::frozen(const std::string& dir) const {
  const std::string file = freezer_file(dir);
  if (file.empty() || name_of(dir).empty()) return false;
  const std::string state = first_line(file);  // v2: "0" or "1"; v1: THAWED, FREEZING or FROZEN
  return state == "1" || state == "FREEZING" || state == "FROZEN";
}

int Cgroups::use_v1(const std::vector<CgroupHierarchy>& hierarchies, const std::string& controller,
                    const std::string& tag, std::string& why) {
  for (const auto& h : hierarchies) {
    if (h.v2 || std::find(h.controllers.begin(), h.controllers.end(), controller) == h.controllers.end()) continue;
    const std::string base = h.own_dir() + "/gpuq-" + tag;
    std::size_t index = 0;
    while (index < m_hierarchies.size() && m_hierarchies[index].base != base)
      ++index;
    if (index < m_hierarchies.size()) return static_cast<int>(index);  // used already (the tracking one, say)
    if (::mkdir(base.c_str(), 0755) != 0 && errno != EEXIST) {
      why = "v1: cannot make " + base + ": " + std::strerror(errno);
      return -1;
    }
    if (!common::path_exists(base + "/cgroup.procs")) {
      why = "v1: " + base + " is not a cgroup";
      return -1;
    }
    if (std::find(h.controllers.begin(), h.controllers.end(), "cpuset") != h.controllers.end())
      if (auto given = give_cpuset(base); !given) {
        why = "v1: " + given.error().message;
        return -1;
      }
    m_hierarchies.push_back({base, false, h.controllers});
    return static_cast<int>(index);
  }
  return -1;
}

std::string Cgroups::where(Limit limit) const {
  const int at = m_where[static_cast<std::size_t>(limit)];
  if (at < 0) return {};
  const Used& used = m_hierarchies[static_cast<std::size_t>(at)];
  return used.v2 ? "v2" : std::string("v1 ") + controller_of(limit);
}

std::string Cgroups::describe_limits() const {
  static const char* names[] = {"memory per rank", "processes per attempt", "each rank's cores", "the GPUs given"};
  std::string in_force, not_in_force;
  for (Limit limit : k_limits) {
    const auto at = static_cast<std::size_t>(limit);
    if (m_where[at] >= 0)
      in_force += std::string(in_force.empty() ? "" : ", ") + names[at] + " (" +
                  (m_hierarchies[static_cast<std::size_t>(m_where[at])].v2
                       ? where(limit)
                       : "v1 at " + m_hierarchies[static_cast<std::size_t>(m_where[at])].base) +
                  ")";
    else
      not_in_force += std::string(not_in_force.empty() ? "" : "; ") + names[at] + ": " + m_why_not[at];
  }
  return "limits in force: " + (in_force.empty() ? std::string("none") : in_force) +
         (not_in_force.empty() ? "" : "; not in force: " + not_in_force);
}

Result<std::vector<AttemptCgroup>> Cgroups::make(const std::string& name, const AttemptLimits& limits) const {
  std::vector<AttemptCgroup> dirs;
  std::vector<std::string> made_here;  // the attempt's own, to remove on an error (not a shared one)
  const auto undo = [&](Error e) {
    for (const auto& made : made_here)
      remove(made);
    return e;
  };
  const bool pinned = std::any_of(limits.rank_cores.begin(), limits.rank_cores.end(),
                                  [](const std::vector<int>& cores) { return !cores.empty(); });
  for (std::size_t i = 0; i < m_hierarchies.size(); ++i) {
    const Used& used = m_hierarchies[i];
    // A v1 cpuset hierarchy that holds nothing else of an unpinned attempt: the one cgroup they
    // all share (no cgroup of its own to make and remove at each start).
    if (!pinned && i != 0 && in_force_at(Limit::cpuset, i) && !in_force_at(Limit::memory, i) &&
        !in_force_at(Limit::pids, i) && !in_force_at(Limit::devices, i) && i != static_cast<std::size_t>(m_freezer)) {
      auto shared = unpinned(i, common::format_cpu_list(limits.free_cores));
      if (!shared)
        return undo(Error{ErrorCode::internal, "cannot hold the attempt to its cores: " + shared.error().message});
      dirs.push_back({*shared, false});
      continue;
    }
    const std::string dir = used.base + "/" + name;
    if (auto made = make_below(i, dir, "the attempt's cgroup "); !made) return undo(made.error());
    made_here.push_back(dir);
    const bool per_rank =
        (in_force_at(Limit::memory, i) && limits.memory_mb > 0) || (in_force_at(Limit::cpuset, i) && pinned);
    dirs.push_back({dir, per_rank});
    if (auto made = make_in(i, dir, limits, per_rank); !made)
      return undo(Error{ErrorCode::internal, "cannot hold the attempt to its limits: " + made.error().message});
  }
  return dirs;
}

Result<bool> Cgroups::make_below(std::size_t i, const std::string& dir, const std::string& what) const {
  const std::string& base = m_hierarchies[i].base;
  // gpuqd's own may have been removed meanwhile (by an admin, or by a service manager that took
  // the cgroup back): made again, as open() made it.
  // One mkdir where all is well (an attempt starts often: no call that is bound to fail).
  int err = ::mkdir(dir.c_str(), 0755) == 0 ? 0 : errno;
  if (err == ENOENT && ::mkdir(base.c_str(), 0755) == 0)
    if (auto again = prepare_base(i); !again)
      return Error{ErrorCode::internal, "cannot make gpuqd's cgroup " + base + " again: " + again.error().message};
  if (err == ENOENT) err = ::mkdir(dir.c_str(), 0755) == 0 ? 0 : errno;  // its base made again (here, or by another)
  if (err != 0 && err != EEXIST)
    return Error{ErrorCode::internal, "cannot make " + what + dir + ": " + std::strerror(err)};
  return true;
}

Result<std::string> Cgroups::unpinned(std::size_t i, const std::string& cores) const {
  const std::string dir = m_hierarchies[i].base + "/unpinned";
  if (!m_unpinned_cores.empty() && m_unpinned_cores == cores && common::path_exists(dir + "/cgroup.procs")) return dir;
  if (auto made = make_below(i, dir); !made) return made.error();
  if (auto given = give_cpuset(dir, cores); !given) return given.error();
  m_unpinned_cores = cores;
  return dir;
}

Result<bool> Cgroups::prepare_base(std::size_t i) const {
  const Used& used = m_hierarchies[i];
  if (!used.v2 && std::find(used.controllers.begin(), used.controllers.end(), "cpuset") != used.controllers.end())
    return give_cpuset(used.base);
  if (used.v2)  // the controllers in force on v2, handed down to the attempts' cgroups (devices is a program)
    for (Limit limit : k_limits)
      if (in_force_at(limit, i) && limit != Limit::devices)
        if (auto down = put(used.base + "/cgroup.subtree_control", std::string("+") + controller_of(limit)); !down)
          return down;
  return true;
}

Result<bool> Cgroups::make_in(std::size_t i, const std::string& dir, const AttemptLimits& limits, bool per_rank) const {
  const Used& used = m_hierarchies[i];
  const bool memory = in_force_at(Limit::memory, i), cpuset = in_force_at(Limit::cpuset, i);
  std::set<int> all_cores;
  for (const auto& cores : limits.rank_cores)
    all_cores.insert(cores.begin(), cores.end());
  // The attempt's cores: its ranks' together, or where it is unpinned those gpuqd may use.
  const std::string attempt_cores = common::format_cpu_list(
      all_cores.empty() ? limits.free_cores : std::vector<int>(all_cores.begin(), all_cores.end()));
  if (used.v2 && per_rank && (memory || cpuset)) {  // handed down to the ranks' cgroups
    if (auto on = put(dir + "/cgroup.subtree_control",
                      std::string(memory ? "+memory" : "") + (memory && cpuset ? " " : "") + (cpuset ? "+cpuset" : ""));
        !on)
      return on;
  }
  if (cpuset && !used.v2)
    if (auto given = give_cpuset(dir, attempt_cores); !given) return given;
  // The attempt's cores on v2 too, its ranks' own below where they have some: a rank without
  // (unpinned, in its own cgroup for its memory) is held to the attempt's, not to its parent's.
  if (cpuset && used.v2 && !attempt_cores.empty())
    if (auto ok = put(dir + "/cpuset.cpus", attempt_cores); !ok) return ok;
  if (in_force_at(Limit::pids, i) && limits.pids > 0)
    if (auto ok = put(dir + "/pids.max", std::to_string(limits.pids)); !ok) return ok;
  if (in_force_at(Limit::devices, i)) {
    if (used.v2 && !limits.denied_devices.empty()) {  // a BPF program on the attempt's cgroup, its ranks' too
      // Loaded (and verified) once for each set of nodes denied, then attached to each attempt's.
      auto& programs = m_programs->by_denied;
      auto known = programs.find(limits.denied_devices);
      if (known == programs.end()) {
        auto loaded = load_deny_program(limits.denied_devices);
        if (!loaded) return loaded.error();
        if (programs.size() >= 64) {  // bounded: subsets of the GPUs; a box's distinct ones are few
          for (const auto& [denied, fd] : programs)
            ::close(fd);
          programs.clear();
        }
        known = programs.emplace(limits.denied_devices, *loaded).first;
      }
      // The same program is not attached twice to one cgroup (EINVAL): an attempt's cgroup found
      // again, the program already on it, gets one loaded for it alone, as before the cache.
      if (auto ok = attach_deny_program(dir, known->second); !ok)
        if (auto again = deny_devices_bpf(dir, limits.denied_devices); !again) return again;
    } else if (!used.v2) {
      for (const auto& [major, minor] : limits.denied_devices)
        if (auto ok = put(dir + "/devices.deny", "c " + std::to_string(major) + ":" + std::to_string(minor) + " rwm");
            !ok)
          return ok;
    }
  }
  for (int r = 0; per_rank && r < std::max(1, limits.ranks); ++r) {
    const std::string rank = dir + "/rank-" + std::to_string(r);
    if (::mkdir(rank.c_str(), 0755) != 0 && errno != EEXIST)
      return Error{ErrorCode::internal, "cannot make " + rank + ": " + std::strerror(errno)};
    const auto index = static_cast<std::size_t>(r);
    const std::string cores = index < limits.rank_cores.size() && !limits.rank_cores[index].empty()
                                  ? common::format_cpu_list(limits.rank_cores[index])
                                  : std::string();
    if (cpuset && !used.v2)
      if (auto given = give_cpuset(rank, cores); !given) return given;
    if (cpuset && used.v2 && !cores.empty())
      if (auto ok = put(rank + "/cpuset.cpus", cores); !ok) return ok;
    if (memory && limits.memory_mb > 0) {
      const std::string bytes = std::to_string(limits.memory_mb << 20);
      // Swap counts against it too, where the kernel accounts swap: no job outgrows its limit by swapping.
      if (used.v2) {
        if (auto ok = put(rank + "/memory.max", bytes); !ok) return ok;
        if (common::path_exists(rank + "/memory.swap.max"))
          if (auto ok = put(rank + "/memory.swap.max", "0"); !ok) return ok;
      } else {
        if (auto ok = put(rank + "/memory.limit_in_bytes", bytes); !ok) return ok;
        if (common::path_exists(rank + "/memory.memsw.limit_in_bytes"))
          if (auto ok = put(rank + "/memory.memsw.limit_in_bytes", bytes); !ok) return ok;
      }
    }
  }
  return true;
}

void Cgroups::kill(const std::string& dir) const {
  if (m_has_kill) {  // the whole subtree at once
    if (std::ofstream out(dir + "/cgroup.kill"); out << "1\n" && out.flush()) return;
  }
  // Frozen first (where it can be), so that none of it forks while its processes are listed and
  // signalled; thawed after, when the SIGKILLs take them (a fork with one pending is refused). In
  // two rounds, so that gpuqd's thread never waits on the freezer (a task stuck in the kernel never
  // freezes): this one asks for the freeze, the next (the executor calls again until empty) finds
  // it asked, frozen or freezing, kills and thaws. A child born meanwhile is born frozen.
  const bool freezes = !m_has_kill && can_freeze();
  if (freezes && !frozen(dir) && freeze(dir, true)) return;
  for (const std::string& group : tree(dir)) {
    const std::string name = named(group);
    // Whether `pid` is in this cgroup, on this hierarchy's line of /proc/PID/cgroup ("0::/x" on
    // v2; "4:pids:/x" on v1).
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
    for (int pid : pids_in(group)) {
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
  if (freezes) freeze(dir, false);
}

std::string Cgroups::named(const std::string& dir) const {
  const std::string below = dir.substr(std::min(dir.size(), m_mount.size()));  // "/gpuq-.../12-attempt-1"
  return m_root == "/" ? below : m_root + below;
}

std::string Cgroups::name_of(const std::string& dir) const {
  if (dir.size() > m_base.size() + 1 && dir.compare(0, m_base.size() + 1, m_base + "/") == 0)
    return dir.substr(m_base.size() + 1);
  return dir.substr(dir.rfind('/') + 1);
}

bool Cgroups::empty(const std::string& dir) const {
  if (!common::path_exists(dir)) return true;
  if (m_v2) {
    std::istringstream events(read_small(dir + "/cgroup.events"));
    for (std::string key, value; events >> key >> value;)
      if (key == "populated") return value == "0";
  }
  for (const std::string& group : tree(dir))
    if (!pids_in(group).empty()) return false;
  return true;
}

void Cgroups::remove(const std::string& dir) const {
  const std::string name = name_of(dir);
  for (const Used& used : m_hierarchies) {
    // The ranks' as make() made them (rank-0 up), then the attempt's: no listing of a cgroup's
    // files where all is as made. One that stays (a root job's own cgroups below) is walked.
    const std::string group = used.base + "/" + name;
    if (::rmdir(group.c_str()) == 0 || errno == ENOENT) continue;  // one its ranks joined
    for (int r = 0; r < 4096; ++r)  // until one is not there (or cannot be seen: EACCES)
      if (::rmdir((group + "/rank-" + std::to_string(r)).c_str()) != 0 && errno != EBUSY && errno != ENOTEMPTY) break;
    if (::rmdir(group.c_str()) == 0 || errno == ENOENT) continue;
    remove_tree(group);
  }
}

void Cgroups::remove_base(bool none_running) const {
  for (const Used& used : m_hierarchies) {
    // The unpinned attempts' shared cpuset: empty too while a rank is about to join it.
    if (none_running) ::rmdir((used.base + "/unpinned").c_str());
    ::rmdir(used.base.c_str());
  }
}

std::optional<std::int64_t> Cgroups::oom_kills(const std::string& dir) const {
  const int at = m_where[static_cast<std::size_t>(Limit::memory)];
  if (at < 0) return std::nullopt;
  const Used& used = m_hierarchies[static_cast<std::size_t>(at)];
  const std::string group = used.base + "/" + name_of(dir);
  // v2: each cgroup's own count (memory.events.local, Linux 5.2) summed; memory.events is the
  // subtree's, but only the cgroup's own under the memory_localevents mount option.
  if (used.v2 && !common::path_exists(group + "/memory.events.local"))
    return keyed(group + "/memory.events", "oom_kill");
  const char* file = used.v2 ? "/memory.events.local" : "/memory.oom_control";
  std::optional<std::int64_t> sum;
  for (const std::string& g : tree(group))
    if (const auto n = keyed(g + file, "oom_kill")) sum = sum.value_or(0) + *n;
  return sum;
}

}  // namespace gpuq::daemon
