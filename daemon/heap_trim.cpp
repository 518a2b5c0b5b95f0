// Memory given back (heap_trim.hpp).
#include "daemon/heap_trim.hpp"

#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <utility>

namespace gpuq::daemon {

bool worth_trimming(std::size_t free_bytes, std::size_t used_bytes, std::size_t free_after_last,
                    std::size_t resident_grew) {
  constexpr std::size_t k_enough = std::size_t{8} << 20;
  if (free_bytes < k_enough || free_bytes < used_bytes) return false;
  return free_bytes >= free_after_last + k_enough || resident_grew >= k_enough;
}

namespace {
// This process's resident set in bytes (/proc/self/statm); 0 where it cannot be read.
std::size_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::size_t size = 0, pages = 0;
  if (!(in >> size >> pages)) return 0;
  return pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}
}  // namespace

void use_one_arena() {
#if defined(__GLIBC__)
  ::mallopt(M_ARENA_MAX, 1);
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

HeapTrim::HeapTrim(boost::asio::io_context& io, std::function<void()> release, std::function<bool()> idle)
    : m_timer(io), m_release(std::move(release)), m_idle(std::move(idle)) {
  arm();
}

bool HeapTrim::look() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = ::mallinfo2();  // every arena: the store's threads' too
  // What was given back still counts as free here, so a heap that only shrank is not walked again;
  // one whose given-back pages were used and freed again between two looks shows in the resident set.
  if (m.fordblks < m_free_after_last) m_free_after_last = m.fordblks;
  const std::size_t resident = resident_bytes();
  const std::size_t grew = resident > m_resident_after_last ? resident - m_resident_after_last : 0;
  const bool idle = m_idle && m_idle();
  const bool went_idle = idle && !m_was_idle;
  m_was_idle = idle;
  if (!(went_idle && m.fordblks >= (std::size_t{1} << 20)) &&
      !worth_trimming(m.fordblks, m.uordblks, m_free_after_last, grew))
    return false;
  if (m_release) m_release();
  m_free_after_last = ::mallinfo2().fordblks;
  const bool trimmed = ::malloc_trim(0) != 0;
  m_resident_after_last = resident_bytes();
  return trimmed;
#else
  (void)m_free_after_last, (void)m_resident_after_last;
  return false;
#endif
}

void HeapTrim::arm() {
  m_timer.expires_after(std::chrono::milliseconds(static_cast<int>(k_period_s * 1000)));
  m_timer.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    look();
    arm();
  });
}

}  // namespace gpuq::daemon
