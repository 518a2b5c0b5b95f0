// Waiting for a descriptor to read ready (a pidfd: its process ended) where the wait's completion
// alone cannot be taken for it. Boost.Asio's epoll reactor (1.74, Debian 12's) hands a descriptor
// it closed back to the next one registered while that closed one's readiness, from the same
// epoll_wait, is still queued: the queued readiness then completes the new descriptor's wait. A
// client's hang-up closed its connection in one turn, the supervisor of the attempt started in the
// same turn got the freed state, and its pidfd's wait completed at once: gpuqd took the attempt
// for ended and killed it (two to six times in ten under load, the daemon-death test). Reads and
// accepts do their call and go on waiting on EAGAIN; a wait has no call to do, so it looks.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <poll.h>

#include <boost/asio.hpp>

namespace gpuq::daemon {

// Whether `fd` reads ready now (or is in error, or hung up): poll(2), not waiting.
inline bool readable_now(int fd) {
  pollfd p{fd, POLLIN, 0};
  int n = 0;
  while ((n = ::poll(&p, 1, 0)) < 0 && errno == EINTR) {
  }
  return n != 0;  // an error of poll's own is taken for ready: the caller looks at the descriptor
}

// Calls `done(ec)` once `d` reads ready, or with the error that ended the wait (operation_aborted
// once `d` is closed or destroyed: `d` is not touched then). A completion that finds `d` not ready
// waits again.
template <class Handler>
void when_readable(boost::asio::posix::stream_descriptor& d, Handler done) {
  d.async_wait(boost::asio::posix::stream_descriptor::wait_read,
               [&d, done = std::move(done)](const boost::system::error_code& ec) mutable {
                 if (!ec && !readable_now(d.native_handle())) return when_readable(d, std::move(done));
                 done(ec);
               });
}

}  // namespace gpuq::daemon
