// GPU inventory: fake GPUs and CUDA_VISIBLE_DEVICES filtering as CUDA does it.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "daemon/inventory.hpp"

using namespace gpuq::daemon;

TEST_SUITE_BEGIN("inventory");

TEST_CASE("fake GPUs have distinct indices, UUIDs and the given memory") {
  auto inv = Inventory::create("fake:3:1024", std::nullopt);
  REQUIRE(inv.ok());
  REQUIRE(inv->gpus().size() == 3);
  CHECK(inv->gpus()[2].index == 2);
  CHECK(inv->gpus()[2].memory_total_mb == 1024);
  CHECK(inv->gpus()[0].uuid != inv->gpus()[1].uuid);
  CHECK(inv->source() == "fake:3:1024");
  CHECK(inv->read().size() == 3);
  CHECK_FALSE(inv->read()[0].memory_used_mb.has_value());
}

TEST_CASE("bad --gpus values are refused with the expected form") {
  for (auto bad : {"fake:", "fake:x", "fake:2:0", "fake:2:10:3", "gpus", "fake:-1", "fake:2:10:0,", "fake:2:10:0,x",
                   "fake:2:10:0,0,0", "fake:2:10:0,0:", "fake:2:", "fake:4:81920x"}) {
    auto inv = Inventory::create(bad, std::nullopt);
    REQUIRE_FALSE(inv.ok());
    CHECK(inv.error().message.find("--gpus") != std::string::npos);
  }
}

TEST_CASE("fake GPUs sit on the NUMA nodes listed, one per GPU, and on none when no list is given") {
  auto inv = Inventory::create("fake:4:1024:0,0,1,1", std::nullopt);
  REQUIRE(inv.ok());
  CHECK(inv->gpus()[1].numa_node == 0);
  CHECK(inv->gpus()[2].numa_node == 1);
  CHECK(inv->source() == "fake:4:1024:0,0,1,1");
  CHECK(Inventory::create("fake:2", std::nullopt)->gpus()[1].numa_node == -1);
  CHECK(Inventory::create("fake:2", std::nullopt)->source() == "fake:2:81920");
  auto short_list = Inventory::create("fake:3:1024:0,1", std::nullopt);
  REQUIRE_FALSE(short_list.ok());
  CHECK(short_list.error().message.find("2 NUMA node(s) for 3 GPU(s)") != std::string::npos);
}

TEST_CASE("a PCI device's NUMA node comes from sysfs; -1 there, or no device, is unknown") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("gpuq-unit-pci-" + std::to_string(::getpid()));
  fs::create_directories(root / "bus/pci/devices/0000:3b:00.0");
  fs::create_directories(root / "bus/pci/devices/0001:c1:1f.0");
  std::ofstream(root / "bus/pci/devices/0000:3b:00.0/numa_node") << "1\n";
  std::ofstream(root / "bus/pci/devices/0001:c1:1f.0/numa_node") << "-1\n";
  CHECK(pci_numa_node(root.string(), 0, 0x3b, 0) == 1);
  CHECK(pci_numa_node(root.string(), 1, 0xc1, 0x1f) == -1);
  CHECK(pci_numa_node(root.string(), 0, 0x5e, 0) == -1);
  fs::remove_all(root);
}

TEST_CASE("zero GPUs is a valid machine") {
  auto inv = Inventory::create("none", std::nullopt);
  REQUIRE(inv.ok());
  CHECK(inv->gpus().empty());
  auto fake0 = Inventory::create("fake:0", std::nullopt);
  REQUIRE(fake0.ok());
  CHECK(fake0->gpus().empty());
}

