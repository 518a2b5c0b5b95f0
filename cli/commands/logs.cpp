// `gpuq logs`: a job's output, read from the rank logs gpuqd names (gpuqd never reads logs), the
// last N lines found by reading backwards, and with -f followed across attempts until the job ends:
// told of what a log gains by inotify, of the job's changes by gpuqd's watch stream.
#include <poll.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/progress.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/json_input.hpp"
#include "common/paths.hpp"
#include "common/protocol.hpp"
#include "common/spec.hpp"

namespace gpuq::cli {

using json = nlohmann::json;
using common::Client;

namespace {

// A rank's log, which its job can write: opened as common::open_job_file opens such a file (no
// symlink followed, so root's `gpuq logs` prints no /etc/shadow a job linked there; no fifo waited
// on, so it never hangs), or not at all. A missing one is quietly nothing; another refusal is said.
class LogFile {
 public:
  explicit LogFile(const std::string& path) {
    auto fd = common::open_job_file(path, "log");
    if (fd) m_fd = *fd;
    else if (fd.error().code != ErrorCode::not_found) std::cerr << "gpuq: " << printable(fd.error().message) << "\n";
  }
  ~LogFile() {
    if (m_fd >= 0) ::close(m_fd);
  }
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;
  bool ok() const { return m_fd >= 0; }
  std::streamoff size() const {
    struct stat st {};
    return m_fd >= 0 && ::fstat(m_fd, &st) == 0 ? static_cast<std::streamoff>(st.st_size) : 0;
  }
  // Up to `len` bytes at `off` into `buf`; how many were read.
  std::size_t read_at(char* buf, std::size_t len, std::streamoff off) const {
    for (;;) {
      const ssize_t n = ::pread(m_fd, buf, len, static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      return n > 0 ? static_cast<std::size_t>(n) : 0;
    }
  }

 private:
  int m_fd = -1;
};

// Where the last `n` complete lines of a file start (0 when it has fewer); `lines`: how many of
// them it has, up to n. Read backwards, so a long log costs only its tail.
std::streamoff tail_start(const std::string& path, int n, int& lines) {
  lines = 0;
  LogFile in(path);
  if (!in.ok()) return 0;
  std::streamoff pos = in.size();
  std::vector<char> buf(64 << 10);
  bool seen_last = false;  // the newline that ends the last complete line
  while (pos > 0) {
    const std::streamoff len = std::min<std::streamoff>(pos, static_cast<std::streamoff>(buf.size()));
    pos -= len;
    if (in.read_at(buf.data(), static_cast<std::size_t>(len), pos) != static_cast<std::size_t>(len)) return 0;
    for (std::streamoff i = len - 1; i >= 0; --i) {
      if (buf[static_cast<std::size_t>(i)] != '\n') continue;
      if (!seen_last) {
        seen_last = true;
        if (n == 0) return pos + i + 1;
      } else if (++lines == n) {
        return pos + i + 1;  // just after the newline that ends the line before the last n
      }
    }
  }
  lines += seen_last ? 1 : 0;
  return 0;
}

// Whether writes to files in `dir` may happen where inotify does not see them: a network or
// cluster file system, written from another node.
bool on_network_fs(const std::string& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) return true;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0x6969:      // NFS
    case 0xFF534D42:  // CIFS
    case 0xFE534D42:  // SMB2
    case 0x65735546:  // FUSE (sshfs, ...)
    case 0x0BD00BD0:  // Lustre
    case 0x47504653:  // GPFS
    case 0x19830326:  // BeeGFS
    case 0x00C36400:  // Ceph
    case 0x013111A8:  // IBRIX
    case 0x6B414653:  // AFS
      return true;
    default:
      return false;
  }
}

}  // namespace

