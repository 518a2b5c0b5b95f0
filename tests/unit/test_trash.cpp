// The state dir's trash (daemon/trash.hpp): a job's files leave their place by one rename, are
// deleted on the trash's own thread, and what was freed comes back on gpuqd's; what a crash left
// is emptied. A temporary state dir of the test's own.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/error.hpp"
#include "daemon/trash.hpp"
#include "tests/unit/temp_dir.hpp"

using namespace gpuq::daemon;
namespace fs = std::filesystem;

namespace {

struct Bench {
  gpuq::testing::TempDir temp{"gpuq-unit-trash"};  // removed with all in it, after the rest is gone
  const std::string dir = temp.path;
  boost::asio::io_context io;
  // Keeps run_one_for() waiting for the trash's answer instead of finding no work and stopping.
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  // A job dir with a 1000-byte log and a checkpoint of `ckpt` bytes.
  std::string job(int id, std::size_t ckpt = 3000) {
    const std::string j = dir + "/jobs/" + std::to_string(id);
    fs::create_directories(j + "/checkpoints");
    std::ofstream(j + "/rank-0.log") << std::string(1000, 'x');
    std::ofstream(j + "/checkpoints/last.pt") << std::string(ckpt, 'c');
    return j;
  }
  // Runs gpuqd's loop until `done` has been called.
  template <class T>
  T wait(std::optional<T>& result) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!result) {
      if (std::chrono::steady_clock::now() > give_up) FAIL("the trash's answer did not come within 60 s");
      io.run_one_for(std::chrono::milliseconds(200));
    }
    return *result;
  }
};

}  // namespace

TEST_SUITE_BEGIN("trash");

TEST_CASE("a job's files leave their place at once, and their deletion answers with what it freed") {
  Bench b;
  Trash trash(b.io, b.dir);
  trash.make();
  const std::string one = b.job(1), two = b.job(2);
  const std::string to1 = trash.move(1, one, false), to2 = trash.move(2, two, false);
  CHECK_FALSE(fs::exists(one));
  CHECK(fs::exists(to1 + "/rank-0.log"));
  CHECK(to1 != to2);
  CHECK(fs::path(to1).parent_path() == fs::path(b.dir + "/trash"));
  std::optional<std::pair<std::int64_t, std::vector<std::int64_t>>> done;
  trash.empty({{1, to1}, {2, to2}}, [&](std::int64_t bytes, std::vector<std::int64_t> ids) { done.emplace(bytes, ids); });
  const auto [bytes, ids] = b.wait(done);
  CHECK(bytes >= 2 * 4000);
  CHECK(ids == std::vector<std::int64_t>{1, 2});
  CHECK_FALSE(fs::exists(to1));
  CHECK(fs::is_empty(b.dir + "/trash"));
}

TEST_CASE("checkpoints only: the directory stays in its place, emptied; an empty or missing one moves nothing") {
  Bench b;
  Trash trash(b.io, b.dir);
  trash.make();
  const std::string ckpt = b.job(3) + "/checkpoints";
  const std::string to = trash.move(3, ckpt, true);
  CHECK_FALSE(to.empty());
  CHECK(fs::is_directory(ckpt));
  CHECK(fs::is_empty(ckpt));
  CHECK(trash.move(3, ckpt, true).empty());                  // nothing left to free
  CHECK(trash.move(4, b.dir + "/jobs/4", false).empty());    // never there
  CHECK(fs::exists(b.dir + "/jobs/3/rank-0.log"));           // the rest of the job's files stay
}

TEST_CASE("a move the kernel refuses is an error naming the directory, and nothing moves") {
  Bench b;
  Trash trash(b.io, b.dir);  // no make(): the trash is not there
  const std::string one = b.job(5);
  try {
    trash.move(5, one, false);
    FAIL("moved into a trash that does not exist");
  } catch (const gpuq::RequestError& e) {
    CHECK(e.code() == gpuq::ErrorCode::store_error);
    CHECK(std::string(e.what()).find(one) != std::string::npos);
  }
  CHECK(fs::exists(one + "/rank-0.log"));
}

TEST_CASE("what a crash left in the trash is emptied at the next start") {
  Bench b;
  {
    Trash before(b.io, b.dir);
    before.make();
    before.move(6, b.job(6), false);
    before.move(7, b.job(7), false);
  }  // gpuqd stopped before emptying it
  REQUIRE_FALSE(fs::is_empty(b.dir + "/trash"));
  Trash after(b.io, b.dir);
  after.empty_leftover();
  std::optional<int> marker;  // the trash's thread runs its work in order: this comes after the leftovers
  after.empty({}, [&](std::int64_t, std::vector<std::int64_t>) { marker = 1; });
  b.wait(marker);
  CHECK(fs::is_empty(b.dir + "/trash"));
}

TEST_SUITE_END();
