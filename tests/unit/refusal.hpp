// What a refused request threw, for unit tests of the daemon's handlers and owners: its code, and
// its message where asked. A call that throws nothing fails the test.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "common/error.hpp"

namespace gpuq::testing {

inline ErrorCode refusal(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const RequestError& e) {
    if (message) *message = e.what();
    return e.code();
  }
  FAIL("not refused");
  return ErrorCode::internal;
}
inline ErrorCode refusal(const std::function<void()>& f, std::string& message) { return refusal(f, &message); }

}  // namespace gpuq::testing
