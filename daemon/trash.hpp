// The state dir's trash: ended jobs' files leave their place by one rename (instant, so a
// restarted job finds its place free at once) and are deleted on a thread of the trash's own, so
// gpuqd goes on serving while thousands of directories are deleted. What a crash leaves in the
// trash is emptied at the next start. Used by `clean` and `restart --fresh`; unit-tested alone
// (tests/unit/test_trash.cpp).
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gpuq::daemon {

class Trash {
 public:
  Trash(boost::asio::io_context& io, std::string state_dir);
  ~Trash();  // waits for a deletion under way (those not begun are left for the next start)

  // (job id, its files' place in the trash); id 0: not a job's (what a crash left).
  using Moved = std::vector<std::pair<std::int64_t, std::string>>;
  // What a deletion freed, and the jobs whose files it deleted (ids above 0), in order.
  using Done = std::function<void(std::int64_t bytes_freed, std::vector<std::int64_t> cleaned)>;

  // Makes the trash, where missing. Throws RequestError (store_error) when it cannot.
  void make();
  // Moves job `id`'s `dir` into the trash (make() first): one rename. Returns its place there, or
  // "" when `dir` is missing (or, with keep_dir, empty); throws RequestError (store_error) naming
  // `dir`. With keep_dir an empty `dir` is left in its place.
  std::string move(std::int64_t id, const std::string& dir, bool keep_dir);
  // Deletes `moved` on the trash's thread; then calls `done`, where given, on the io_context's.
  void empty(Moved moved, Done done = {});
  // Empties what a crash left in the trash.
  void empty_leftover();

 private:
  boost::asio::io_context& m_io;
  std::string m_dir;
  std::uint64_t m_seq = 0;  // with the job id and gpuqd's pid, a name in the trash no other has
  boost::asio::thread_pool m_thread{1};
};

}  // namespace gpuq::daemon
