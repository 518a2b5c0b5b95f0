// The state dir's trash (trash.hpp).
#include "daemon/trash.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "common/error.hpp"
#include "common/paths.hpp"

namespace gpuq::daemon {

Trash::Trash(boost::asio::io_context& io, std::string state_dir) : m_io(io), m_dir(std::move(state_dir) + "/trash") {}

Trash::~Trash() {
  m_thread.stop();
  m_thread.join();
}

void Trash::make() {
  if (auto made = common::ensure_private_dir(m_dir); !made) throw RequestError(made.error());
}

std::string Trash::move(std::int64_t id, const std::string& dir, bool keep_dir) {
  std::error_code ec;
  if (keep_dir && std::filesystem::is_empty(dir, ec)) return "";  // nothing to free
  const std::string to = m_dir + "/" + std::to_string(id) + "-" + std::to_string(::getpid()) + "-" + std::to_string(++m_seq);
  if (::rename(dir.c_str(), to.c_str()) != 0) {
    const int err = errno;
    // ENOENT names either end: only a `dir` that is not there means nothing to free (a trash gone
    // since make() must not pass for it, or a forget would drop the record and leave the files).
    struct stat st {};
    if (err == ENOENT && ::lstat(dir.c_str(), &st) != 0 && errno == ENOENT) return "";
    throw RequestError(ErrorCode::store_error, "cannot move " + dir + " into the trash (" + m_dir + "): " + std::strerror(err));
  }
  if (keep_dir) (void)common::ensure_private_dir(dir);  // emptied: the job may be given its path again
  return to;
}

void Trash::empty(Moved moved, Done done) {
  boost::asio::post(m_thread, [this, moved = std::move(moved), done = std::move(done)]() mutable {
    std::int64_t bytes = 0;
    std::vector<std::int64_t> cleaned;
    for (const auto& [id, dir] : moved) {
      std::string error;
      bytes += common::remove_tree(dir, error);
      if (!error.empty()) std::cerr << "gpuqd: cleaning " << dir << ": " << error << "\n";
      if (id > 0) cleaned.push_back(id);
    }
    if (done)
      boost::asio::post(m_io, [done = std::move(done), bytes, cleaned = std::move(cleaned)]() mutable {
        done(bytes, std::move(cleaned));
      });
  });
}

void Trash::empty_leftover() {
  Moved left;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(m_dir, ec), end; !ec && it != end; it.increment(ec))
    left.emplace_back(0, it->path().string());
  if (!left.empty()) empty(std::move(left));
}

}  // namespace gpuq::daemon
