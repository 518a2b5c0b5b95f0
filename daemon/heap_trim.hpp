// Memory given back: glibc keeps what gpuqd freed (a 100,000-job batch submitted and cancelled
// left it at 330-380 MiB until a restart, against ~10 MiB fresh) for reuse instead of returning it
// to the kernel. Every k_period_s this looks at the heap, and where enough of it lies free (what
// big batches, replies and parses leave), returns it (malloc_trim). A trim walks the heap, so it
// runs only where it pays.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstddef>

namespace gpuq::daemon {

// Whether a heap with `free_bytes` free and `used_bytes` in use is worth trimming, when
// `free_after_last` was free after the last trim (0 before one): 8 MiB more free since, and at
// least as much free as in use.
bool worth_trimming(std::size_t free_bytes, std::size_t used_bytes, std::size_t free_after_last = 0);

class HeapTrim {
 public:
  static constexpr double k_period_s = 10;
  explicit HeapTrim(boost::asio::io_context& io);
  // Looks now, and trims where worth_trimming says so; true when it trimmed.
  bool look();

 private:
  void arm();
  boost::asio::steady_timer m_timer;
  std::size_t m_free_after_last = 0;  // the heap's free bytes after the last trim
};

}  // namespace gpuq::daemon
