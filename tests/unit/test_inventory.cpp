// GPU inventory: fake GPUs and CUDA_VISIBLE_DEVICES filtering as CUDA does it.
#include <doctest/doctest.h>

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
  for (auto bad : {"fake:", "fake:x", "fake:2:0", "fake:2:10:3", "gpus", "fake:-1"}) {
    auto inv = Inventory::create(bad, std::nullopt);
    REQUIRE_FALSE(inv.ok());
    CHECK(inv.error().message.find("--gpus") != std::string::npos);
  }
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

TEST_SUITE_END();
