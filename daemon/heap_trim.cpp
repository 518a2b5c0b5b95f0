// Memory given back (heap_trim.hpp).
#include "daemon/heap_trim.hpp"

#include <malloc.h>

#include <chrono>

namespace gpuq::daemon {

bool worth_trimming(std::size_t free_bytes, std::size_t used_bytes, std::size_t free_after_last) {
  return free_bytes >= free_after_last + (std::size_t{8} << 20) && free_bytes >= used_bytes;
}

HeapTrim::HeapTrim(boost::asio::io_context& io) : m_timer(io) {
  arm();
}

bool HeapTrim::look() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = ::mallinfo2();  // every arena: the store's threads' too
  // What was given back still counts as free here, so a heap that only shrank is not walked again.
  if (m.fordblks < m_free_after_last) m_free_after_last = m.fordblks;
  if (!worth_trimming(m.fordblks, m.uordblks, m_free_after_last)) return false;
  m_free_after_last = m.fordblks;
  return ::malloc_trim(0) != 0;
#endif
  return false;
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