TEST_CASE("CUDA_VISIBLE_DEVICES limits the GPUs by index or UUID, in its order") {
  auto inv = Inventory::create("fake:4", std::string("3,1"));
  REQUIRE(inv.ok());
  REQUIRE(inv->gpus().size() == 2);
  CHECK(inv->gpus()[0].index == 3);
  CHECK(inv->gpus()[1].index == 1);
  CHECK(inv->find(1) != nullptr);
  CHECK(inv->find(0) == nullptr);
  auto all = Inventory::create("fake:4", std::nullopt)->gpus();
  auto by_uuid = filter_visible(all, all[2].uuid.substr(0, all[2].uuid.size()));
  REQUIRE(by_uuid.size() == 1);
  CHECK(by_uuid[0].index == 2);
}

TEST_CASE("CUDA_VISIBLE_DEVICES parsing stops at the first invalid entry, as CUDA does") {
  auto all = Inventory::create("fake:4", std::nullopt)->gpus();
  CHECK(filter_visible(all, "0,7,1").size() == 1);
  CHECK(filter_visible(all, "").empty());
  CHECK(filter_visible(all, "-1").empty());
  CHECK(filter_visible(all, "1,1,2").size() == 2);
}

TEST_CASE("auto without an NVIDIA driver means no GPUs, not an error") {
  auto inv = Inventory::create("auto", std::nullopt);
  REQUIRE(inv.ok());
  if (inv->source() != "nvml") CHECK(inv->gpus().empty());
}

TEST_CASE("a GPU is unhealthy when lost, after an Xid that needs a reset, when row remapping failed, or with new uncorrectable ECC errors") {
  CHECK(health_problem({}, std::nullopt).empty());
  CHECK(health_problem({false, 0, false, {}}, 0).empty());
  CHECK(health_problem({false, 4, false, {}}, 4).empty());  // errors it had when last found healthy
  CHECK(health_problem({false, 3, false, {}}, 4).empty());  // a count reset by a driver reload
  CHECK(health_problem({false, 6, false, {}}, 4) == "2 new uncorrectable ECC errors");
  CHECK(health_problem({false, 1, false, {}}, std::nullopt) == "1 new uncorrectable ECC error");
  CHECK(health_problem({false, std::nullopt, true, {}}, std::nullopt) == "memory row remapping failed");
  CHECK(health_problem({true, std::nullopt, false, {}}, 0) == "the GPU is lost (fell off the bus; NVML_ERROR_GPU_IS_LOST)");
  CHECK(health_problem({true, 9, true, {}}, 0).find("lost") != std::string::npos);  // the gravest first
  // Xids: the application's own (13, 31, 43, 45) and a contained ECC error (94) leave the GPU in service.
  CHECK(health_problem({false, 0, false, {13, 31, 43, 45, 94}}, 0).empty());
  CHECK(health_problem({false, 0, false, {13, 79, 48}}, 0) == "Xid 79: the GPU fell off the bus");
  CHECK(health_problem({false, 0, true, {95}}, 0) == "Xid 95: uncontained ECC error");
  for (std::uint64_t xid : {48, 62, 64, 74, 79, 95, 119, 120, 140})
    CHECK(xid_problem(xid).rfind("Xid " + std::to_string(xid) + ": ", 0) == 0);
  for (std::uint64_t xid : {8, 13, 31, 43, 45, 63, 92, 94, 109, 999}) CHECK(xid_problem(xid).empty());
}

TEST_CASE("every Xid has words for a failed job's reason: the catalog's meaning where gpuq knows it") {
  CHECK(xid_words(31) == "Xid 31 (GPU memory page fault: often an illegal address in the application)");
  CHECK(xid_words(79) == "Xid 79 (the GPU fell off the bus)");
  CHECK(xid_words(999) == "Xid 999");
}

TEST_CASE("fake GPUs are always healthy") {
  auto inv = Inventory::create("fake:2", std::nullopt);
  REQUIRE(inv.ok());
  const auto health = inv->health();
  REQUIRE(health.size() == 2);
  for (const auto& h : health) CHECK(health_problem(h, std::nullopt).empty());
}

