// Running another program to its end, bounded (common/command.hpp): Slurm's commands for gpuqd,
// the PNG painter for gpuq.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>

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

TEST_CASE("a command gets the descriptor limit this process started with, not the one it raised; and no blocked signal") {
  rlimit l{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &l) == 0);
  const rlim_t before = l.rlim_cur;
  REQUIRE(before > 100);
  gpuq::common::set_children_descriptor_limit(100);
  const auto limited = run_command({"sh", "-c", "ulimit -n"});
  gpuq::common::set_children_descriptor_limit(RLIM_INFINITY);
  CHECK(limited.out == "100\n");
  CHECK(run_command({"sh", "-c", "ulimit -n"}).out == std::to_string(before) + "\n");
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &l) == 0);
  CHECK(l.rlim_cur == before);  // this process's own is untouched

  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &term, &old);
  const auto mask = run_command({"sh", "-c", "grep SigBlk /proc/self/status"});
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  CHECK(mask.out == "SigBlk:\t0000000000000000\n");
}