int cmd_logs(const Options& o, std::int64_t id, bool follow, int rank, int attempt, int tail) {
  auto client = connect(o, follow);
  if (!client) return report(client.error());
  if (follow) outlive_restarts(o, *client);
  int refused = k_exit_refused;
  auto show = [&]() -> std::optional<common::ShowReply> {
    auto r = client->call(common::cmd::show, common::IdRequest{id});
    if (!r) {
      refused = report(r.error());
      return std::nullopt;
    }
    return std::move(*r);
  };
  auto s = show();
  if (!s) return refused;
  if (rank >= s->job.ranks) {
    std::cerr << "gpuq: job " << id << " has " << s->job.ranks << " rank(s); --rank " << rank << " does not exist\n";
    return k_exit_usage;
  }
  if (s->logs.empty() && s->job.attempt > 0 && is_terminal(s->job.state))  // a running one's may be still to come
    std::cerr << "gpuq: job " << id << " has no log files left (`gpuq clean` removed them)\n";
  const bool prefix = s->job.ranks > 1 && rank < 0;
  // Follow state: per (attempt, rank) file offsets. A capped log rotates to <log>.1 (gpuqd
  // --log-limit-mb): its older part is printed first, and a log that shrank has rotated.
  std::map<std::pair<int, int>, std::streamoff> offsets;
  auto print_from = [&](const std::string& path, std::streamoff& off, int r, bool whole) {
    LogFile in(path);
    if (!in.ok()) return;
    std::vector<char> buf(64 << 10);
    std::string line;  // a line not yet ended at the end of the buffer
    for (;;) {
      const std::size_t n = in.read_at(buf.data(), buf.size(), off + static_cast<std::streamoff>(line.size()));
      if (n == 0) break;
      std::size_t begin = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (buf[i] != '\n') continue;
        line.append(buf.data() + begin, i - begin);
        std::cout << (prefix ? "[rank " + std::to_string(r) + "] " : "") << line << "\n";
        off += static_cast<std::streamoff>(line.size()) + 1;
        line.clear();
        begin = i + 1;
      }
      line.append(buf.data() + begin, n - begin);
      if (line.size() >= (1 << 20)) {  // a line without end (a progress bar's \r): shown in pieces, memory bounded
        std::cout << line;
        off += static_cast<std::streamoff>(line.size());
        line.clear();
      }
    }
    if (!line.empty() && whole) {  // partial line: printed once the job cannot end it any more
      std::cout << (prefix ? "[rank " + std::to_string(r) + "] " : "") << line << "\n";
      off += static_cast<std::streamoff>(line.size());
    }
  };
  bool initial = true;
  // An unfinished last line waits for its end while the job may still write it (-f); a plain
  // `logs`, like cat, and the last pump after the job ended print it as it is.
  auto pump = [&](const common::ShowReply& sr) {
    const bool whole = !follow || (sr.job.state != JobState::queued && sr.job.state != JobState::running);
    for (const auto& l : sr.logs) {
      if (rank >= 0 && l.rank != rank) continue;
      if (attempt > 0 && l.attempt != attempt) continue;
      if (attempt == 0 && !follow && l.attempt != sr.job.attempt) continue;  // last attempt only
      const bool first = !offsets.count({l.attempt, l.rank});
      auto& off = offsets[{l.attempt, l.rank}];
      std::error_code ec;
      const auto size = std::filesystem::file_size(l.path, ec);
      if (first && initial && tail >= 0) {  // as tail -n: the chosen attempt's last lines only
        if (l.attempt != (attempt > 0 ? attempt : sr.job.attempt)) {
          off = ec ? 0 : static_cast<std::streamoff>(size);
          continue;
        }
        int have = 0;
        off = tail_start(l.path, tail, have);
        if (have < tail && std::filesystem::exists(l.path + ".1")) {
          int older_lines = 0;
          std::streamoff older = tail_start(l.path + ".1", tail - have, older_lines);
          print_from(l.path + ".1", older, l.rank, true);
        }
        print_from(l.path, off, l.rank, whole);
        continue;
      }
      if (first || (!ec && static_cast<std::streamoff>(size) < off)) {
        std::streamoff older = first ? 0 : off;
        if (std::filesystem::exists(l.path + ".1")) print_from(l.path + ".1", older, l.rank, true);
        off = 0;
      }
      print_from(l.path, off, l.rank, whole);
    }
    std::cout.flush();
  };
  if (!follow) {
    pump(*s);
    return k_exit_ok;
  }
  // Following: the kernel says when a log grows or a file appears (inotify on the job's directory,
  // where each attempt's directory appears, and on the attempts' directories, where the ranks' logs
  // appear, grow and rotate), and gpuqd's watch stream when the job changes (a new attempt, its
  // end), on a connection of its own; neither has a poll interval. Where inotify cannot see a
  // write (a network file system: a job on another node) the logs are also read every second;
  // against a gpuqd without the watch (protocol minor 2) the job is looked at every 200 ms.
  const bool stream = client->hello().value("protocol_minor", 0) >= 2;
  std::optional<Client> watcher;
  common::WatchRequest changes;
  changes.ids = {id};
  changes.timeout_s = 60;
  if (stream) {  // the cursor, then the look that follows it: no change in between is missed
    auto r = stream_position(*client);
    if (!r) return report(r.error());
    changes.epoch = r->epoch, changes.after = r->cursor;
    if (!(s = show())) return refused;
  }
  const int grown = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);  // -1: read on the timer alone
  std::set<std::string> watched;
  bool timer = grown < 0;  // the logs are also read every second
  auto watch_dir = [&](const std::string& dir) {
    if (grown < 0 || !watched.insert(dir).second) return false;
    if (::inotify_add_watch(grown, dir.c_str(),
                            IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR | IN_DONT_FOLLOW) < 0) {
      watched.erase(dir);  // not there yet: its creation is seen in the job's directory
      return false;
    }
    if (on_network_fs(dir)) timer = true;
    return true;
  };
  auto watch_dirs = [&](const common::ShowReply& sr) {  // whether a directory is watched now that was not
    if (sr.job.job_dir.empty()) return false;
    bool added = watch_dir(sr.job.job_dir);
    for (int at = std::max(1, sr.job.attempt_base); at <= sr.job.attempt; ++at)
      added = watch_dir(sr.job.job_dir + "/attempt-" + std::to_string(at)) || added;
    for (const auto& l : sr.logs)
      added = watch_dir(common::parent_dir(l.path)) || added;
    return added;
  };
  // A directory's watch, then a look: a log made in it before the watch began (its IN_CREATE
  // never comes) is in that look. A look that finds another directory watches it too.
  auto watch_then_look = [&]() {
    while (watch_dirs(*s))
      if (!(s = show())) return false;
    return true;
  };
  if (!watch_then_look()) {
    if (grown >= 0) ::close(grown);
    return refused;
  }
  pump(*s);
  initial = false;
  bool asked = false;
  double looked_at = now_s();
  while (s->job.state == JobState::queued || s->job.state == JobState::running) {
    if (stream && !watcher)
      if (auto c = Client::connect(o.socket)) watcher.emplace(std::move(*c));
    if (watcher && !asked) {
      if (watcher->send(common::encode(common::cmd::watch, changes)))
        asked = true;
      else
        watcher.reset();
    }
    pollfd p[2] = {{grown, POLLIN, 0}, {asked ? watcher->fd() : -1, POLLIN, 0}};
    ::poll(p, 2, !stream || !watcher ? 200 : timer ? 1000 : -1);  // a watch answers within its timeout
    // A file that appeared (a new attempt's directory, a rank's log, a rotation) is looked up;
    // what grew is read. Without the stream, or while gpuqd cannot be reached, every 200 ms.
    bool look = (!stream || !watcher) && now_s() - looked_at >= 0.2;
    if (grown >= 0 && (p[0].revents & POLLIN)) {
      alignas(inotify_event) char events[8192];
      ssize_t n;
      while ((n = ::read(grown, events, sizeof events)) > 0)
        for (ssize_t at = 0; at + static_cast<ssize_t>(sizeof(inotify_event)) <= n;) {
          const auto* e = reinterpret_cast<const inotify_event*>(events + at);
          look = look || (e->mask & (IN_CREATE | IN_MOVED_TO | IN_Q_OVERFLOW));
          at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
        }
    }
    if (asked && p[1].revents) {
      asked = false;
      auto r = watcher->receive(common::encode(common::cmd::watch, changes));
      auto news = r ? common::read_reply<common::WatchReply>(*r) : Result<common::WatchReply>(r.error());
      if (news) {
        changes.epoch = news->epoch, changes.after = news->cursor;
        look = look || !news->jobs.empty() || news->reset;
      } else {
        watcher.reset();  // gpuqd went away: the look reconnects (outlive_restarts), the next watch resets
        look = true;
      }
    }
    if (look) {
      looked_at = now_s();
      if (!(s = show()) || !watch_then_look()) {
        if (grown >= 0) ::close(grown);
        return refused;
      }
    }
    pump(*s);
  }
  if (grown >= 0) ::close(grown);
  pump(*s);
  return k_exit_ok;
}

void add_logs(CLI::App& app, Context& ctx) {
  struct Args {
    std::int64_t id = 0;
    bool follow = false;
    int rank = -1, attempt = 0, tail = -1;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("logs", "Print a job's output (stdout and stderr)");
  sub->add_option("id", a->id, "Job id")->required();
  sub->add_flag("--follow,-f", a->follow, "Keep printing until the job ends, across retries");
  sub->add_option("--rank", a->rank, "Only this rank (ddp jobs)");
  sub->add_option("--attempt", a->attempt, "Only this attempt (default: the last; with -f, all)");
  sub->add_option("--tail,-n", a->tail, "Only the last N lines of each rank's log, then (with -f) what follows")
      ->check(CLI::Range(0, 1 << 30));
  sub->callback([&ctx, a] { ctx.run = [&ctx, a] { return cmd_logs(ctx.opt, a->id, a->follow, a->rank, a->attempt, a->tail); }; });
}

}  // namespace gpuq::cli
