// When scheduling passes run (pass_pacer.hpp): asks before a pass are one pass, a pass asked for
// at a time runs then with nothing else asking, and a pass that throws runs again.
#include <doctest/doctest.h>

#include <chrono>
#include <stdexcept>

#include "common/process.hpp"
#include "daemon/pass_pacer.hpp"

using gpuq::daemon::PassPacer;

namespace {

// Runs the loop until `done` or 30 s (a bound: a pass that never comes fails the test).
template <class Done>
void run_until(boost::asio::io_context& io, Done done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    REQUIRE(std::chrono::steady_clock::now() < give_up);
    if (io.stopped()) io.restart();  // it ran out of work before: there is some again
    io.run_one_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

TEST_SUITE_BEGIN("pass_pacer");

TEST_CASE("asks before a pass runs are one pass; an ask during a pass is another") {
  boost::asio::io_context io;
  int passes = 0;
  PassPacer* self = nullptr;
  bool ask_during = false;
  PassPacer pacer(io, [&] {
    ++passes;
    if (std::exchange(ask_during, false)) self->soon();  // a pass that frees what another job needs
  }, 60);
  self = &pacer;
  pacer.soon();
  pacer.soon();
  pacer.soon();
  while (io.poll() > 0) {
  }
  CHECK(passes == 1);
  ask_during = true;
  pacer.soon();
  io.restart();  // it ran out of work above
  while (io.poll() > 0) {
  }
  CHECK(passes == 3);  // the one asked for, then the one it asked for
}

TEST_CASE("a pass asked for at a time runs then, nothing else asking; a later ask replaces an earlier one") {
  boost::asio::io_context io;
  int passes = 0;
  PassPacer pacer(io, [&] { ++passes; }, 60);
  const auto began = std::chrono::steady_clock::now();  // before the timer starts: a bound from below
  const double now = gpuq::common::wall_now();
  pacer.at(now + 3600, now);  // replaced below: it must not be what runs the pass
  pacer.at(now + 0.05, now);
  run_until(io, [&] { return passes == 1; });
  CHECK(std::chrono::steady_clock::now() - began >= std::chrono::milliseconds(50));  // not before its time
  // A time already past: at once.
  pacer.at(now - 10, now);
  run_until(io, [&] { return passes == 2; });
}

TEST_CASE("a pass that throws (a store write failed) is run again after the retry delay") {
  boost::asio::io_context io;
  int passes = 0;
  PassPacer pacer(io, [&] {
    if (++passes == 1) throw std::runtime_error("state store: database or disk is full");
  }, 0.05);
  pacer.soon();
  run_until(io, [&] { return passes == 2; });  // nothing asked again: the retry alone ran it
}

TEST_SUITE_END();
