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
  suspended,
  borrows,
  idles_others_gpus,
  suspend_only,
  not_freezable,
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
Refusal refusal_of(const Runner& r, const PendingJob& j, double now, const PreemptRules& rules, bool freeze) {
  if (!r.preemptible) return Refusal::not_preemptible;
  if (r.priority >= j.priority) return Refusal::not_lower;
  if (r.stopping) return Refusal::stopping;  // (its GPUs count as coming free already: no help)
  if (r.suspended) return Refusal::suspended;
  if (freeze && r.borrows) return Refusal::borrows;
  if (!freeze && !r.may_requeue) return Refusal::suspend_only;
  if (freeze && !r.may_suspend) return Refusal::not_freezable;
  if (r.started_at >= now) return Refusal::just_launched;
  if (r.preemptions >= rules.protect_after && now - std::max(r.started_at, r.resumed_at) < rules.min_run_s)
    return Refusal::protected_;
  if (freeze && rules.lab && r.user != j.user && !r.gpus.empty() && j.gpus == 0) return Refusal::idles_others_gpus;
  if (rules.lab && r.user != j.user) {
    if (!rules.across_users) return Refusal::other_user;
    if (held_by(rules, j.user) + j.gpus > rules.fair_share) return Refusal::over_share;
    if (held_by(rules, r.user) <= rules.fair_share) return Refusal::within_share;
  }
  return Refusal::none;
}

}  // namespace

