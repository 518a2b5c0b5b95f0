// Priority scheduling with gangs, memory packing and reservations (see scheduler.hpp).
#include "daemon/scheduler.hpp"

#include <algorithm>
#include <cmath>

namespace gpuq::daemon {

namespace {

struct Slot {
  GpuState gpu;
  bool reserved = false;
  double reserved_until = 0;  // the reservation's expected start: backfill must end before it
};

bool fits_exclusive(const Slot& s, const PendingJob& j) {
  return s.gpu.holders == 0 && (j.memory_mb == 0 || j.memory_mb <= s.gpu.total_mb);
}

bool fits_shared(const Slot& s, const PendingJob& j) {
  return !s.gpu.exclusive && s.gpu.total_mb - s.gpu.allocated_mb >= j.memory_mb;
}

// May `j` use slot `s` given reservations? Only when it is sure to end before they start; when
// the reservation's start is unknown (a running job without timeout), never.
bool may_use(const Slot& s, const PendingJob& j, double now) {
  if (!s.reserved) return true;
  return j.timeout_s > 0 && std::isfinite(s.reserved_until) && now + j.timeout_s <= s.reserved_until;
}

// Picks the GPUs for `j` now, or returns an empty vector.
std::vector<int> pick(std::vector<Slot>& slots, const PendingJob& j, double now) {
  std::vector<Slot*> cands;
  for (auto& s : slots)
    if (may_use(s, j, now) && (j.shared ? fits_shared(s, j) : fits_exclusive(s, j))) cands.push_back(&s);
  if (cands.size() < static_cast<std::size_t>(j.gpus)) return {};
  if (j.shared) {
    // Best fit: least free memory left after placing the job; then lowest index.
    std::stable_sort(cands.begin(), cands.end(), [](const Slot* a, const Slot* b) {
      return a->gpu.total_mb - a->gpu.allocated_mb < b->gpu.total_mb - b->gpu.allocated_mb;
    });
  }
  std::vector<int> chosen;
  for (int k = 0; k < j.gpus; ++k) {
    Slot& s = *cands[k];
    chosen.push_back(s.gpu.index);
    s.gpu.holders++;
    s.gpu.allocated_mb += j.shared ? j.memory_mb : s.gpu.total_mb;
    s.gpu.exclusive = !j.shared;
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

// Reserves, for a job that cannot start, the GPUs that will serve it soonest. Returns them, or
// nothing when not enough unreserved GPUs could ever hold it.
std::vector<int> reserve(std::vector<Slot>& slots, const PendingJob& j) {
  std::vector<Slot*> cands;
  for (auto& s : slots) {
    if (s.reserved) continue;
    if (j.memory_mb > 0 && j.memory_mb > s.gpu.total_mb) continue;
    cands.push_back(&s);
  }
  if (cands.size() < static_cast<std::size_t>(j.gpus)) return {};
  std::stable_sort(cands.begin(), cands.end(), [](const Slot* a, const Slot* b) {
    if (a->gpu.free_at != b->gpu.free_at) return a->gpu.free_at < b->gpu.free_at;
    return a->gpu.holders < b->gpu.holders;
  });
  double start = 0;
  for (int k = 0; k < j.gpus; ++k) start = std::max(start, cands[k]->gpu.free_at);
  std::vector<int> chosen;
  for (int k = 0; k < j.gpus; ++k) {
    cands[k]->reserved = true;
    cands[k]->reserved_until = start;
    chosen.push_back(cands[k]->gpu.index);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace

Plan schedule(std::vector<PendingJob> queue, std::vector<GpuState> gpus, double now, CpuSlots cpu) {
  std::stable_sort(queue.begin(), queue.end(), [](const PendingJob& a, const PendingJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.id < b.id;
  });
  std::vector<Slot> slots;
  slots.reserve(gpus.size());
  for (auto& g : gpus) slots.push_back({g});

  Plan plan;
  bool cpu_blocked = false;
  for (const auto& j : queue) {
    if (j.gpus == 0) {
      const int need = std::min(j.ranks, cpu.total);
      if (!cpu_blocked && cpu.used + need <= cpu.total) {
        cpu.used += need;
        plan.start.push_back({j.id, {}});
      } else {
        cpu_blocked = true;
        plan.waiting[j.id] = "waiting for " + std::to_string(need) + " CPU slot" + (need == 1 ? "" : "s") + " (" +
                             std::to_string(cpu.total - cpu.used) + " of " + std::to_string(cpu.total) + " free)";
      }
      continue;
    }
    if (j.gpus > static_cast<int>(slots.size())) {
      plan.waiting[j.id] = "needs " + std::to_string(j.gpus) + " GPUs; this machine has " +
                           std::to_string(slots.size());
      continue;
    }
    auto chosen = pick(slots, j, now);
    if (!chosen.empty()) {
      plan.start.push_back({j.id, std::move(chosen)});
      continue;
    }
    auto held = reserve(slots, j);
    if (!held.empty()) {
      plan.reservations[j.id] = held;
      plan.waiting[j.id] = "waiting for " + std::to_string(j.gpus) + (j.shared ? " GPU with " + std::to_string(j.memory_mb) + " MiB free" : j.gpus == 1 ? " free GPU" : " free GPUs") + " (reserved)";
    } else {
      plan.waiting[j.id] = "waiting for GPUs held by higher-priority jobs";
    }
  }
  return plan;
}

}  // namespace gpuq::daemon
