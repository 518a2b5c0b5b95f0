// One cgroup per attempt, nested under gpuqd's own: every process of the attempt is in it from
// its first instruction (each rank joins it between fork and exec, through a descriptor its
// supervisor opened before it took the owner's identity), while the supervisor stays outside. When
// the supervisor is gone (it ended, or the job killed it), the executor kills the cgroup and waits
// until it is empty before it says the attempt ended: `setsid` children and double forks die with
// the job, and its GPUs go to no other job while a process of it lives.
//
// The layout is discovered at run time, as hosts differ: cgroup v2 (its own cgroup's directory
// writable by gpuqd: root, or a subtree delegated to its service), else a v1 hierarchy it may
// write (any controller tracks processes; `pids` or `freezer` first). Where none can be made,
// gpuqd says so at start and tracks processes by the supervisor's tree, as before.
//
// Limits the kernel enforces come from the controllers given to gpuqd, on v2 where its cgroup has
// them, else from a v1 hierarchy that has them (a hybrid host: v2 tracks, v1 memory limits): host
// memory per rank, the processes of an attempt, each rank's cores, and the GPUs' device nodes an
// attempt was not given. Where a limit is held per rank (memory_mb, pinned cores), each rank runs
// in a cgroup of its own below the attempt's (`rank-R`, in the hierarchies that hold it); elsewhere
// the ranks join the attempt's, and unpinned attempts share one in a v1 cpuset hierarchy that holds
// nothing else of theirs: fewer cgroups made and removed at each start. A limit whose controller
// gpuqd was not given is not in force, and `describe()` says so and why.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace gpuq::daemon {

// A cgroup hierarchy as this process sees it: where it is mounted, and this process's cgroup in it.
struct CgroupHierarchy {
  bool v2 = false;
  std::vector<std::string> controllers;  // v1: the hierarchy's controllers ("memory", "name=systemd")
  std::string mount;                     // "/sys/fs/cgroup/unified"
  std::string root;                      // the mount's root within the hierarchy ("/" unless bind-mounted)
  std::string own;                       // this process's cgroup in it ("/process_api/42")
  // This process's cgroup as a directory: mount + own less root; "" when it lies outside the mount.
  std::string own_dir() const;
};

// The hierarchies of /proc/self/mountinfo's text that /proc/self/cgroup's text places this process
// in (pure: unit-tested against hosts' texts).
std::vector<CgroupHierarchy> parse_cgroup_layout(const std::string& mountinfo, const std::string& proc_cgroup);

// What the kernel is to hold an attempt to (each where its controller is in force).
struct AttemptLimits {
  int ranks = 1;                             // R from 0; a cgroup `rank-R` each where a limit is per rank
  std::int64_t memory_mb = 0;                // host memory (and swap) per rank; 0: none
  std::int64_t pids = 0;                     // processes and threads of the whole attempt; 0: none
  std::vector<std::vector<int>> rank_cores;  // rank R's cpuset; none (or all empty): unpinned
  std::vector<int> free_cores;               // an unpinned rank's cpuset: the cores gpuqd may use
  // Character devices (major, minor) the attempt may not open: the GPUs it was not given.
  std::vector<std::pair<unsigned, unsigned>> denied_devices;
};

enum class Limit { memory, pids, cpuset, devices };

// An attempt's cgroup in one hierarchy, as its ranks join it: `rank-R` below `dir` each where a
// limit is held per rank there (memory, or pinned cores), else `dir` itself. `dir` may be one
// that unpinned attempts share (a v1 cpuset hierarchy that holds nothing else of theirs).
struct AttemptCgroup {
  std::string dir;
  bool per_rank = false;
};

// cgroup v2 keeps devices by a BPF program (BPF_PROG_TYPE_CGROUP_DEVICE) attached to a cgroup:
// one that refuses the character devices `denied` (major, minor) and allows the rest, attached to
// the v2 cgroup directory `dir` with BPF_F_ALLOW_MULTI (so that a service manager's program above
// still runs; the cgroup's descendants run it too). Gone with the cgroup. Needs CAP_BPF and
// CAP_SYS_ADMIN (or root's full set); an error says what the kernel refused.
Result<bool> deny_devices_bpf(const std::string& dir, const std::vector<std::pair<unsigned, unsigned>>& denied);
constexpr std::array<Limit, 4> k_limits = {Limit::memory, Limit::pids, Limit::cpuset, Limit::devices};
const char* controller_of(Limit limit);  // "memory", "pids", "cpuset", "devices"

