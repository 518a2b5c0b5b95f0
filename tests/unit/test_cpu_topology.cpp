// CPU slots follow the topology: physical cores first, grouped by node, then their siblings.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/spec.hpp"
#include "daemon/cpu_topology.hpp"

namespace fs = std::filesystem;
using gpuq::daemon::CpuPlace;
using gpuq::daemon::read_cpu_topology;
using gpuq::daemon::slot_order;
using gpuq::daemon::sysfs_slot_cores;

namespace {

// A sysfs tree with the topology files of `cpus`: cpu -> {package, core id, siblings list}, and
// the nodes' cpulists.
struct FakeSys {
  fs::path root = fs::temp_directory_path() / ("gpuq-unit-sys-" + std::to_string(::getpid()));
  FakeSys(const std::map<int, std::tuple<int, int, std::string>>& cpus, const std::map<int, std::string>& nodes) {
    fs::remove_all(root);
    for (const auto& [cpu, where] : cpus) {
      const auto dir = root / "devices/system/cpu" / ("cpu" + std::to_string(cpu)) / "topology";
      fs::create_directories(dir);
      std::ofstream(dir / "physical_package_id") << std::get<0>(where) << "\n";
      std::ofstream(dir / "core_id") << std::get<1>(where) << "\n";
      std::ofstream(dir / "thread_siblings_list") << std::get<2>(where) << "\n";
    }
    for (const auto& [node, list] : nodes) {
      const auto dir = root / "devices/system/node" / ("node" + std::to_string(node));
      fs::create_directories(dir);
      std::ofstream(dir / "cpulist") << list << "\n";
    }
    fs::create_directories(root / "devices/system/node/power");  // not a node
  }
  ~FakeSys() { fs::remove_all(root); }
  std::vector<int> order(const std::vector<int>& cpus) const { return sysfs_slot_cores(root.string(), cpus).cores; }
};

}  // namespace

TEST_SUITE_BEGIN("cpu_topology");

TEST_CASE("kernel cpu lists parse back to what format_cpu_list writes, and bad ones are refused") {
  using gpuq::common::parse_cpu_list;
  CHECK(parse_cpu_list("0-3,8,10-11\n") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("5") == std::vector<int>{5});
  CHECK(parse_cpu_list("") == std::vector<int>{});
  CHECK(gpuq::common::format_cpu_list(*parse_cpu_list("9,0-2,1")) == "0-2,9");
  CHECK_FALSE(parse_cpu_list("3-1").has_value());
  CHECK_FALSE(parse_cpu_list("a-b").has_value());
  CHECK_FALSE(parse_cpu_list("1,-2").has_value());
}

TEST_CASE("siblings numbered next to each other: each physical core before any second thread") {
  // 4 cores x 2 threads, cpu 2k and 2k+1 share core k (common on AMD).
  std::map<int, std::tuple<int, int, std::string>> cpus;
  for (int c = 0; c < 8; ++c)
    cpus[c] = {0, c / 2, std::to_string(c / 2 * 2) + "-" + std::to_string(c / 2 * 2 + 1)};
  FakeSys sys(cpus, {{0, "0-7"}});
  CHECK(sys.order({0, 1, 2, 3, 4, 5, 6, 7}) == std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7});
  // Under an affinity mask without cpu 0, cpu 1 is the only thread of core 0 gpuqd may use: a
  // first thread, before cpu 3 (core 1's second).
  CHECK(sys.order({1, 2, 3}) == std::vector<int>{1, 2, 3});
  CHECK(sys.order({0, 1, 2, 3, 5}) == std::vector<int>{0, 2, 5, 1, 3});
}

TEST_CASE("siblings numbered a half apart, as on most Intel machines, keep numeric order for the first half") {
  std::map<int, std::tuple<int, int, std::string>> cpus;
  for (int c = 0; c < 8; ++c) cpus[c] = {0, c % 4, std::to_string(c % 4) + "," + std::to_string(c % 4 + 4)};
  FakeSys sys(cpus, {{0, "0-7"}});
  CHECK(sys.order({0, 1, 2, 3, 4, 5, 6, 7}) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("two NUMA nodes with interleaved numbering: a node's cores are consecutive slots") {
  // Two sockets, one node each, cpus alternating between them; no SMT.
  std::map<int, std::tuple<int, int, std::string>> cpus;
  for (int c = 0; c < 8; ++c) cpus[c] = {c % 2, c / 2, std::to_string(c)};
  FakeSys sys(cpus, {{0, "0,2,4,6"}, {1, "1,3,5,7"}});
  auto places = read_cpu_topology(sys.root.string(), {0, 1, 6, 7});
  CHECK(places[6].node == 0);
  CHECK(places[7].node == 1);
  CHECK(places[7].package == 1);
  CHECK(places[7].core == 3);
  CHECK(sys.order({0, 1, 2, 3, 4, 5, 6, 7}) == std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7});
  // Each slot's core comes with its node, for the scheduler's NUMA preference.
  CHECK(sysfs_slot_cores(sys.root.string(), {5, 0, 1}).nodes == std::vector<int>{0, 1, 1});
}

TEST_CASE("without topology files the order is numeric") {
  FakeSys empty({}, {});
  const auto places = read_cpu_topology(empty.root.string(), {3, 1, 2});
  CHECK(places.at(1).thread == 0);
  CHECK(empty.order({3, 1, 2}) == std::vector<int>{1, 2, 3});
  CHECK(slot_order({2, 0, 1}, {}) == std::vector<int>{0, 1, 2});
  // Nor NUMA nodes: unknown, not node 0 (memory is never bound to a node that was guessed).
  CHECK(places.at(1).node == -1);
  CHECK(sysfs_slot_cores(empty.root.string(), {3, 1, 2}).nodes.empty());
}

TEST_SUITE_END();
