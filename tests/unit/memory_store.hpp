// A store in SQLite's memory for a unit test: nothing on disk, gone with the test. The test case
// fails where it cannot be opened.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <utility>

#include "daemon/store.hpp"

namespace gpuq::testing {

inline std::unique_ptr<gpuq::daemon::Store> memory_store() {
  auto opened = gpuq::daemon::Store::open(":memory:");
  REQUIRE(opened);
  return std::move(*opened);
}

}  // namespace gpuq::testing
