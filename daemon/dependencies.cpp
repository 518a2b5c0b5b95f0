// Dependencies (see dependencies.hpp): a dependency's state is the job table's, else the store's,
// remembered (Reads::dependency_state); a failed chain fails in one pass, a part at a time.
#include "daemon/dependencies.hpp"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "daemon/lifecycle.hpp"

namespace gpuq::daemon::dependencies {

namespace {
constexpr std::size_t k_doomed_part = 512;  // jobs failed for a dependency in one pass (~10 ms)
}  // namespace

bool met(const Reads& r, std::int64_t dep) {
  const auto st = r.dependency_state(dep);
  if (st == JobState::succeeded) return true;
  if (st != JobState::running || !r.executor.follows(dep)) return false;
  const auto& run = r.jobs.at(dep).rec.run;
  return !run.cancel_requested && !run.requeue_requested;  // it will not end as it runs now
}

void withdraw_orphans(const Reads& r, Executor& executor) {
  for (const Active& a : r.jobs.running()) {
    if (a.rec.run.cancel_requested) continue;
    for (std::int64_t dep : a.rec.after)
      if (!met(r, dep)) {
        executor.withdraw(a.rec.id);  // its end comes later, posted: the table stays as it is
        break;
      }
  }
}

bool fail_blocked(const Reads& r, const Commit& commit, double now) {
  // The jobs whose dependency ended without success, then, transitively, the jobs waiting for
  // those: a failed chain fails in one pass (a pass per link was quadratic: 21 s for a chain of
  // 20,000), k_doomed_part jobs a transaction, the nearest first, a pass each (one transaction
  // for 20,000 held gpuqd's thread for 435 ms). Those left wait for a failed dependency meanwhile.
  std::vector<std::pair<std::int64_t, std::int64_t>> waiting;  // (dependency, a queued job naming it), sorted
  std::map<std::int64_t, std::int64_t> blocked_by;             // doomed job -> the dependency that dooms it
  std::vector<std::int64_t> doomed;                            // the nearest first
  for (const Active& a : r.jobs.with_deps()) {
    const std::int64_t id = a.rec.id;
    for (auto dep : a.rec.after) {
      waiting.emplace_back(dep, id);
      if (blocked_by.count(id)) continue;
      auto st = r.dependency_state(dep);
      if (!st || (is_terminal(*st) && *st != JobState::succeeded)) {
        doomed.push_back(id);
        blocked_by[id] = dep;
      }
    }
  }
  if (doomed.empty()) return false;
  std::sort(waiting.begin(), waiting.end());
  for (std::size_t i = 0; i < doomed.size() && doomed.size() <= k_doomed_part; ++i)  // the jobs behind each doomed one
    for (auto w = std::lower_bound(waiting.begin(), waiting.end(), std::pair<std::int64_t, std::int64_t>{doomed[i], 0});
         w != waiting.end() && w->first == doomed[i]; ++w)
      if (blocked_by.emplace(w->second, doomed[i]).second) doomed.push_back(w->second);
  const bool left = doomed.size() > k_doomed_part;
  if (left) doomed.resize(k_doomed_part);
  std::vector<JobRecord> failed;
  for (auto id : doomed) {
    const std::int64_t dep = blocked_by[id];
    auto st = r.dependency_state(dep);  // doomed, but still queued: it ends failed in this same transaction
    failed.push_back(
        next_record(r.jobs.at(id).rec,
                    event::DependencyFailed{dep,
                                            !st ? "dependency: " + r.missing_job(dep)
                                                : "dependency " + std::to_string(dep) + " ended " +
                                                      std::string(to_string(is_terminal(*st) ? *st : JobState::failed)),
                                            now}));
  }
  commit(std::move(failed), {}, {});
  return left;
}

}  // namespace gpuq::daemon::dependencies
