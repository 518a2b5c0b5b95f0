// Waiting for readiness that is real (daemon/readiness.hpp).
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <memory>

#include "daemon/readiness.hpp"

namespace asio = boost::asio;
using gpuq::daemon::when_readable;

namespace {
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { REQUIRE(::pipe(fds) == 0); }
  ~Pipe() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  int take_read_end() { return std::exchange(fds[0], -1); }
  void write_one() { REQUIRE(::write(fds[1], "x", 1) == 1); }
};
}  // namespace

TEST_CASE("a wait on a descriptor registered where a closed one's readiness is still queued waits for its own") {
  // In one epoll_wait, first `b` then `a` read ready; b's handler closes `a` and registers `c`,
  // which Asio's epoll reactor gives a's state, a's readiness still queued behind b's.
  asio::io_context io;
  Pipe a, b, c;
  asio::posix::stream_descriptor da(io, a.take_read_end()), db(io, b.take_read_end());
  std::unique_ptr<asio::posix::stream_descriptor> dc;
  int c_ended = 0;
  bool c_aborted = false;
  db.async_wait(asio::posix::stream_descriptor::wait_read, [&](const boost::system::error_code&) {
    da.close();
    dc = std::make_unique<asio::posix::stream_descriptor>(io, c.take_read_end());
    when_readable(*dc, [&](const boost::system::error_code& ec) {
      if (ec)
        c_aborted = true;
      else
        ++c_ended;
    });
  });
  da.async_wait(asio::posix::stream_descriptor::wait_read, [](const boost::system::error_code&) {});
  io.poll();  // both registered before they are ready
  b.write_one();
  a.write_one();
  io.run_for(std::chrono::milliseconds(300));
  REQUIRE(dc);
  CHECK(c_ended == 0);  // nothing was written to c
  // Once it is, the wait ends.
  c.write_one();
  io.restart();
  for (int i = 0; i < 100 && c_ended == 0; ++i)
    io.run_for(std::chrono::milliseconds(20));
  CHECK(c_ended == 1);
  // Closed while waiting: aborted, and the descriptor left alone.
  Pipe d;
  asio::posix::stream_descriptor dd(io, d.take_read_end());
  bool d_aborted = false;
  when_readable(dd, [&](const boost::system::error_code& ec) { d_aborted = ec == asio::error::operation_aborted; });
  io.restart();
  io.poll();
  dd.close();
  io.restart();
  io.run_for(std::chrono::milliseconds(100));
  CHECK(d_aborted);
  CHECK_FALSE(c_aborted);
}
