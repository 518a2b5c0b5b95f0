// Running another program to its end, bounded (common/command.hpp): Slurm's commands for gpuqd,
// the PNG painter for gpuq.
#include <doctest/doctest.h>

#include <string>

#include "common/command.hpp"

using gpuq::common::run_command;

TEST_SUITE_BEGIN("command");

TEST_CASE("a program's input is fed while its output is read: a megabyte through cat neither deadlocks nor is cut") {
  std::string big(1 << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 997) big[i] = '\n';
  const auto r = run_command({"cat"}, 60, 2 << 20, big);
  CHECK(r.started);
  CHECK(r.exit_code == 0);
  CHECK(r.out == big);
  CHECK(r.err.empty());
}

TEST_CASE("output beyond the limit is cut, and stderr is kept apart") {
  const auto r = run_command({"sh", "-c", "head -c 100000 /dev/zero; echo oops >&2; exit 3"}, 60, 1000);
  CHECK(r.out.size() == 1000);
  CHECK(r.err == "oops\n");
  CHECK(r.exit_code == 3);
}

TEST_CASE("a program that reads none of its input, one that never ends, and one that does not exist") {
  const auto quick = run_command({"true"}, 60, 100, std::string(1 << 20, 'y'));  // EPIPE, not SIGPIPE
  CHECK(quick.started);
  CHECK(quick.exit_code == 0);

  const auto slow = run_command({"sleep", "30"}, 0.2);
  CHECK(slow.timed_out);
  CHECK(slow.signal == 9);
  CHECK(slow.exit_code == -1);

  const auto missing = run_command({"gpuq-no-such-program"});
  CHECK_FALSE(missing.started);
  CHECK(missing.err.find("cannot run gpuq-no-such-program") == 0);
}