std::string preempt_refusal(const Runner& r, const PendingJob& j, double now, const PreemptRules& rules, bool freeze) {
  switch (refusal_of(r, j, now, rules, freeze)) {
    case Refusal::none:
      return "";
    case Refusal::not_preemptible:
      return "not preemptible";
    case Refusal::not_lower:
      return "priority " + std::to_string(r.priority) + ", not lower";
    case Refusal::stopping:
      return "asked to stop already";
    case Refusal::suspended:
      return "suspended already";
    case Refusal::borrows:
      return "it runs on what a frozen job lends";
    case Refusal::idles_others_gpus:
      return "another user's, holding GPUs that freezing it would idle";
    case Refusal::suspend_only:
      return "preempt_mode suspend: it is only ever frozen in place";
    case Refusal::not_freezable:
      return "cannot be frozen (preempt_mode requeue, or no cgroup freezer here)";
    case Refusal::just_launched:
      return "launched in this pass";
    case Refusal::protected_:
      return "protected: preempted (stopped or frozen) " + std::to_string(r.preemptions) +
             (r.preemptions == 1 ? " time" : " times") + ", it runs " +
             std::to_string(static_cast<long long>(rules.min_run_s)) + " s first";  // (suspensions counted)
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
    if (r.preemptible && !r.stopping && !r.suspended && r.may_requeue && !r.gpus.empty()) {
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
      if (!r.gpus.empty() && !taken.count(r.id) && refusal_of(r, j, now, rules, false) == Refusal::none)
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

std::vector<Suspension> choose_suspensions(const std::vector<PendingJob>& waiting, std::vector<GpuState> gpus,
                                           const CpuSlots& cpu, const std::vector<Runner>& running, double now,
                                           const PreemptRules& rules,
                                           const std::map<std::int64_t, std::vector<int>>& reserved) {
  std::vector<Suspension> out;
  if (waiting.empty()) return out;
  bool any_candidate = false;
  for (const Runner& r : running)
    any_candidate = any_candidate || (r.preemptible && r.may_suspend && !r.stopping && !r.suspended);
  if (!any_candidate) return out;
  const bool pool = cpu.total > 0 && cpu.total < (1 << 20);  // else no pool of slots to lend
  std::set<int> free;
  for (int s = 0; pool && s < cpu.total; ++s)
    if (!cpu.taken.count(s)) free.insert(s);
  Room room;
  for (auto& g : gpus)
    room.gpus[g.index] = g;
  Room soon = room;  // with the GPUs of jobs asked to stop freed: a job they make room for waits for them
  for (const Runner& r : running)
    if (r.stopping) soon.free(r);
  std::set<std::int64_t> taken;
  // The slots of `r` in the pool: what freezing it lends.
  const auto lends = [&](const Runner& r) {
    std::set<int> slots;
    for (int s : r.cpu_slots)
      if (pool && s >= 0 && s < cpu.total) slots.insert(s);
    return slots;
  };
  // Its GPUs with its memory still on them (frozen, its processes keep their memory), their time
  // lent: a job whose memory is not known (exclusive, without gpu_memory_mb) lends none.
  const auto lend_gpus = [](Room& r, const Runner& v) {
    if (v.kept_mb <= 0) return;
    for (int g : v.gpus) {
      auto it = r.gpus.find(g);
      if (it == r.gpus.end()) continue;
      GpuState& s = it->second;
      s.holders = std::max(0, s.holders - 1);
      // What it keeps there in place of what it was counted for: the whole GPU, or its share.
      s.allocated_mb = std::max<std::int64_t>(0, s.allocated_mb - (v.shared ? v.memory_mb : s.total_mb) + v.kept_mb);
      if (!v.shared) s.exclusive = false;
    }
  };
  std::size_t looked_at = 0;
  for (const PendingJob& j : waiting) {
    if (++looked_at > k_max_preempting) break;
    const int need = pool ? cpu_slots_needed(j, cpu.total) : 0;
    // A GPU job runs beside a frozen one only as a shared job that says its memory.
    if (j.gpus > 0 && (!j.shared || j.memory_mb <= 0 || j.gpus > static_cast<int>(room.gpus.size()))) continue;
    if (need <= 0 && j.gpus <= 0) continue;
    room.claimed.clear();  // the GPUs the pass reserved for other jobs are not its to take
    for (const auto& [id, held] : reserved)
      if (id != j.id) room.claimed.insert(held.begin(), held.end());
    const auto fits = [&](const std::vector<const Runner*>& victims, std::size_t skip, std::vector<int>* place) {
      std::set<int> slots = free;
      Room trial = room;
      std::set<int> lent;
      for (std::size_t m = 0; m < victims.size(); ++m) {
        if (m == skip) continue;
        for (int s : lends(*victims[m]))
          slots.insert(s);
        lend_gpus(trial, *victims[m]);
        lent.insert(victims[m]->gpus.begin(), victims[m]->gpus.end());
      }
      if (static_cast<int>(slots.size()) < need) return false;
      if (j.gpus <= 0) return true;
      auto on = trial.place(j, lent);
      if (place) *place = on;
      return !on.empty();
    };
    if (fits({}, 0, nullptr)) continue;  // room without anyone frozen: the pass's order holds it back
    if (j.gpus > 0 && !soon.place(j, {}).empty()) continue;           // GPUs coming free already
    using Cost = std::tuple<std::size_t, int, double, std::int64_t>;  // GPUs idled, priority, -start, -id
    std::vector<std::pair<Cost, const Runner*>> ranked;
    for (const Runner& r : running) {
      const bool lends_gpus = !r.gpus.empty() && r.kept_mb > 0;
      if (taken.count(r.id) || (lends(r).empty() && !(j.gpus > 0 && lends_gpus)) ||
          refusal_of(r, j, now, rules, true) != Refusal::none)
        continue;
      ranked.emplace_back(Cost{r.gpus.size(), r.priority, -r.started_at, -r.id}, &r);
    }
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<const Runner*> chosen;
    bool enough = false;
    for (const auto& [_, r] : ranked) {
      chosen.push_back(r);
      if ((enough = fits(chosen, chosen.size(), nullptr))) break;
    }
    if (!enough) {
      if (j.gpus > 0) continue;  // a GPU job may yet be preempted for (requeued victims)
      break;                     // slots: it waits, and the jobs after it wait behind it
    }
    for (std::size_t k = chosen.size(); k-- > 0;)  // those not needed go back, the most expensive first
      if (fits(chosen, k, nullptr)) chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(k));
    Suspension s{j.id, {}, {}, {}};
    fits(chosen, chosen.size(), &s.gpus);
    for (int slot : free) {
      if (static_cast<int>(s.cpu_slots.size()) == need) break;
      s.cpu_slots.push_back(slot);
    }
    for (const Runner* r : chosen) {
      s.victims.push_back(r->id);
      taken.insert(r->id);
      for (int slot : lends(*r))
        if (static_cast<int>(s.cpu_slots.size()) < need) s.cpu_slots.push_back(slot);
      lend_gpus(room, *r);
    }
    for (int slot : s.cpu_slots)
      free.erase(slot);
    for (int g : s.gpus) {  // the borrower holds them now: the jobs after it do not count on them
      room.gpus[g].allocated_mb += j.memory_mb;
      room.gpus[g].holders++;
    }
    std::sort(s.cpu_slots.begin(), s.cpu_slots.end());
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace gpuq::daemon
