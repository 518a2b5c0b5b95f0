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

enum class Refusal {
  none,
  not_preemptible,
  not_lower,
  stopping,
  just_launched,
  protected_,
  other_user,
  over_share,
  within_share
};

int held_by(const PreemptRules& rules, std::uint32_t user) {
  const auto it = rules.held.find(user);
  return it == rules.held.end() ? 0 : it->second;
}

// The hot path's check: no string for a refusal.
Refusal refusal_of(const Runner& r, const PendingJob& j, double now, const PreemptRules& rules) {
  if (!r.preemptible) return Refusal::not_preemptible;
  if (r.priority >= j.priority) return Refusal::not_lower;
  if (r.stopping) return Refusal::stopping;  // (its GPUs count as coming free already: no help)
  if (r.started_at >= now) return Refusal::just_launched;
  if (r.preemptions >= rules.protect_after && now - r.started_at < rules.min_run_s) return Refusal::protected_;
  if (rules.lab && r.user != j.user) {
    if (!rules.across_users) return Refusal::other_user;
    if (held_by(rules, j.user) + j.gpus > rules.fair_share) return Refusal::over_share;
    if (held_by(rules, r.user) <= rules.fair_share) return Refusal::within_share;
  }
  return Refusal::none;
}

}  // namespace

std::string preempt_refusal(const Runner& r, const PendingJob& j, double now, const PreemptRules& rules) {
  switch (refusal_of(r, j, now, rules)) {
    case Refusal::none:
      return "";
    case Refusal::not_preemptible:
      return "not preemptible";
    case Refusal::not_lower:
      return "priority " + std::to_string(r.priority) + ", not lower";
    case Refusal::stopping:
      return "asked to stop already";
    case Refusal::just_launched:
      return "launched in this pass";
    case Refusal::protected_:
      return "protected: preempted " + std::to_string(r.preemptions) + " times, it runs " +
             std::to_string(static_cast<long long>(rules.min_run_s)) + " s first";
    case Refusal::other_user:
      return "another user's";
    case Refusal::over_share:
      return "its user would pass their fair share";
    case Refusal::within_share:
      return "another user's, within their fair share";
  }
  return "";
}

std::vector<Preemption> choose_preemptions(const std::vector<PendingJob>& waiting, std::vector<GpuState> gpus,
                                           const std::vector<Runner>& running, double now, const PreemptRules& rules_in,
                                           const std::map<std::int64_t, std::vector<int>>& reserved) {
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
  // The lowest priority a victim has: a waiting job at or under it preempts no one (the pass's
  // order is priority first, so it only claims what it waits for from there on).
  int lowest = 0;
  bool any_candidate = false;
  for (const Runner& r : running)
    if (r.preemptible && !r.stopping && !r.gpus.empty()) {
      lowest = any_candidate ? std::min(lowest, r.priority) : r.priority;
      any_candidate = true;
    }

  std::size_t looked_at = 0;
  for (const PendingJob& j : waiting) {
    if (++looked_at > k_max_preempting || room.claimed.size() >= room.gpus.size()) break;
    if (j.gpus <= 0 || j.gpus > static_cast<int>(room.gpus.size())) continue;
    // Room coming free already (victims stopping for it, or for nobody in particular): it waits
    // for that, preempting nothing more, and the jobs after it do not count on those GPUs.
    if (auto place = room.place(j, coming); !place.empty()) {
      room.claimed.insert(place.begin(), place.end());
      if (rules.lab) rules.held[j.user] += j.gpus;
      continue;
    }
    // Otherwise it waits for the GPUs the pass reserved for it: the jobs after it do not count on
    // those either, whatever else they could preempt.
    const auto hold_reserved = [&] {
      if (const auto it = reserved.find(j.id); it != reserved.end())
        room.claimed.insert(it->second.begin(), it->second.end());
    };
    if (!any_candidate || j.priority <= lowest) break;  // nor any after it
    std::vector<const Runner*> candidates;
    for (const Runner& r : running)
      if (!r.gpus.empty() && !taken.count(r.id) && refusal_of(r, j, now, rules) == Refusal::none)
        candidates.push_back(&r);
    using Cost = std::tuple<double, int, double, std::int64_t>;  // lost GPU-s, priority, -start, -id
    std::vector<std::pair<Cost, const Runner*>> ranked;
    for (const Runner* r : candidates)
      ranked.emplace_back(Cost{lost_gpu_s(*r, now), r->priority, -r->started_at, -r->id}, r);
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    // Cheapest first until it fits.
    std::vector<const Runner*> chosen;
    Room trial = room;
    std::vector<int> place;
    for (const auto& [_, r] : ranked) {
      chosen.push_back(r);
      trial.free(*r);
      if (!(place = trial.place(j, {})).empty()) break;
    }
    if (place.empty()) {  // even all of them would not make room
      hold_reserved();
      continue;
    }
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
