// Capped, rotating rank logs; see log_sink.hpp.
#include "supervisor/log_sink.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace gpuq::supervisor {

LogSink::LogSink(LogSink&& other) noexcept { *this = std::move(other); }

LogSink& LogSink::operator=(LogSink&& other) noexcept {
  if (this != &other) {
    if (m_fd >= 0) ::close(m_fd);
    m_path = std::move(other.m_path);
    m_limit = other.m_limit;
    m_fd = std::exchange(other.m_fd, -1);
    m_size = other.m_size;
    m_rotations = other.m_rotations;
  }
  return *this;
}

LogSink::~LogSink() {
  if (m_fd >= 0) ::close(m_fd);
}

Result<int> open_log(const std::string& path, bool truncate) {
  const int fd =
      ::open(path.c_str(),
             O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  if (fd < 0) return Error{ErrorCode::internal, "cannot open the log " + path + ": " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd);
    return Error{ErrorCode::forbidden,
                 "the log " + path + " is not a regular file of one link; refusing to write to it"};
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

Result<bool> LogSink::open() {
  auto fd = open_log(m_path, false);
  if (!fd) return fd.error();
  m_fd = *fd;
  struct stat st {};
  m_size = ::fstat(m_fd, &st) == 0 ? st.st_size : 0;
  return true;
}

void LogSink::write(const char* data, std::size_t n) {
  if (m_fd < 0) return;
  if (m_limit > 0 && m_size > 0 && m_size + static_cast<std::int64_t>(n) > m_limit) rotate();
  while (n > 0) {
    ssize_t w = ::write(m_fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // disk full: the output is dropped, the job goes on
    data += w;
    n -= static_cast<std::size_t>(w);
    m_size += w;
  }
}

void LogSink::rotate() {
  ::close(m_fd);
  ::rename(m_path.c_str(), (m_path + ".1").c_str());
  auto fd = open_log(m_path, true);  // what the job put at the name meanwhile is not written through
  m_fd = fd ? *fd : -1;
  m_size = 0;
  ++m_rotations;
  char line[160];
  int len = std::snprintf(line, sizeof line,
                          "[gpuq: log limit of %lld bytes reached (%lld time(s)); the previous part is in %s.1]\n",
                          static_cast<long long>(m_limit), static_cast<long long>(m_rotations),
                          m_path.substr(m_path.rfind('/') + 1).c_str());
  if (m_fd >= 0 && len > 0 && ::write(m_fd, line, static_cast<std::size_t>(len)) == len) m_size = len;
}

}  // namespace gpuq::supervisor
