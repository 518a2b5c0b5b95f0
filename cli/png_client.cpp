// `gpuq plot -o x.png`: gpuq hands the chart to gpuq-plot-png, beside it, which paints it with
// cairo (plot_png.cpp). gpuq itself is linked statically so that it starts as fast as a bare
// process (it runs once per job in sweep scripts), and a static program cannot load a shared
// library such as libcairo safely: the first try crashed inside cairo.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cli/plot.hpp"
#include "common/paths.hpp"

extern char** environ;

namespace gpuq::cli::plot {

Result<std::string> png_painter() {
#ifndef GPUQ_HAVE_CAIRO
  return Error{ErrorCode::internal, "this gpuq was built without cairo, so it cannot write PNG; write .svg instead"};
#else
  std::string path = common::self_dir() + "/gpuq-plot-png";
  if (::access(path.c_str(), X_OK) != 0)
    return Error{ErrorCode::internal,
                 "cannot write PNG: " + path + " (" + std::strerror(errno) + "); reinstall gpuq, or write .svg instead"};
  return path;
#endif
}

namespace {

// The two ends of a pipe, closed when they go out of scope.
struct Pipe {
  int fd[2] = {-1, -1};
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  void close(int end) {
    if (fd[end] >= 0) ::close(fd[end]);
    fd[end] = -1;
  }
};

}  // namespace

Result<bool> render_png(const std::string& painter, const std::vector<JobCurves>& jobs, const ChartOptions& o,
                        const std::string& path) {
  auto fail = [&](const std::string& why) { return Error{ErrorCode::internal, "cannot write " + path + ": " + why}; };
  const std::string doc = chart_document(jobs, o).dump();
  Pipe in, err;
  if (::pipe2(in.fd, O_CLOEXEC) != 0 || ::pipe2(err.fd, O_CLOEXEC) != 0) return fail(std::strerror(errno));

  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_adddup2(&fa, in.fd[0], 0);
  ::posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  ::posix_spawn_file_actions_adddup2(&fa, err.fd[1], 2);
  std::string arg0 = painter, arg1 = path;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, painter.c_str(), &fa, nullptr, argv, environ);
  ::posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return fail("cannot start " + painter + ": " + std::strerror(rc));
  in.close(0);
  err.close(1);

  // The painter reads all of its input before it writes a word, so writing first cannot deadlock;
  // if it dies early, the write fails with EPIPE instead of a SIGPIPE ending gpuq.
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &old);
  for (std::size_t off = 0; off < doc.size();) {
    const ssize_t n = ::write(in.fd[1], doc.data() + off, doc.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  ::sigaction(SIGPIPE, &old, nullptr);
  in.close(1);

  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::read(err.fd[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (said.size() < 4096) said.append(buf, static_cast<std::size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (said.empty())
    said = WIFSIGNALED(status) ? painter + " died of signal " + std::to_string(WTERMSIG(status))
                               : painter + " exited with code " + std::to_string(WEXITSTATUS(status));
  return Error{ErrorCode::internal, said};
}

}  // namespace gpuq::cli::plot
