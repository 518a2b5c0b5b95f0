// The order in which gpuqd's CPU slots map to cores. Taking cores in numeric order gives a
// 2-core job one physical core wherever the kernel numbers hyperthread siblings next to each
// other (common on AMD, and on some Intel firmware); slots follow the CPU topology instead: the
// first hardware thread of every physical core, grouped by NUMA node and package, before any
// second thread. The scheduler's "first run of free slots" then gives a job distinct physical
// cores that share a node.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace gpuq::daemon {

struct CpuPlace {
  int node = 0;     // NUMA node; -1 where no node lists the cpu
  int package = 0;  // socket
  int core = 0;     // core_id within the package
  int thread = 0;   // position among its core's usable hardware threads (0: the first)
};

// Where each of `cpus` sits, from sysfs under `sys_root` ("/sys"). What cannot be read is 0 (the
// node -1), so a machine (or container) without topology files orders its cores numerically.
std::map<int, CpuPlace> read_cpu_topology(const std::string& sys_root, const std::vector<int>& cpus);

// `cpus` in slot order: by thread, then node, package, core, then number.
std::vector<int> slot_order(std::vector<int> cpus, const std::map<int, CpuPlace>& places);
// `cpus` in slot order with each one's NUMA node, from sysfs under `sys_root`.
struct SlotCores {
  std::vector<int> cores;
  std::vector<int> nodes;  // nodes[i]: the node of cores[i]; empty when no core's node is known
};
SlotCores sysfs_slot_cores(const std::string& sys_root, const std::vector<int>& cpus);

}  // namespace gpuq::daemon
