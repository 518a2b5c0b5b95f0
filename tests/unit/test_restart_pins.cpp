// The jobs restarts under way hold (daemon/restart_pins.hpp): a job is pinned by one restart at a
// time, counted against its owner until unpinned; a job several restarts need stays needed until
// each has released it.
#include <doctest/doctest.h>

#include <vector>

#include "daemon/restart_pins.hpp"

using namespace gpuq::daemon;

TEST_SUITE_BEGIN("restart pins");

TEST_CASE("a job is pinned once, counted against its owner, and let go when unpinned") {
  RestartPins pins;
  CHECK(pins.pin(1, 1000));
  CHECK(pins.pin(2, 1000));
  CHECK(pins.pin(3, 2000));
  CHECK_FALSE(pins.pin(1, 1000));  // another restart has it
  CHECK(pins.pinned_of(1000) == 2);
  CHECK(pins.pinned(1));
  pins.unpin(1);
  pins.unpin(1);  // twice: nothing more
  CHECK_FALSE(pins.pinned(1));
  CHECK(pins.pinned_of(1000) == 1);
  pins.unpin(2);
  CHECK(pins.pinned_of(1000) == 0);
  std::vector<std::int64_t> all;
  pins.for_each_pinned([&](std::int64_t id) { all.push_back(id); });
  CHECK(all == std::vector<std::int64_t>{3});
}

TEST_CASE("a job needed by two restarts stays needed until both release it, and is listed once") {
  RestartPins pins;
  pins.need(9);
  pins.need(9);
  pins.need(4);
  std::vector<std::int64_t> needed;
  pins.for_each_needed([&](std::int64_t id) { needed.push_back(id); });
  CHECK(needed == std::vector<std::int64_t>{4, 9});
  pins.release(9);
  needed.clear();
  pins.for_each_needed([&](std::int64_t id) { needed.push_back(id); });
  CHECK(needed == std::vector<std::int64_t>{4, 9});
  pins.release(9);
  pins.release(9);  // once too often: nothing
  needed.clear();
  pins.for_each_needed([&](std::int64_t id) { needed.push_back(id); });
  CHECK(needed == std::vector<std::int64_t>{4});
}

TEST_SUITE_END();
