// A rank's log file with a size cap: output goes to <log>; when the next write would take it past
// the limit, <log> becomes <log>.1 (replacing an older one) and a new <log> starts with a line
// saying so. A job that floods its output therefore holds at most twice the limit on disk, and
// the newest output is always kept. A limit of 0 means no cap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.hpp"

namespace gpuq::supervisor {

// Opens `path` to append to (emptied with `truncate`), as a rank's log is: the job may have put
// anything at the name, so a symlink is not followed, and a fifo or anything but a regular file is
// refused (never waited on), as is a hard link (to a file of someone else's, where the kernel
// allows making one). Close-on-exec; an error names the file.
Result<int> open_log(const std::string& path, bool truncate);

class LogSink {
 public:
  LogSink() = default;
  LogSink(std::string path, std::int64_t limit_bytes) : m_path(std::move(path)), m_limit(limit_bytes) {}
  LogSink(LogSink&& other) noexcept;
  LogSink& operator=(LogSink&& other) noexcept;
  LogSink(const LogSink&) = delete;
  LogSink& operator=(const LogSink&) = delete;
  ~LogSink();

  // Opens (appending to) the log; an error names the file.
  Result<bool> open();
  void write(const char* data, std::size_t n);
  std::int64_t rotations() const { return m_rotations; }

 private:
  void rotate();

  std::string m_path;
  std::int64_t m_limit = 0;
  int m_fd = -1;
  std::int64_t m_size = 0;
  std::int64_t m_rotations = 0;
};

}  // namespace gpuq::supervisor
