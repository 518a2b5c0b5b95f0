// Runs a program to its end, input given, output captured and bounded (see command.hpp).
#include "common/command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

extern char** environ;

namespace gpuq::common {

namespace {

// The two ends of a pipe, closed when they go out of scope.
struct Pipe {
  int fd[2] = {-1, -1};
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  bool open() { return ::pipe2(fd, O_CLOEXEC) == 0; }
  void close(int end) {
    if (fd[end] >= 0) ::close(fd[end]);
    fd[end] = -1;
  }
};

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv, double timeout_s, std::size_t max_bytes,
                          const std::optional<std::string>& input) {
  CommandResult r;
  if (argv.empty()) return r;
  Pipe in, out, err;
  if ((input && !in.open()) || !out.open() || !err.open()) return r.err = std::strerror(errno), r;
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  if (input) ::posix_spawn_file_actions_adddup2(&fa, in.fd[0], 0);
  else ::posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&fa, out.fd[1], 1);
  ::posix_spawn_file_actions_adddup2(&fa, err.fd[1], 2);
  posix_spawnattr_t attr;
  ::posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  ::posix_spawnattr_setsigmask(&attr, &none);  // gpuqd's blocked signals are not the command's
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, &attr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::posix_spawnattr_destroy(&attr);
  in.close(0), out.close(1), err.close(1);
  if (rc != 0) {
    r.err = "cannot run " + argv[0] + ": " + std::strerror(rc);
    return r;
  }
  r.started = true;

  // One poll over the input (written as the program takes it, so a program that answers before it
  // has read everything cannot deadlock us) and both outputs. MSG_NOSIGNAL does not apply to pipes:
  // a write to a program that has gone fails with EPIPE only while SIGPIPE is ignored.
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  if (input) {
    ::sigaction(SIGPIPE, &ignore, &old);
    ::fcntl(in.fd[1], F_SETFL, ::fcntl(in.fd[1], F_GETFL) | O_NONBLOCK);
    if (input->empty()) in.close(1);
  }
  std::size_t written = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string* into[2] = {&r.out, &r.err};
  char buf[65536];
  while (out.fd[0] >= 0 || err.fd[0] >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd fds[3] = {{out.fd[0], POLLIN, 0}, {err.fd[0], POLLIN, 0}, {in.fd[1], POLLOUT, 0}};
    const int n = ::poll(fds, 3, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        if (into[i]->size() < max_bytes) into[i]->append(buf, std::min<std::size_t>(got, max_bytes - into[i]->size()));
      } else if (got == 0 || errno != EINTR) {
        (i == 0 ? out : err).close(0);
      }
    }
    if (fds[2].fd >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t put = ::write(in.fd[1], input->data() + written, input->size() - written);
      if (put > 0) written += static_cast<std::size_t>(put);
      if ((put < 0 && errno != EINTR && errno != EAGAIN) || written == input->size()) in.close(1);  // done, or gone
    }
  }
  in.close(1);
  if (input) ::sigaction(SIGPIPE, &old, nullptr);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

}  // namespace gpuq::common
