// Capped rank logs: rotation keeps the newest output and bounds the disk a flood can take.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "supervisor/log_sink.hpp"

using gpuq::supervisor::LogSink;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST_SUITE_BEGIN("log_sink");

TEST_CASE("a capped log rotates to .1 and keeps the newest output, never more than twice the limit") {
  const std::string dir = "/tmp/gpuq-unit-log-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/rank-0.log";
  {
    LogSink sink(path, 1000);
    REQUIRE(sink.open().ok());
    for (int i = 0; i < 500; ++i) {
      std::string line = "line " + std::to_string(i) + "\n";
      sink.write(line.data(), line.size());
    }
    CHECK(sink.rotations() >= 3);
  }
  const auto current = slurp(path), older = slurp(path + ".1");
  CHECK(current.size() <= 1000);
  CHECK(older.size() <= 1000);
  CHECK(current.find("line 499\n") != std::string::npos);  // the newest output survives
  CHECK(current.rfind("[gpuq: log limit of 1000 bytes reached", 0) == 0);
  CHECK(current.find("the previous part is in rank-0.log.1") != std::string::npos);
  CHECK(older.find("line 0\n") == std::string::npos);  // the oldest was dropped
  std::filesystem::remove_all(dir);
}

TEST_CASE("without a limit nothing rotates, and the log is appended to") {
  const std::string path = "/tmp/gpuq-unit-log-" + std::to_string(::getpid()) + ".log";
  std::ofstream(path) << "before\n";
  {
    LogSink sink(path, 0);
    REQUIRE(sink.open().ok());
    std::string big(100000, 'x');
    sink.write(big.data(), big.size());
    CHECK(sink.rotations() == 0);
  }
  CHECK(std::filesystem::file_size(path) == 7 + 100000);
  CHECK_FALSE(std::filesystem::exists(path + ".1"));
  std::filesystem::remove(path);
}

TEST_CASE("an unwritable log path is an error naming the file") {
  LogSink sink("/nonexistent-dir/rank-0.log", 10);
  auto r = sink.open();
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("/nonexistent-dir/rank-0.log") != std::string::npos);
}

TEST_SUITE_END();
