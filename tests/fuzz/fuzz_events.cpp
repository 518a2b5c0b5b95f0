// libFuzzer target: an events file, as a job writes it, through what gpuqd does with it — read
// in pieces whose boundaries fall anywhere (each read starting one byte early, as Daemon::ingest
// does, to know whether it starts inside a line), parsed with the limits of daemon/events.hpp,
// folded into a job, and stored as JSON text. A crash, a sanitizer report, an exception, a read
// that does not move on, or a result past its bound is a bug: gpuqd must take any bytes a job
// writes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "daemon/events.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuq::daemon;
  if (size < 1) return 0;
  // The first byte chooses the read size, so piece boundaries land anywhere in the lines.
  const std::size_t chunk = 1 + data[0] % 64 * 37;
  const std::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  JobRecord job;
  std::size_t offset = 0;
  for (int round = 0; round < 2; ++round) {  // while the job runs, then once it has ended
    const bool ended = round == 1;
    while (offset < file.size()) {
      const bool mid_line = offset > 0 && file[offset - 1] != '\n';
      std::string_view piece;
      ParsedEvents parsed;
      for (std::size_t len = chunk;; len *= 2) {
        piece = file.substr(offset, len);
        parsed = parse_events(piece, 0, 1.0, mid_line, ended && offset + piece.size() == file.size());
        // A line longer than this read: gpuqd's reads (4 MiB) are longer than any line it takes.
        if (parsed.consumed > 0 || offset + piece.size() == file.size()) break;
      }
      if (parsed.consumed > piece.size()) std::abort();
      if (parsed.consumed == 0) {
        if (ended) std::abort();  // the ended job's last read must take everything
        break;                    // an unfinished last line: read again once the job has ended
      }
      offset += parsed.consumed;
      job.bad_event_lines += parsed.bad_lines + apply_events(job, parsed.events);
      for (const auto& e : parsed.events) (void)e.data.dump();  // what the store writes
    }
  }
  if (offset != file.size()) std::abort();  // nothing left behind once the job has ended
  if (job.run.result.is_object() && job.run.result.dump().size() > k_max_result_bytes) std::abort();
  return 0;
}
