// Preemption's choice of victims (see preemption.hpp).
#include "daemon/preemption.hpp"

#include <algorithm>
#include <set>
#include <tuple>

namespace gpuq::daemon {

namespace {

// The GPUs by index, with what each runner holds of them taken away as runners are let go.
struct Room {
  std::map<int, GpuState> gpus;
  std::set<int> claimed;  // promised to a waiting job earlier in line

  void free(const Runner& r) {
    for (int g : r.gpus) {
      auto it = gpus.find(g);
      if (it == gpus.end()) continue;  // drained: no use to anyone
      GpuState& s = it->second;
      s.holders = std::max(0, s.holders - 1);
      s.allocated_mb = std::max<std::int64_t>(0, s.allocated_mb - (r.shared ? r.memory_mb : s.total_mb));
      if (!r.shared || s.holders == 0) s.exclusive = false;
    }
  }

  bool fits_on(const GpuState& s, const PendingJob& j) const {
    if (claimed.count(s.index)) return false;
    if (j.shared) return !s.exclusive && s.total_mb - s.allocated_mb - s.foreign_mb >= j.memory_mb;
    return s.holders == 0 && (j.memory_mb == 0 || j.memory_mb <= s.total_mb - s.foreign_mb);
  }

  // The GPUs `j` would take, those in `prefer` first; empty when it does not fit.
  std::vector<int> place(const PendingJob& j, const std::set<int>& prefer) const {
    std::vector<int> out;
    for (bool preferred : {true, false})
      for (const auto& [index, s] : gpus)
        if (static_cast<int>(out.size()) < j.gpus && prefer.count(index) == preferred && fits_on(s, j))
          out.push_back(index);
    if (static_cast<int>(out.size()) < j.gpus) out.clear();
    return out;
  }
};

double lost_gpu_s(const Runner& r, double now) {
  return static_cast<double>(r.gpus.size()) * std::max(0.0, now - std::max(r.started_at, r.checkpoint_at));
}

}  // namespace

std::string preempt_refusal(const Runner& r, const PendingJob& j, double now, const PreemptRules& rules) {
  if (!r.preemptible) return "not preemptible";
  if (r.priority >= j.priority) return "priority " + std::to_string(r.priority) + ", not lower";
  if (r.stopping) return "asked to stop already";
  if (r.preemptions >= rules.protect_after && now - r.started_at < rules.min_run_s)
    return "protected: preempted " + std::to_string(r.preemptions) + " times, it runs " +
           std::to_string(static_cast<long long>(rules.min_run_s)) + " s first";
  if (rules.lab && r.user != j.user) {
    if (!rules.across_users) return "another user's";
    const auto held = [&](std::uint32_t u) {
      const auto it = rules.held.find(u);
      return it == rules.held.end() ? 0 : it->second;
    };
    if (held(j.user) + j.gpus > rules.fair_share) return "its user would pass their fair share";
    if (held(r.user) <= rules.fair_share) return "another user's, within their fair share";
  }
  return "";
}

std::vector<Preemption> choose_preemptions(const std::vector<PendingJob>& waiting, std::vector<GpuState> gpus,
                                           const std::vector<Runner>& running, double now,
                                           const PreemptRules& rules_in) {
  std::vector<Preemption> out;
  if (waiting.empty()) return out;
  PreemptRules rules = rules_in;
  Room room;
  for (auto& g : gpus)
    room.gpus[g.index] = g;
  std::set<int> coming;  // GPUs that jobs asked to stop are freeing
  std::set<std::int64_t> taken;
  for (const Runner& r : running)
    if (r.stopping) {
      room.free(r);
      coming.insert(r.gpus.begin(), r.gpus.end());
    }
  const bool any_candidate =
      std::any_of(running.begin(), running.end(), [](const Runner& r) { return r.preemptible && !r.stopping; });

  for (const PendingJob& j : waiting) {
    if (j.gpus <= 0 || j.gpus > static_cast<int>(room.gpus.size())) continue;
    // Room coming free already (victims stopping for it, or for nobody in particular): it waits
    // for that, preempting nothing more, and the jobs after it do not count on those GPUs.
    if (auto place = room.place(j, coming); !place.empty()) {
      room.claimed.insert(place.begin(), place.end());
      continue;
    }
    if (!any_candidate) continue;
    std::vector<const Runner*> candidates;
    for (const Runner& r : running)
      if (!r.gpus.empty() && !taken.count(r.id) && preempt_refusal(r, j, now, rules).empty()) candidates.push_back(&r);
    using Cost = std::tuple<double, int, double, std::int64_t>;  // lost GPU-s, priority, -start, id
    const auto cost = [&](const Runner* r) { return Cost{lost_gpu_s(*r, now), r->priority, -r->started_at, -r->id}; };
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](const Runner* a, const Runner* b) { return cost(a) < cost(b); });
    // Cheapest first until it fits.
    std::vector<const Runner*> chosen;
    Room trial = room;
    std::vector<int> place;
    for (const Runner* r : candidates) {
      chosen.push_back(r);
      trial.free(*r);
      if (!(place = trial.place(j, {})).empty()) break;
    }
    if (place.empty()) continue;  // even all of them would not make room
    // Then those not needed after all go back, the most expensive first.
    for (std::size_t k = chosen.size(); k-- > 0;) {
      Room without = room;
      for (std::size_t m = 0; m < chosen.size(); ++m)
        if (m != k) without.free(*chosen[m]);
      if (!without.place(j, {}).empty()) chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(k));
    }
    std::set<int> freed;
    for (const Runner* r : chosen) {
      room.free(*r);
      freed.insert(r->gpus.begin(), r->gpus.end());
      taken.insert(r->id);
      out.push_back({r->id, j.id});
      if (rules.lab) rules.held[r->user] -= static_cast<int>(r->gpus.size());
    }
    if (rules.lab) rules.held[j.user] += j.gpus;
    place = room.place(j, freed);
    room.claimed.insert(place.begin(), place.end());
  }
  return out;
}

}  // namespace gpuq::daemon
