// Runs a program to its end, input given, output captured and bounded (see command.hpp).
#include "common/command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

extern char** environ;

namespace gpuq::common {

namespace {

rlim_t g_children_nofile = RLIM_INFINITY;  // set_children_descriptor_limit's; infinity: left as it is

// What the child does between fork and exec.
struct ChildPlan {
  char* const* argv;
  int in, out, err;  // its standard input, output and error
};

[[noreturn]] void exec_child(const ChildPlan& plan, volatile int* exec_errno) {
  if (plan.in < 0) {
    *exec_errno = EBADF;  // /dev/null could not be opened
    ::_exit(127);
  }
  if (::dup2(plan.in, 0) < 0 || ::dup2(plan.out, 1) < 0 || ::dup2(plan.err, 2) < 0) {
    *exec_errno = errno;
    ::_exit(127);
  }
  // A signal arriving before exec must not run one of this process's handlers here, on memory
  // the parent shares (gpuqd's SIGTERM handler, say): handled signals go back to their default
  // (this child's table is its own), and only then is the mask emptied (gpuqd's blocked signals
  // are not the command's). Ignored ones stay ignored, as exec keeps them.
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction sa {};
    if (sig == SIGKILL || sig == SIGSTOP || ::sigaction(sig, nullptr, &sa) != 0) continue;
    if (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN) {
      sa = {};
      sa.sa_handler = SIG_DFL;
      ::sigaction(sig, &sa, nullptr);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  restore_children_descriptor_limit();
  ::execvp(plan.argv[0], plan.argv);
  *exec_errno = errno;
  ::_exit(127);
}

// vfork, as posix_spawn does (no copy of a large daemon's page tables), so that the child can also
// put the descriptor limit back before exec, which posix_spawn cannot. The child makes system
// calls only, and an exec that fails leaves its errno where this reads it (the memory is shared
// until the child execs or exits). Returns the child's pid, or -1 with `exec_errno` set.
pid_t spawn(const ChildPlan& plan, int& exec_errno) {
  // Every signal blocked from before the fork until the child has reset its handlers.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  volatile int child_errno = 0;
  const pid_t pid = ::vfork();
  if (pid == 0) exec_child(plan, &child_errno);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  exec_errno = pid < 0 ? fork_errno : child_errno;
  return pid < 0 ? -1 : pid;
}

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

void set_children_descriptor_limit(rlim_t soft) { g_children_nofile = soft; }

void restore_children_descriptor_limit() noexcept {
  if (g_children_nofile == RLIM_INFINITY) return;
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) == 0 && l.rlim_cur > g_children_nofile) {
    l.rlim_cur = g_children_nofile;
    ::setrlimit(RLIMIT_NOFILE, &l);
  }
}

CommandResult run_command(const std::vector<std::string>& argv, double timeout_s, std::size_t max_bytes,
                          const std::optional<std::string>& input) {
  CommandResult r;
  if (argv.empty()) return r;
  Pipe in, out, err;
  if ((input && !in.open()) || !out.open() || !err.open()) return r.err = std::strerror(errno), r;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int null_fd = input ? -1 : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const ChildPlan plan{args.data(), input ? in.fd[0] : null_fd, out.fd[1], err.fd[1]};
  int exec_errno = 0;
  const pid_t pid = spawn(plan, exec_errno);
  const int rc = exec_errno;
  if (null_fd >= 0) ::close(null_fd);
  in.close(0), out.close(1), err.close(1);
  if (rc != 0) {
    if (pid > 0)
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
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