TEST_CASE("the device nodes a job may not open: every GPU's but its own, and /dev/nvidiaN that gpuqd does not serve") {
  std::vector<Gpu> gpus(3);
  for (int i = 0; i < 3; ++i) {
    gpus[static_cast<std::size_t>(i)].index = i;
    gpus[static_cast<std::size_t>(i)].minor = 10 + i;  // NVML's minor numbers need not be the indices
  }
  const std::string none = "/nonexistent-dev";
  using Devices = std::vector<std::pair<unsigned, unsigned>>;
  gpus.pop_back();  // gpuqd serves GPUs 0 and 1 (minors 10, 11)
  CHECK(denied_gpu_devices(gpus, {0}, none) == Devices{{195, 11}});
  CHECK(denied_gpu_devices(gpus, {0, 1}, none).empty());
  CHECK(denied_gpu_devices(gpus, {}, none) == Devices{{195, 10}, {195, 11}});  // a CPU job: none of them

  // A /dev with GPU nodes: one of a GPU gpuqd does not serve (minor 12) is denied too; control
  // nodes, other majors and files that are no device are not GPUs.
  char tmpl[] = "/tmp/gpuq-unit-dev-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string dev = tmpl;
  const auto node = [&](const std::string& name, unsigned major_no, unsigned minor_no) {
    return ::mknod((dev + "/" + name).c_str(), S_IFCHR | 0600, makedev(major_no, minor_no)) == 0;
  };
  if (node("nvidia10", 195, 10)) {
    REQUIRE(node("nvidia12", 195, 12));
    REQUIRE(node("nvidiactl", 195, 255));
    REQUIRE(node("nvidia13", 10, 13));  // not NVIDIA's major
    std::ofstream(dev + "/nvidia14") << "";
    CHECK(denied_gpu_devices(gpus, {0}, dev) == Devices{{195, 11}, {195, 12}});
    CHECK(denied_gpu_devices(gpus, {1}, dev) == Devices{{195, 10}, {195, 12}});
    // A node made since (the driver makes them at a first use): /dev is listed once it settled
    // (its mtime two seconds old: kept), and again once it changed.
    const timespec long_ago[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 60, 0}};
    REQUIRE(::utimensat(AT_FDCWD, dev.c_str(), long_ago, 0) == 0);
    CHECK(denied_gpu_devices(gpus, {1}, dev) == Devices{{195, 10}, {195, 12}});
    REQUIRE(node("nvidia15", 195, 15));
    CHECK(denied_gpu_devices(gpus, {1}, dev) == Devices{{195, 10}, {195, 12}, {195, 15}});
    // One made within the same clock tick as a listing leaves the mtime as it was: a listing of a
    // directory changed in the last two seconds (or stamped ahead, as here: however slow this
    // run) is not kept.
    const timespec just_now[2] = {{0, UTIME_OMIT}, {::time(nullptr) + 3600, 0}};
    REQUIRE(::utimensat(AT_FDCWD, dev.c_str(), just_now, 0) == 0);
    CHECK(denied_gpu_devices(gpus, {1}, dev) == Devices{{195, 10}, {195, 12}, {195, 15}});
    REQUIRE(node("nvidia16", 195, 16));
    REQUIRE(::utimensat(AT_FDCWD, dev.c_str(), just_now, 0) == 0);  // as if in the same tick
    CHECK(denied_gpu_devices(gpus, {1}, dev) == Devices{{195, 10}, {195, 12}, {195, 15}, {195, 16}});
    // A GPU whose minor NVML did not give may be any node: the scan denies none (it could be the job's).
    Gpu unknown;
    unknown.index = 2;
    gpus.push_back(unknown);
    CHECK(denied_gpu_devices(gpus, {2}, dev) == Devices{{195, 10}, {195, 11}});
  } else {
    MESSAGE("mknod needs CAP_MKNOD: the /dev part is skipped");
  }
  std::filesystem::remove_all(dev);
}

TEST_SUITE_END();
