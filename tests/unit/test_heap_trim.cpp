// Memory given back (daemon/heap_trim.hpp).
#include <doctest/doctest.h>

#include <malloc.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "daemon/heap_trim.hpp"

using gpuq::daemon::HeapTrim;

namespace {
long resident_mib() {  // this process's resident set (/proc/self/statm's second field, in pages)
  std::ifstream in("/proc/self/statm");
  long size = 0, resident = 0;
  in >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE) / (1 << 20);
}
}  // namespace
using gpuq::daemon::worth_trimming;

TEST_CASE("the heap is trimmed only where much of it lies free: 8 MiB, and as much as is in use") {
  constexpr std::size_t MiB = 1 << 20;
  CHECK_FALSE(worth_trimming(0, 0));
  CHECK_FALSE(worth_trimming(7 * MiB, 1 * MiB));  // little free: not worth walking the heap for
  CHECK(worth_trimming(8 * MiB, 8 * MiB));
  CHECK_FALSE(worth_trimming(64 * MiB, 65 * MiB));  // in use, most of it: free is what it will reuse
  CHECK(worth_trimming(300 * MiB, 10 * MiB));       // a big batch, gone
  // Given back, it still counts as free: not walked again until 8 MiB more was freed since.
  CHECK_FALSE(worth_trimming(300 * MiB, 10 * MiB, 300 * MiB));
  CHECK_FALSE(worth_trimming(307 * MiB, 10 * MiB, 300 * MiB));
  CHECK(worth_trimming(308 * MiB, 10 * MiB, 300 * MiB));
  // ... or until what was given back came back: used and freed again between two looks.
  CHECK_FALSE(worth_trimming(300 * MiB, 10 * MiB, 300 * MiB, 7 * MiB));
  CHECK(worth_trimming(300 * MiB, 10 * MiB, 300 * MiB, 200 * MiB));
  CHECK_FALSE(worth_trimming(300 * MiB, 400 * MiB, 300 * MiB, 200 * MiB));  // now mostly in use
}

#if defined(__has_feature)  // clang's sanitizers, which replace malloc
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define GPUQ_MALLOC_REPLACED 1
#endif
#endif
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && !defined(GPUQ_MALLOC_REPLACED)
TEST_CASE("what a big batch left free is given back to the kernel at the next look, caches first") {
  // ~200 MiB of small blocks (below mmap's threshold: on the heap), all freed but the last, which
  // holds the heap's top: free() cannot give any of it back, a trim can.
  boost::asio::io_context io;
  int released = 0;  // the caches' release (the store's page cache): once, before the trim
  HeapTrim trim(io, [&] { ++released; });
  std::vector<void*> blocks;
  for (int i = 0; i < 200000; ++i) {
    blocks.push_back(std::malloc(1000));
    std::memset(blocks.back(), 1, 1000);  // resident
  }
  for (std::size_t i = 0; i + 1 < blocks.size(); ++i)
    std::free(blocks[i]);
  const long before = resident_mib();
  CHECK(trim.look());
  const long after = resident_mib();
  CHECK(before - after > 100);
  CHECK(released == 1);
  CHECK_FALSE(trim.look());  // nothing more lies free: no walk, no release
  CHECK(released == 1);
  std::free(blocks.back());
}

TEST_CASE("once no job is queued or running, what lies free is given back, however little") {
  boost::asio::io_context io;
  bool idle = false;
  int released = 0;
  HeapTrim trim(
      io, [&] { ++released; }, [&] { return idle; });
  trim.look();  // whatever the tests before left: from here, nothing new lies free
  const int before = released;
  CHECK_FALSE(trim.look());
  // 4 MiB used and freed, under worth_trimming's 8: kept while jobs run, given back once idle.
  auto fill = [] {
    std::vector<void*> blocks;
    for (int i = 0; i < 4000; ++i) {
      blocks.push_back(std::malloc(1000));
      std::memset(blocks.back(), 1, 1000);
    }
    void* top = std::malloc(1000);  // holds the heap's top: only a trim gives the rest back
    for (void* b : blocks)
      std::free(b);
    return top;
  };
  void* top = fill();
  CHECK_FALSE(trim.look());
  idle = true;
  CHECK(trim.look());
  CHECK(released == before + 1);
  std::free(top);
  top = fill();
  CHECK_FALSE(trim.look());  // still idle: given back once, when it became so
  std::free(top);
}
#endif
