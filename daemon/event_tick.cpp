// The event tick (event_tick.hpp): running jobs' event files read into the store, and the hang
// watch.
#include "daemon/event_tick.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/paths.hpp"
#include "common/process.hpp"
#include "daemon/events.hpp"
#include "daemon/launcher.hpp"

namespace gpuq::daemon {

EventTick::EventTick(boost::asio::io_context& io, const Config& config, Store& store, JobTable& jobs,
                     Executor& executor, Inventory& inventory, Needs needs)
    : m_config(config),
      m_store(store),
      m_jobs(jobs),
      m_executor(executor),
      m_inventory(inventory),
      m_needs(std::move(needs)),
      m_hangs(config.hang_after_s, config.hang_retry()),
      m_timer(io) {}

bool EventTick::ingest(Active& a, bool ended) {
  const std::string adir = attempt_dir(m_config.state_dir, a.rec.id, a.rec.attempt);
  bool stored = true;
  // Each rank's events file, and the one its supervisor writes for the spec's `report` (beside it).
  struct File {
    std::string path;
    int rank, key;  // key: its offset's (report_offset_key for the report's)
  };
  std::vector<File> files;
  for (int r = 0; r < a.rec.spec.ranks; ++r)
    files.push_back({rank_events_path(adir, r), r, r});
  if (const auto& report = a.rec.spec.report; !report.empty() && report.rank < a.rec.spec.ranks)
    files.push_back({rank_report_path(adir, report.rank), report.rank, report_offset_key(report.rank)});
  for (const auto& [path, r, key] : files) {
    // The job writes this file: a symlink, a fifo, or a hard link to a file of another user's
    // (/etc/shadow) in its place is read as empty.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) continue;
    std::int64_t& offset = a.event_offsets[key];
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != a.rec.uid) st.st_size = 0;
    // Bounded reads: a job that floods its events file cannot balloon the daemon's memory. Each
    // read starts one byte early, to tell whether the last one stopped inside a line. Nor can it
    // hold gpuqd's thread: a call reads k_events_per_call at most while the job runs (the rest
    // at the next tick), and no more than k_max_events_bytes of a rank's file is ever read (a
    // 10 GB sparse file took 29 s to read through, all at the job's end).
    constexpr std::int64_t k_chunk = 4 << 20;
    const std::int64_t began = offset;
    const std::int64_t limit = std::min<std::int64_t>(st.st_size, k_max_events_bytes);
    // What one read while the job runs may take (re-reads of an unfinished line count); at the
    // job's end, everything up to the cap.
    const std::int64_t budget = ended ? std::numeric_limits<std::int64_t>::max() : k_events_per_call;
    std::int64_t read_now = 0;
    while (limit > offset && read_now < budget) {
      const std::int64_t from = offset > 0 ? offset - 1 : 0;
      const std::int64_t want = std::min({limit - offset, k_chunk, budget - read_now});
      std::string buf(static_cast<std::size_t>(want + (offset - from)), '\0');
      ssize_t n = ::pread(fd, buf.data(), buf.size(), from);
      if (n <= offset - from) break;
      read_now += n - (offset - from);
      buf.resize(static_cast<std::size_t>(n));
      std::string_view data(buf);
      const bool mid_line = offset > 0 && data[0] != '\n';
      data.remove_prefix(static_cast<std::size_t>(offset - from));
      const bool at_end = from + n >= limit;  // an unterminated line here is the file's last (or the cap's)
      auto parsed = parse_events(data, r, wall_now(), mid_line, ended && at_end);
      if (parsed.consumed == 0) break;  // an unfinished line: next time
      JobRecord next = a.rec;
      if (next.first_bad_event.empty()) next.first_bad_event = std::move(parsed.first_bad);
      next.bad_event_lines += parsed.bad_lines + apply_events(next, parsed.events);
      try {  // its progress and result: no change of state
        m_needs.land({std::move(next)}, [&](const std::vector<const JobRecord*>& rows) {
          m_store.add_events(*rows.front(), key, offset + static_cast<std::int64_t>(parsed.consumed), parsed.events);
        });
      } catch (const RequestError& e) {
        std::cerr << "gpuqd: job " << a.rec.id << ": cannot store events: " << e.what() << "\n";
        stored = false;
        break;
      }
      offset += static_cast<std::int64_t>(parsed.consumed);
    }
    if (!ended && read_now > 0) {
      ++m_reads.reads;
      m_reads.max_bytes = std::max(m_reads.max_bytes, read_now);
    }
    if (began < k_max_events_bytes && offset >= k_max_events_bytes && st.st_size > offset) {
      std::cerr << "gpuqd: job " << a.rec.id << ": rank " << r << (key == r ? "'s events file" : "'s report events")
                << " is over " << (k_max_events_bytes >> 20) << " MiB; the rest of it is not read\n";
      ++a.rec.bad_event_lines;  // in memory; stored with the job's next change
      if (a.rec.first_bad_event.empty())
        a.rec.first_bad_event = "rank " + std::to_string(r) + (key == r ? ": its events file" : ": its report events") +
                                " is over " + std::to_string(k_max_events_bytes >> 20) +
                                " MiB; the rest of it is not read";
    }
    ::close(fd);
  }
  return stored;
}

void EventTick::check_hangs(double now) {
  if (!m_hangs.on()) return;
  std::vector<const JobRecord*> running;
  for (std::int64_t id : m_jobs.running_ids()) running.push_back(&m_jobs.at(id).rec);
  std::optional<std::vector<GpuReading>> readings;  // read once a check, and only when asked
  const auto busy = [&](const JobRecord& r) {
    if (!readings) readings = m_inventory.read();
    for (int g : r.run.gpus)
      for (std::size_t i = 0; i < m_inventory.gpus().size() && i < readings->size(); ++i)
        if (m_inventory.gpus()[i].index == g && (*readings)[i].utilization && *(*readings)[i].utilization > 10) return true;
    return false;
  };
  for (std::int64_t id : m_hangs.check(now, running, busy)) m_executor.stop(id);
}

void EventTick::arm() {
  if (m_armed) return;
  if (m_jobs.running_count() == 0) return;
  m_armed = true;
  m_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_config.ingest_interval_s * 1000)));
  m_timer.async_wait([this](const boost::system::error_code& ec) {
    m_armed = false;
    if (!ec) tick();
  });
}

void EventTick::tick() {
  // Events land as progress, no change of state: the running set stays as it is meanwhile.
  for (std::int64_t id : m_jobs.running_ids())
    if (m_executor.started(id)) ingest(m_jobs.at(id));
  check_hangs(wall_now());
  arm();
}

}  // namespace gpuq::daemon
