// Memory given back: glibc keeps what gpuqd freed (a 100,000-job batch submitted and cancelled
// left it at 330-380 MiB until a restart, against ~10 MiB fresh) for reuse instead of returning it
// to the kernel. Every k_period_s this looks at the heap (mallinfo2, which walks the free lists of
// every arena), and where enough of it lies free (what big batches, replies and parses leave),
// returns it (malloc_trim, a longer walk), so a trim runs only where it pays.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstddef>

namespace gpuq::daemon {

// Whether a heap with `free_bytes` free and `used_bytes` in use is worth trimming: 8 MiB free at
// least and at least as much as in use, and since the last trim (`free_after_last` free after it,
// 0 before one) 8 MiB more free, or the resident set grown by 8 MiB (`resident_grew`: pages given
// back were used, and freed, again).
bool worth_trimming(std::size_t free_bytes, std::size_t used_bytes, std::size_t free_after_last = 0,
                    std::size_t resident_grew = 0);

class HeapTrim {
 public:
  static constexpr double k_period_s = 10;
  explicit HeapTrim(boost::asio::io_context& io);
  // Looks now, and trims where worth_trimming says so; true when it trimmed.
  bool look();

 private:
  void arm();
  boost::asio::steady_timer m_timer;
  std::size_t m_free_after_last = 0;      // the heap's free bytes after the last trim
  std::size_t m_resident_after_last = 0;  // this process's resident set after it
};

}  // namespace gpuq::daemon
