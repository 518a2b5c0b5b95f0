// CPU topology from sysfs and the slot order built on it (see cpu_topology.hpp).
#include "daemon/cpu_topology.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "common/spec.hpp"

namespace gpuq::daemon {

namespace {

std::string read_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

int read_int(const std::filesystem::path& path) {
  try {
    return std::stoi(read_line(path));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

std::map<int, CpuPlace> read_cpu_topology(const std::string& sys_root, const std::vector<int>& cpus) {
  namespace fs = std::filesystem;
  const fs::path system = fs::path(sys_root) / "devices/system";
  std::map<int, int> node_of;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(system / "node", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || name.find_first_not_of("0123456789", 4) != std::string::npos)
      continue;
    if (auto list = common::parse_cpu_list(read_line(entry.path() / "cpulist")))
      for (int c : *list) node_of[c] = std::stoi(name.substr(4));
  }
  const std::set<int> usable(cpus.begin(), cpus.end());
  std::map<int, CpuPlace> out;
  for (int c : cpus) {
    const fs::path topology = system / "cpu" / ("cpu" + std::to_string(c)) / "topology";
    CpuPlace p;
    p.node = node_of.count(c) ? node_of[c] : -1;
    p.package = read_int(topology / "physical_package_id");
    p.core = read_int(topology / "core_id");
    // Counted among the usable cpus: a thread whose siblings are all outside the mask is its
    // core's first.
    if (auto siblings = common::parse_cpu_list(read_line(topology / "thread_siblings_list")))
      p.thread = static_cast<int>(
          std::count_if(siblings->begin(), siblings->end(), [&](int s) { return s < c && usable.count(s); }));
    out[c] = p;
  }
  return out;
}

std::vector<int> slot_order(std::vector<int> cpus, const std::map<int, CpuPlace>& places) {
  auto key = [&](int c) {
    const auto it = places.find(c);
    const CpuPlace p = it != places.end() ? it->second : CpuPlace{};
    return std::make_tuple(p.thread, p.node, p.package, p.core, c);
  };
  std::sort(cpus.begin(), cpus.end(), [&](int a, int b) { return key(a) < key(b); });
  return cpus;
}

SlotCores sysfs_slot_cores(const std::string& sys_root, const std::vector<int>& cpus) {
  const auto places = read_cpu_topology(sys_root, cpus);
  SlotCores out{slot_order(cpus, places), {}};
  for (int c : out.cores)
    out.nodes.push_back(places.at(c).node);
  // No node lists the cores (a kernel without NUMA, or no sysfs): their nodes are unknown.
  if (std::all_of(out.nodes.begin(), out.nodes.end(), [](int n) { return n < 0; })) out.nodes.clear();
  return out;
}

}  // namespace gpuq::daemon
