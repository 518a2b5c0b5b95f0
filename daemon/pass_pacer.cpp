// When scheduling passes run (pass_pacer.hpp).
#include "daemon/pass_pacer.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <iostream>

namespace gpuq::daemon {

PassPacer::PassPacer(boost::asio::io_context& io, std::function<void()> pass, double retry_s)
    : m_io(io), m_pass(std::move(pass)), m_retry_s(retry_s), m_timer(io) {}

void PassPacer::soon() {
  if (m_posted) return;
  m_posted = true;
  boost::asio::post(m_io, [this] { run(); });
}

void PassPacer::run() {
  m_posted = false;
  try {
    m_pass();
  } catch (const std::exception& e) {
    std::cerr << "gpuqd: scheduling pass failed: " << e.what() << "; trying again in " << m_retry_s << " s\n";
    wait(m_retry_s);
  }
}

void PassPacer::at(double when, double now) { wait(when - now); }

void PassPacer::wait(double seconds) {
  // A millisecond late rather than early: a backoff that ends at `when` has ended by then.
  m_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(std::max(0.0, seconds) * 1000) + 1));
  m_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) soon();
  });
}

}  // namespace gpuq::daemon