// Whether `dir` can be gpuqd's `cgroup_parent`, and its path with every link resolved: an absolute
// path to a cgroup v2 directory, gpuqd's user's alone (not writable by others), with no process
// in it unless it is the root. One that is missing (cgroupfs is not kept over a reboot) is made
// where its parent is a cgroup v2 directory. An error says what is wrong with it.
Result<std::string> check_cgroup_parent(const std::string& dir);

class Cgroups {
 public:
  // The cgroup under which this gpuqd makes attempts' cgroups: a child of its own, named for its
  // state dir (so that two gpuqds on one host never share one, and a restarted gpuqd finds its
  // running attempts' again). On v2, `v2_parent` (the `cgroup_parent` setting) replaces gpuqd's own
  // cgroup as the parent: a cgroup of the admin's outside gpuqd's, which can hand controllers down
  // where gpuqd's own cannot (it has processes in it: gpuqd, or a container's others) and which a
  // restart of gpuqd's service leaves alone. `hierarchies` are for tests (a fake cgroupfs).
  static Result<Cgroups> open(const std::string& state_dir, const std::vector<CgroupHierarchy>& hierarchies,
                              const std::string& v2_parent = "");
  static Result<Cgroups> open(const std::string& state_dir, const std::string& v2_parent = "");  // this host's

  // "cgroup v2 at /sys/fs/cgroup/unified/gpuq-0123abcd (cgroup.kill)": what gpuqd logs at start.
  std::string describe() const;
  // Each limit in force and where ("memory per rank (v1 memory)"), then those not, each with why.
  std::string describe_limits() const;
  // Where `limit` is in force: "v2", "v1 memory"; "" where it is not.
  std::string where(Limit limit) const;
  // An attempt's cgroup in every hierarchy used, the tracking one first, each with a `rank-R` per
  // rank where a limit is held per rank there, and `limits` written where they are in force (made here, or found again after a
  // restart). `name`: unique among this gpuqd's attempts ("12-attempt-1"). A limit the kernel
  // refuses is an error that names it, and nothing is left made.
  Result<std::vector<AttemptCgroup>> make(const std::string& name, const AttemptLimits& limits = {}) const;
  std::string path(const std::string& name) const { return m_base + "/" + name; }
  // Kills every process in the cgroup `dir`: cgroup.kill on v2 (all at once, forks included);
  // without it, SIGKILL through a pidfd to each process listed that is still in it when its pidfd
  // is open (a pid reused meanwhile is not signalled; before Linux 5.3, which has no pidfd, by its
  // pid once found in it), one round a call, the attempt frozen during it where a freezer is at
  // hand (v2's cgroup.freeze, or a v1 freezer hierarchy: nothing forks while it is listed);
  // without one a process forked during the round is killed by the next (the executor calls
  // again until empty() says so).
  // Asynchronous in the kernel: empty() says when they are gone.
  void kill(const std::string& dir) const;
  // Whether no process is left in `dir` (a directory that is not there has none).
  bool empty(const std::string& dir) const;
  // Removes an attempt's cgroups (`dir`: its tracking one) once empty, in every hierarchy; and this
  // gpuqd's own at shutdown where no attempt's is left in them. Quiet: a cgroup still in use
  // (EBUSY) stays.
  void remove(const std::string& dir) const;
  // `none_running`: no attempt of this gpuqd's runs (else one about to join the cgroup unpinned
  // attempts share would find it gone).
  void remove_base(bool none_running = true) const;
  // How many of the attempt's processes an OOM killer killed (its memory limit's, or the
  // machine's), its tracking cgroup `dir`; nothing where the memory controller is not in force.
  // Read before remove().
  std::optional<std::int64_t> oom_kills(const std::string& dir) const;

