// Hang watch: a running job silent for hang_after_s since its last progress event on this attempt
// may be hung (a rank stuck in a collective whose peer died, a deadlocked data loader). It is
// flagged in status and why, and with hang_action "retry" stopped once, its end then a failure to
// be retried rather than a cancel. A job that never reported progress is not judged, and busy GPUs
// (NVML's utilisation) say a silent job still works. Pure but for its log line: the running jobs
// and whether their GPUs are busy are handed in, so each rule is a unit test
// (tests/unit/test_hang_watch.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "daemon/store.hpp"

namespace gpuq::daemon {

class HangWatch {
 public:
  // `after_s` <= 0: off. `retry`: stop a hung job so that it is retried.
  HangWatch(double after_s, bool retry) : m_after_s(after_s), m_retry(retry) {}

  // Judges `running` as of `now`, at most once a second (sooner: nothing). `gpus_busy` is asked
  // only of a silent job with GPUs. Returns the jobs to stop now: newly flagged, with retry, not
  // being cancelled, and not stopped before.
  std::vector<std::int64_t> check(double now, const std::vector<const JobRecord*>& running,
                                  const std::function<bool(const JobRecord&)>& gpus_busy);
  bool on() const { return m_after_s > 0; }
  bool hung(std::int64_t id) const { return m_hung.count(id) > 0; }
  // "no progress for N s since its last progress event at epoch E (hang_after_s S): it may be hung",
  // or "" unless flagged.
  std::string note(const JobRecord& r, double now) const;
  // Job `r`'s attempt has ended: "stopped: <note>" where this watch stopped it, else "". Forgets it.
  std::string ended(const JobRecord& r, double now);

 private:
  double m_after_s;
  bool m_retry;
  double m_checked = 0;
  std::set<std::int64_t> m_hung;     // running jobs flagged
  std::set<std::int64_t> m_stopped;  // of those, the ones stopped to be retried
};

}  // namespace gpuq::daemon
