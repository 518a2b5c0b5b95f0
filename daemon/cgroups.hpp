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
// gpuqd says so at start and tracks processes by the supervisor's tree, as before. Limits (memory,
// devices, pids, cpuset) through the controllers given to gpuqd come next.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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

class Cgroups {
 public:
  // The cgroup under which this gpuqd makes attempts' cgroups: a child of its own, named for its
  // state dir (so that two gpuqds on one host never share one, and a restarted gpuqd finds its
  // running attempts' again). `proc` and `hierarchies` are for tests (a fake cgroupfs).
  static Result<Cgroups> open(const std::string& state_dir, const std::vector<CgroupHierarchy>& hierarchies);
  static Result<Cgroups> open(const std::string& state_dir);  // this host's layout

  // "cgroup v2 at /sys/fs/cgroup/unified/gpuq-0123abcd (cgroup.kill)": what gpuqd logs at start.
  std::string describe() const;
  // An attempt's cgroup: its directory (made here, or found again after a restart; empty otherwise
  // than with its own processes). `name`: unique among this gpuqd's attempts ("12-attempt-1").
  Result<std::string> make(const std::string& name) const;
  std::string path(const std::string& name) const { return m_base + "/" + name; }
  // Kills every process in the cgroup `dir`: cgroup.kill on v2 (all at once, forks included);
  // without it, SIGKILL through a pidfd to each process listed that is still in it when its pidfd
  // is open (a pid reused meanwhile is not signalled; before Linux 5.3, which has no pidfd, by its
  // pid once found in it), one round a call (a process forked during
  // the round is killed by the next: the executor calls again until empty() says so).
  // Asynchronous in the kernel: empty() says when they are gone.
  void kill(const std::string& dir) const;
  // Whether no process is left in `dir` (a directory that is not there has none).
  bool empty(const std::string& dir) const;
  // Removes an attempt's cgroup once empty; and this gpuqd's own at shutdown where no attempt's is
  // left in it. Quiet: a cgroup still in use (EBUSY) stays.
  void remove(const std::string& dir) const;
  void remove_base() const { remove(m_base); }

  bool v2() const { return m_v2; }
  const std::string& base() const { return m_base; }

 private:
  Cgroups(std::string base, bool v2, bool has_kill, std::string mount, std::string root, std::string controller)
      : m_base(std::move(base)),
        m_v2(v2),
        m_has_kill(has_kill),
        m_mount(std::move(mount)),
        m_root(std::move(root)),
        m_controller(std::move(controller)) {}
  // `dir` as /proc/PID/cgroup names it.
  std::string named(const std::string& dir) const;
  std::string m_base;
  bool m_v2 = false;
  bool m_has_kill = false;  // v2's cgroup.kill (Linux 5.14)
  std::string m_mount, m_root;  // the hierarchy's mount point, and the part of it mounted there
  std::string m_controller;     // v1: the hierarchy's (first) controller, as /proc/PID/cgroup names it
};

}  // namespace gpuq::daemon
