// Memory given back: glibc keeps what gpuqd freed (a 100,000-job batch submitted and cancelled
// left it at 330-380 MiB until a restart, against ~10 MiB fresh) for reuse instead of returning it
// to the kernel. Every k_period_s this looks at the heap (mallinfo2, which walks the free lists of
// every arena), and where enough of it lies free (what big batches, replies and parses leave),
// returns it (malloc_trim, a longer walk), so a trim runs only where it pays.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstddef>
#include <functional>

namespace gpuq::daemon {

// Whether a heap with `free_bytes` free and `used_bytes` in use is worth trimming: 8 MiB free at
// least and at least as much as in use, and since the last trim (`free_after_last` free after it,
// 0 before one) 8 MiB more free, or the resident set grown by 8 MiB (`resident_grew`: pages given
// back were used, and freed, again).
bool worth_trimming(std::size_t free_bytes, std::size_t used_bytes, std::size_t free_after_last = 0,
                    std::size_t resident_grew = 0);

// One malloc arena for all of gpuqd's threads (glibc gives each thread that allocates an arena of
// its own, up to 8 a core): the threads that check a batch or checkpoint the store otherwise keep
// arenas whose free pages lie between the few blocks still live there (9 MiB of a 100,000-job
// batch's after its cancel and the trim, against 0.1 MiB fresh). gpuqd's threads seldom allocate
// at once (a batch of 99,856 was submitted no slower). And blocks of 1 MiB or more mapped of their
// own, given back when freed: glibc raises that threshold to the largest block freed (up to 32
// MiB), after which a reply's 8 MiB went on the heap and stayed resident once freed (30 replies
// made for clients that were then dropped left 100 MiB resident, against 25 MiB so). Before any
// thread starts.
void use_one_arena();

class HeapTrim {
 public:
  static constexpr double k_period_s = 10;
  // `release`: gives back caches (the store's page cache) before a trim, so their pages go too.
  // `idle`: whether no job is queued or running; a look that finds gpuqd newly idle trims what
  // lies free whatever worth_trimming says (1 MiB at least): once the work is done, its memory
  // goes, however it was left (a batch that ran frees less at once than one cancelled).
  explicit HeapTrim(boost::asio::io_context& io, std::function<void()> release = {}, std::function<bool()> idle = {});
  // Looks now, and trims where worth_trimming says so; true when it trimmed.
  bool look();

 private:
  void arm();
  boost::asio::steady_timer m_timer;
  std::function<void()> m_release;
  std::function<bool()> m_idle;
  bool m_was_idle = true;                 // at the last look (fresh: nothing to give back)
  std::size_t m_free_after_last = 0;      // the heap's free bytes after the last trim
  std::size_t m_resident_after_last = 0;  // this process's resident set after it
};

}  // namespace gpuq::daemon
