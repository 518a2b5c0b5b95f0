// gpuq-shim --serve (supervisor/serve.hpp), driven in-process: the server forked from this test,
// and gpuqd's side of the socket written out here, so that the test can do what gpuqd never does
// (take an answer and not act on it).
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "common/paths.hpp"
#include "daemon/executor.hpp"
#include "supervisor/serve.hpp"
#include "temp_dir.hpp"

namespace {

using json = nlohmann::json;
using gpuq::testing::TempDir;

struct Answer {
  json body;
  std::vector<int> fds;  // the go-ahead, then the pidfd
};

// A server on one end of a socket pair, forked from this process; ends when the other end closes.
struct Server {
  int sock = -1;
  pid_t pid = 0;
  char title[512] = "gpuq-shim";  // room for the supervisors' command lines

  Server() {
    int pair[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
    std::fflush(nullptr);  // a supervisor ends with exit(), which would write what is buffered again
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(pair[0]);
      ::_exit(gpuq::supervisor::serve(pair[1], {title, sizeof(title)}));
    }
    ::close(pair[1]);
    sock = pair[0];
  }
  ~Server() {
    ::close(sock);  // the server ends at that
    int status = -1;
    ::waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  Answer ask(const json& request) {
    const std::string text = request.dump();
    REQUIRE(::send(sock, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()));
    gpuq::supervisor::Received got = gpuq::supervisor::receive(sock);
    REQUIRE(got.size > 0);
    REQUIRE_FALSE(got.cut);
    Answer a{json::parse(got.text), std::move(got.fds)};
    return a;
  }
};

// Waits (at most a minute) for the process behind `pidfd` to end.
void wait_for_end(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 60000) == 1);
}

// An attempt whose one rank appends a line to `ran`; with `claim`, as gpuqd launches one.
std::string write_launch(const std::string& dir, bool claim = false) {
  const json doc = {{"ranks", json::array({{{"rank", 0},
                                            {"argv", {"/bin/sh", "-c", "echo ran >> " + dir + "/ran"}},
                                            {"env", {{"PATH", "/usr/bin:/bin"}}},
                                            {"cwd", dir},
                                            {"log", dir + "/rank-0.log"}}})},
                    {"pid_file", dir + "/shim.pid"},
                    {"claim", claim},
                    {"exit_file", dir + "/exit.json"}};
  std::ofstream(dir + "/launch.json") << doc.dump();
  return dir + "/launch.json";
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The state letter of process `pid` (/proc/PID/stat's third field), '?' where there is none.
char process_state(pid_t pid) {
  const std::string stat = read("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

}  // namespace

TEST_CASE(
    "a supervisor the server forks begins at gpuqd's go-ahead, and one whose answer gpuqd dropped starts nothing") {
  TempDir dir("gpuq-serve");
  const std::string launch = write_launch(dir.path);
  Server server;

  // Dropped: gpuqd closes the go-ahead unwritten (it never got the answer, or died with it).
  Answer dropped = server.ask({{"launch", launch}, {"cgroups", json::array()}});
  REQUIRE(dropped.body.value("pid", 0) > 0);
  REQUIRE(dropped.body.value("pidfd", false));
  REQUIRE(dropped.fds.size() == 2);
  ::close(dropped.fds[0]);
  wait_for_end(dropped.fds[1]);
  ::close(dropped.fds[1]);
  CHECK_FALSE(gpuq::common::path_exists(dir.path + "/shim.pid"));
  CHECK_FALSE(gpuq::common::path_exists(dir.path + "/ran"));

  // Acted on: it runs the attempt once, and records it.
  Answer go = server.ask({{"launch", launch}, {"cgroups", json::array()}});
  REQUIRE(go.fds.size() == 2);
  REQUIRE(::write(go.fds[0], "g", 1) == 1);
  ::close(go.fds[0]);
  wait_for_end(go.fds[1]);
  ::close(go.fds[1]);
  CHECK(read(dir.path + "/ran") == "ran\n");
  const json record = json::parse(read(dir.path + "/exit.json"));
  CHECK(record["ranks"][0]["exit_code"] == 0);
  CHECK(json::parse(read(dir.path + "/shim.pid"))["pid"] == go.body["pid"]);
}

TEST_CASE("the server answers a request it cannot take with an error, and goes on serving") {
  Server server;
  for (const json& bad : {json{{"launch", "relative/launch.json"}}, json{{"cgroups", json::array()}},
                          json{{"launch", "/a/launch.json"}, {"cgroups", {{"/cg", "yes"}}}}, json::array()}) {
    Answer a = server.ask(bad);
    CHECK(a.body.contains("error"));
    CHECK(a.fds.empty());
  }
  // No room to name the supervisor of this one in the command line: gpuqd execs it instead.
  Answer long_path = server.ask({{"launch", "/" + std::string(600, 'x') + "/launch.json"}});
  CHECK(long_path.body.value("error", "").find("no room") != std::string::npos);
  CHECK(long_path.fds.empty());
}

TEST_CASE("a supervisor late for its attempt finds it withdrawn by a restarted gpuqd, and starts nothing") {
  TempDir dir("gpuq-serve");
  const std::string launch = write_launch(dir.path, true);
  Server server;
  Answer late = server.ask({{"launch", launch}, {"cgroups", json::array()}});
  REQUIRE(late.fds.size() == 2);
  const pid_t child = late.body["pid"].get<pid_t>();
  // gpuqd gives the go-ahead and dies; the supervisor has not run since (held here).
  REQUIRE(::kill(child, SIGSTOP) == 0);
  for (int i = 0; i < 6000 && process_state(child) != 'T'; ++i)
    ::usleep(10000);
  REQUIRE(process_state(child) == 'T');
  REQUIRE(::write(late.fds[0], "g", 1) == 1);
  ::close(late.fds[0]);

  // The restarted gpuqd finds no pid file: the attempt never started, and is withdrawn.
  boost::asio::io_context io;
  auto gpuqd = gpuq::daemon::make_local_executor(io, "/nonexistent/gpuq-shim", [](std::int64_t) {});
  gpuq::daemon::Executor::Attempt attempt;
  attempt.id = 1;
  attempt.dir = dir.path;
  attempt.owner = ::geteuid();
  CHECK(gpuqd->adopt(attempt) == gpuq::daemon::Executor::Found::never_started);
  const std::string claimed = read(dir.path + "/shim.pid");
  CHECK(json::parse(claimed).value("withdrawn_by", 0) == ::getpid());

  // The supervisor goes on, and starts nothing: the attempt runs again under another number.
  REQUIRE(::kill(child, SIGCONT) == 0);
  wait_for_end(late.fds[1]);
  ::close(late.fds[1]);
  CHECK_FALSE(gpuq::common::path_exists(dir.path + "/ran"));
  CHECK_FALSE(gpuq::common::path_exists(dir.path + "/exit.json"));
  CHECK(read(dir.path + "/shim.pid") == claimed);
  // Asked again, the same: withdrawn, never started (a gpuqd that died before recording that).
  CHECK(gpuqd->adopt(attempt) == gpuq::daemon::Executor::Found::never_started);
}
