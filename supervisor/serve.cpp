// gpuq-shim --serve (serve.hpp). Single-threaded: SIGCHLD is read from a signalfd in the same
// poll() as gpuqd's socket.
#include "supervisor/serve.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/process.hpp"
#include "supervisor/supervisor.hpp"

namespace gpuq::supervisor {

using json = nlohmann::json;

CommandLine CommandLine::of(int argc, char** argv) {
  if (argc < 1 || !argv[0]) return {};
  char* end = argv[0];
  for (int i = 0; i < argc; ++i) {
    if (argv[i] != end) return {};  // not one after another: nothing to write over safely
    end += std::strlen(argv[i]) + 1;
  }
  return {argv[0], static_cast<std::size_t>(end - argv[0])};
}

bool CommandLine::set(std::initializer_list<const char*> parts) const {
  std::size_t need = 0;
  for (const char* p : parts)
    need += std::strlen(p) + 1;
  if (!begin || need > room) return false;
  char* at = begin;
  for (const char* p : parts) {
    const std::size_t n = std::strlen(p) + 1;
    std::memcpy(at, p, n);
    at += n;
  }
  std::memset(at, 0, room - need);
  return true;
}

Received receive(int sock, int flags) {
  Received r;
  char buf[8192];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  r.size = ::recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  if (r.size <= 0) return r;
  r.text.assign(buf, static_cast<std::size_t>(r.size));
  r.cut = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      for (std::size_t i = 0; CMSG_LEN((i + 1) * sizeof(int)) <= c->cmsg_len; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        r.fds.push_back(fd);
      }
  return r;
}

namespace {

constexpr std::size_t k_max_request = 64 << 10;

// One answer; `fds` (those >= 0) go with it as SCM_RIGHTS. A gpuqd that has gone away is no error
// here: the next recv() says so.
void answer(int sock, const json& reply, std::initializer_list<int> fds = {}) {
  const std::string text = reply.dump(-1, ' ', false, json::error_handler_t::replace);
  std::vector<int> passed;
  for (int fd : fds)
    if (fd >= 0) passed.push_back(fd);
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (!passed.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(passed.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(passed.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), passed.data(), passed.size() * sizeof(int));
  }
  while (::sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

// The request's launch document and cgroups, or what is wrong with it.
struct Request {
  std::string launch;
  std::vector<std::string> cgroups;
  std::vector<bool> per_rank;
  std::string error;
};

Request parse(const char* data, std::size_t size) {
  Request r;
  const json doc = json::parse(data, data + size, nullptr, false);
  const auto absolute = [](const json& v) {
    return v.is_string() && !v.get_ref<const std::string&>().empty() && v.get_ref<const std::string&>()[0] == '/' &&
           v.get_ref<const std::string&>().find('\0') == std::string::npos;
  };
  if (!doc.is_object() || !absolute(doc.value("launch", json()))) {
    r.error = "a start request names no launch document (an absolute path)";
    return r;
  }
  r.launch = doc["launch"].get<std::string>();
  const json cgroups = doc.value("cgroups", json::array());
  if (!cgroups.is_array()) r.error = "a start request's cgroups are not a list";
  for (const auto& c : cgroups) {
    if (!c.is_array() || c.size() != 2 || !absolute(c[0]) || !c[1].is_boolean()) {
      r.error = "a start request's cgroup is not [absolute dir, per_rank]";
      break;
    }
    r.cgroups.push_back(c[0].get<std::string>());
    r.per_rank.push_back(c[1].get<bool>());
  }
  return r;
}

// Forks the supervisor of one attempt and answers with its pid and start time, and as
// descriptors its pidfd and the write end of a pipe the child waits on before it does anything:
// it goes on only once gpuqd has the answer and writes to it. So a start is never done twice: an
// answer gpuqd did not get (this server killed or stopped after the fork, gpuqd gave up waiting and
// closed its end, which closes the descriptors in flight) ends the child at EOF, and gpuqd may ask
// again; and one gpuqd got but did not act on (it died) leaves no supervisor, as if it had died
// before asking.
void start(int sock, int sigfd, const CommandLine& title, const Request& r) {
  if (!title.begin || r.launch.size() + sizeof("gpuq-shim") + 1 > title.room) {
    // gpuqd would not know it again after a restart (supervises()): it execs this one instead.
    answer(sock, {{"error", "no room in the server's command line to name the supervisor of an attempt"}});
    return;
  }
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) {
    answer(sock, {{"error", std::string("pipe: ") + std::strerror(errno)}});
    return;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(go[0]);
    ::close(go[1]);
    answer(sock, {{"error", std::string("fork: ") + std::strerror(errno)}});
    return;
  }
  if (pid == 0) {
    // As an exec'd gpuq-shim starts: a session of its own, nothing of the server's open or
    // blocked, its command line naming its launch document (before it writes its pid file).
    ::close(sock);
    ::close(sigfd);
    ::close(go[1]);
    char word = 0;
    ssize_t got = 0;
    while ((got = ::read(go[0], &word, 1)) < 0 && errno == EINTR) {
    }
    if (got != 1) ::_exit(3);  // gpuqd never had the answer: nothing was started
    ::close(go[0]);
    ::setsid();
    // Nothing blocked but SIGUSR1, gpuqd's preemption: until the supervisor takes it (a signalfd),
    // its default action would end the shim; blocked, it waits there.
    sigset_t only_usr1;
    sigemptyset(&only_usr1);
    sigaddset(&only_usr1, SIGUSR1);
    ::sigprocmask(SIG_SETMASK, &only_usr1, nullptr);
    title.set({"gpuq-shim", r.launch.c_str()});
    int status = 2;
    try {
      status = run_supervisor(r.launch, r.cgroups, r.per_rank);
    } catch (...) {
    }
    std::exit(status);  // as an exec'd shim ends (a sanitizer build's leak check included)
  }
  ::close(go[0]);
  // Read now, before this loop can reap it: the child is at least a zombie until then.
  const auto started = common::process_start_time(pid);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  answer(sock, {{"pid", pid}, {"start_time", started.value_or(0)}, {"pidfd", pidfd >= 0}}, {go[1], pidfd});
  ::close(go[1]);
  if (pidfd >= 0) ::close(pidfd);
}

}  // namespace

int serve(int sock, CommandLine title) {
  title.set({"gpuq-shim", "--serve"});  // the padding gpuqd gave it, gone from ps
  if (::chdir("/") != 0) return 2;      // holds no directory of anyone's
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  const int sigfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) return 2;
  std::vector<char> buf(k_max_request + 1);
  for (;;) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {sigfd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 2;
    }
    if (fds[1].revents) {
      signalfd_siginfo info{};
      while (::read(sigfd, &info, sizeof(info)) == sizeof(info)) {
      }
      while (::waitpid(-1, nullptr, WNOHANG) > 0) {
      }
    }
    if (!fds[0].revents) continue;
    const ssize_t n = ::recv(sock, buf.data(), buf.size(), MSG_TRUNC);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return 0;  // gpuqd closed its end: what was started goes on without the server
    if (static_cast<std::size_t>(n) > k_max_request) {
      answer(sock, {{"error", "a start request longer than " + std::to_string(k_max_request) + " bytes"}});
      continue;
    }
    const Request r = parse(buf.data(), static_cast<std::size_t>(n));
    if (!r.error.empty())
      answer(sock, {{"error", r.error}});
    else
      start(sock, sigfd, title, r);
  }
}

}  // namespace gpuq::supervisor