  // Whether an attempt can be frozen in place (a suspension): v2's cgroup.freeze (Linux 5.2), or a
  // v1 freezer hierarchy.
  bool can_freeze() const { return m_freezer >= 0; }
  // Freezes (`frozen`) or thaws every process of the attempt whose tracking cgroup is `dir`, its
  // ranks' cgroups below it too; asks and returns (a task stuck in the kernel is frozen once it
  // leaves it). False where it cannot: no freezer, or the write refused.
  bool freeze(const std::string& dir, bool frozen) const;
  // Whether the attempt's freezer is asked to hold it frozen.
  bool frozen(const std::string& dir) const;

  bool v2() const { return m_v2; }
  const std::string& base() const { return m_base; }

 private:
  Cgroups() = default;
  // A hierarchy gpuqd makes attempts' cgroups in: the tracking one (m_hierarchies[0]), then v1
  // ones that give limits it lacks.
  struct Used {
    std::string base;  // gpuqd's cgroup in it
    bool v2 = false;
    std::vector<std::string> controllers;  // v1: the hierarchy's
  };
  // Gives gpuqd's cgroup in m_hierarchies[used] what its attempts' need (v2: the controllers in
  // force handed down; v1 cpuset: CPUs and memory nodes), as when open() made it.
  Result<bool> prepare_base(std::size_t used) const;
  // A v1 hierarchy with `controller`, gpuqd's cgroup made in it (or found among those used): its
  // index in m_hierarchies, or -1 with `why`.
  int use_v1(const std::vector<CgroupHierarchy>& hierarchies, const std::string& controller, const std::string& tag,
             std::string& why);
  // Finds where each limit can be in force (open()).
  void find_limits(const std::vector<CgroupHierarchy>& hierarchies, const std::string& tag);
  // The limits of `limits` in force in `used` written into the attempt's cgroup `dir` there and its
  // ranks' (made here).
  Result<bool> make_in(std::size_t used, const std::string& dir, const AttemptLimits& limits, bool per_rank) const;
  // Makes the cgroup `dir` below gpuqd's in m_hierarchies[used] (found there is fine), making
  // gpuqd's again first where it was removed meanwhile; `what` names `dir` in an error.
  Result<bool> make_below(std::size_t used, const std::string& dir, const std::string& what = "") const;
  // The cgroup unpinned attempts share in the v1 cpuset hierarchy `used`, holding `cores`.
  Result<std::string> unpinned(std::size_t used, const std::string& cores) const;
  bool in_force_at(Limit limit, std::size_t used) const {
    return m_where[static_cast<std::size_t>(limit)] == static_cast<int>(used);
  }
  // The freezer's file of the attempt whose tracking cgroup is `dir`; "" without a freezer.
  std::string freezer_file(const std::string& dir) const;
  // `dir` as /proc/PID/cgroup names it.
  std::string named(const std::string& dir) const;
  // The attempt's name in every hierarchy, from its tracking cgroup `dir`.
  std::string name_of(const std::string& dir) const;
  // The device programs loaded, by the nodes they deny (descriptors, closed with the last copy).
  struct Programs {
    std::map<std::vector<std::pair<unsigned, unsigned>>, int> by_denied;
    Programs() = default;
    Programs(const Programs&) = delete;
    Programs& operator=(const Programs&) = delete;
    ~Programs();
  };
  std::shared_ptr<Programs> m_programs = std::make_shared<Programs>();
  mutable std::string m_unpinned_cores;  // what the shared `unpinned` cpuset holds; "": not made yet
  std::string m_base;
  std::string m_parent;  // cgroup_parent, where given
  bool m_v2 = false;
  bool m_has_kill = false;  // v2's cgroup.kill (Linux 5.14)
  std::string m_mount, m_root;  // the hierarchy's mount point, and the part of it mounted there
  std::string m_controller;     // v1: the hierarchy's (first) controller, as /proc/PID/cgroup names it
  std::vector<Used> m_hierarchies;
  std::array<int, 4> m_where{-1, -1, -1, -1};  // by Limit: the index in m_hierarchies; -1: not in force
  std::array<std::string, 4> m_why_not;        // by Limit, where not in force
  int m_freezer = -1;  // the hierarchy whose freezer suspends an attempt (and, without cgroup.kill, stops one before a
                       // kill); -1: none
};

}  // namespace gpuq::daemon
