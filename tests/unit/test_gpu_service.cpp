// GPUs in and out of service (daemon/gpu_service.hpp): drain and undrain by index or UUID, kept in
// the store, refusals that change nothing, and the note a job needing drained GPUs waits with.
// Fake GPUs and a store in memory.
#include <doctest/doctest.h>

#include "daemon/gpu_service.hpp"
#include "tests/unit/memory_store.hpp"
#include "tests/unit/refusal.hpp"

using namespace gpuq::daemon;

using gpuq::testing::refusal;

namespace {

struct Bench {
  boost::asio::io_context io;
  std::unique_ptr<Store> store;
  Inventory inventory;
  int changed = 0;

  Bench()
      : store(gpuq::testing::memory_store()),
        inventory(std::move(*Inventory::create("fake:3:16000", std::nullopt))) {}
  GpuService service(double interval_s = 0) {
    return GpuService(io, inventory, *store, interval_s, [this] { ++changed; });
  }
};

}  // namespace

TEST_SUITE_BEGIN("gpu service");

TEST_CASE("GPUs drained by index or UUID prefix stay drained, with their reasons, in the next gpuqd's view") {
  Bench b;
  {
    GpuService s = b.service();
    s.set_drained({{0}, {"GPU-fake0000-0000-0000-0000-000000000002"}, "fan failure"}, true);
    CHECK(b.changed == 1);
    CHECK(s.drained(b.inventory.gpus()[0].uuid));
    CHECK_FALSE(s.drained(b.inventory.gpus()[1].uuid));
    CHECK(s.drained().at(b.inventory.gpus()[2].uuid) == "fan failure");
  }
  GpuService again = b.service();  // a restarted gpuqd over the same store
  CHECK(again.drained().size() == 2);
  again.set_drained({{2}, {}, ""}, false);
  CHECK_FALSE(again.drained(b.inventory.gpus()[2].uuid));
  CHECK(b.service().drained().size() == 1);
  b.service().set_drained({{1}, {}, ""}, true);
  CHECK(b.service().drained().at(b.inventory.gpus()[1].uuid) == "drained with gpuq drain");
}

TEST_CASE("a request naming a GPU not here, or a UUID prefix naming several, is refused whole") {
  Bench b;
  GpuService s = b.service();
  std::string why;
  CHECK(refusal([&] { s.set_drained({{0, 7}, {}, ""}, true); }, why) == gpuq::ErrorCode::not_found);
  CHECK(why.find("no GPU 7; this machine has GPUs 0, 1, 2") != std::string::npos);
  CHECK(refusal([&] { s.set_drained({{0}, {"GPU-fake"}, ""}, true); }, why) == gpuq::ErrorCode::bad_request);
  CHECK(why.find("names GPUs 0 and 1; give more of it") != std::string::npos);
  CHECK(refusal([&] { s.set_drained({{}, {"GPU-real"}, ""}, true); }, why) == gpuq::ErrorCode::not_found);
  CHECK(s.drained().empty());  // GPU 0, named beside each bad one, was not drained either
  CHECK(b.store->drained_gpus().empty());
  CHECK(b.changed == 0);
}

TEST_CASE("a job needing more GPUs than are in service is told which are drained") {
  Bench b;
  GpuService s = b.service();
  CHECK(s.with_drain_note(3, "needs 3 GPUs; 2 here") == "needs 3 GPUs; 2 here");
  s.set_drained({{1}, {}, "bad"}, true);
  CHECK(s.with_drain_note(3, "needs 3 GPUs; 2 here") == "needs 3 GPUs; 2 here in service (GPU 1 drained)");
  CHECK(s.with_drain_note(2, "waits") == "waits");
}

TEST_CASE("health checks run only over NVML's GPUs and with an interval") {
  Bench b;
  GpuService s = b.service(5);
  s.start();  // fake GPUs: no health to read
  CHECK_FALSE(s.on());
  CHECK(s.checks() == 0);
  CHECK(s.xids_since({0}, 0).empty());
}

TEST_SUITE_END();
