// What the last scheduling pass said, kept for the questions asked between passes: why each queued
// job waits (what the pass said of it, or, for the jobs it passed over without a word, what it
// said of their batch's limit, their user's, or the place where it stopped), and which GPUs it
// holds for blocked jobs. A pass costs no string per job it passes over, so a 100,000-job sweep
// behind a limit costs a pass nothing per job; the reason is derived when someone asks
// (tests/unit/test_last_pass.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "daemon/job_table.hpp"
#include "daemon/scheduler.hpp"

namespace gpuq::daemon {

class LastPass {
 public:
  std::uint64_t number() const { return m_number; }  // passes so far
  void begin() { ++m_number; }                        // a new pass
  // The pass says why `a` waits.
  void say(Active& a, std::string reason) {
    a.wait_reason = std::move(reason);
    a.reason_pass = m_number;
  }
  // What the pass left for the jobs it did not name: takes plan's tail, limits and reservations.
  void remember(Plan& plan);

  // Why queued job `a` (of user `owner`) waits as of the last pass; a running job's own reason.
  // `drain_note` adds why GPUs are missing to a reason that counts them (GpuService::with_drain_note).
  std::string wait_reason(const Active& a, const std::string& owner,
                          const std::function<std::string(int gpus, std::string reason)>& drain_note) const;
  // What the last pass said of a batch's limit and of a user's, where it passed their jobs over.
  const BatchLimit* batch_at_limit(std::int64_t batch) const;
  const UserCap* user_at_limit(std::uint32_t uid) const;
  const std::map<std::int64_t, std::vector<int>>& reservations() const { return m_reservations; }  // job -> GPUs

 private:
  std::uint64_t m_number = 0;
  bool m_stopped = false;  // the pass stopped early: the jobs it left wait as m_tail says
  TailState m_tail;
  std::map<std::int64_t, BatchLimit> m_at_limit;
  std::map<std::uint32_t, UserCap> m_users_at_limit;
  std::map<std::int64_t, std::vector<int>> m_reservations;
};

}  // namespace gpuq::daemon
