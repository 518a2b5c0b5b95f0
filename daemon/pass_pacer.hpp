// When gpuqd's scheduling passes run. Anything that may let a job start (a submit, a job's end, a
// release, a GPU back in service) asks for one soon; asks before it runs are one pass. A pass may
// also say when something changes by itself (a retry's backoff ends, a launch that could not
// start is tried again): then a pass runs at that time even if nothing asks. A pass that throws
// (a store write failed) is run again after `retry_s`.
#pragma once

#include <functional>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>

namespace gpuq::daemon {

class PassPacer {
 public:
  PassPacer(boost::asio::io_context& io, std::function<void()> pass, double retry_s);

  // A pass soon: posted to gpuqd's loop, unless one is posted already.
  void soon();
  // A pass at wall time `when` (`now`: the wall time now), replacing the one a pass asked for
  // before (the latest pass knows best).
  void at(double when, double now);

 private:
  void run();
  void wait(double seconds);

  boost::asio::io_context& m_io;
  std::function<void()> m_pass;
  double m_retry_s;
  bool m_posted = false;
  boost::asio::steady_timer m_timer;
};

}  // namespace gpuq::daemon
