// Priority scheduling with gangs, memory packing and reservations (see scheduler.hpp).
#include "daemon/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <queue>
#include <tuple>

namespace gpuq::daemon {

namespace {

struct Slot {
  GpuState gpu;
  bool reserved = false;
  double reserved_until = 0;  // the reservation's expected start: backfill must end before it
};

std::int64_t free_mb(const Slot& s) { return s.gpu.total_mb - s.gpu.allocated_mb - s.gpu.foreign_mb; }

bool fits_exclusive(const Slot& s, const PendingJob& j) {
  return s.gpu.holders == 0 && (j.memory_mb == 0 || j.memory_mb <= s.gpu.total_mb - s.gpu.foreign_mb);
}

bool fits_shared(const Slot& s, const PendingJob& j) { return !s.gpu.exclusive && free_mb(s) >= j.memory_mb; }

// May `j` use slot `s` given reservations? Only when it is sure to end before they start; when
// the reservation's start is unknown (a running job without timeout), never.
bool may_use(const Slot& s, const PendingJob& j, double now) {
  if (!s.reserved) return true;
  return j.timeout_s > 0 && std::isfinite(s.reserved_until) && now + j.timeout_s <= s.reserved_until;
}

int slot_node(const CpuSlots& cpu, int slot) {
  return cpu.core_nodes[static_cast<std::size_t>(slot) % cpu.core_nodes.size()];
}

// Free CPU slots per NUMA node (empty when the slots' nodes are unknown).
std::map<int, int> free_by_node(const CpuSlots& cpu) {
  std::map<int, int> out;
  if (!cpu.core_nodes.empty())
    for (int s = 0; s < cpu.total; ++s)
      if (!cpu.taken.count(s)) ++out[slot_node(cpu, s)];
  return out;
}

// The first `n` of `cands`, or, for several GPUs, the first `n` on one NUMA node when a node has
// that many (the node of the earliest such candidate).
std::vector<Slot*> one_node_first(std::vector<Slot*> cands, int n) {
  for (const Slot* first : cands) {
    if (n < 2) break;
    if (first->gpu.node < 0) continue;
    std::vector<Slot*> same;
    for (Slot* s : cands)
      if (s->gpu.node == first->gpu.node) same.push_back(s);
    if (same.size() >= static_cast<std::size_t>(n)) {
      same.resize(n);
      return same;
    }
  }
  cands.resize(n);
  return cands;
}

// Picks the GPUs for `j` now, or returns an empty vector.
std::vector<int> pick(std::vector<Slot>& slots, const PendingJob& j, double now, const CpuSlots& cpu) {
  std::vector<Slot*> cands;
  for (auto& s : slots)
    if (may_use(s, j, now) && (j.shared ? fits_shared(s, j) : fits_exclusive(s, j))) cands.push_back(&s);
  if (cands.size() < static_cast<std::size_t>(j.gpus)) return {};
  if (j.shared && j.spread) {
    // Spread: the GPU with the fewest jobs, then the most free memory; then lowest index.
    std::stable_sort(cands.begin(), cands.end(), [](const Slot* a, const Slot* b) {
      return a->gpu.holders != b->gpu.holders ? a->gpu.holders < b->gpu.holders : free_mb(*a) > free_mb(*b);
    });
  } else if (j.shared) {
    // Best fit: least free memory left after placing the job; then lowest index.
    std::stable_sort(cands.begin(), cands.end(), [](const Slot* a, const Slot* b) { return free_mb(*a) < free_mb(*b); });
  }
  if (j.cpus > 0) {
    // A job with `cpus` first looks at GPUs whose node still has a rank's worth of free slots, as
    // Slurm picks GPUs bound to the cores it allocates.
    const auto free = free_by_node(cpu);
    std::stable_partition(cands.begin(), cands.end(), [&](const Slot* s) {
      const auto it = free.find(s->gpu.node);
      return it != free.end() && it->second >= j.cpus;
    });
  }
  std::vector<int> chosen;
  for (Slot* taken : one_node_first(cands, j.gpus)) {
    Slot& s = *taken;
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

int free_slots(const CpuSlots& cpu) {
  int taken = 0;
  for (int s : cpu.taken) taken += s < cpu.total;
  return cpu.total - taken;
}

// Takes `need` free slots, ascending, those on the `near` NUMA nodes first (any node when `near`
// is empty or the slots' nodes are unknown): the first run of consecutive free near slots that is
// long enough (nearby cores tend to share caches), else the lowest free near ones, then others.
std::vector<int> take_slots(CpuSlots& cpu, int need, std::set<int> near = {}) {
  std::vector<int> chosen;
  if (need <= 0) return chosen;
  if (cpu.core_nodes.empty()) near.clear();
  auto usable = [&](int s, bool anywhere) {
    return !cpu.taken.count(s) && (anywhere || near.empty() || near.count(slot_node(cpu, s)));
  };
  int run_start = 0;
  for (int s = 0; s < cpu.total; ++s) {
    if (!usable(s, false)) {
      run_start = s + 1;
    } else if (s - run_start + 1 == need) {
      for (int k = run_start; k <= s; ++k) chosen.push_back(k);
      break;
    }
  }
  if (chosen.empty()) {  // no run is long enough: the lowest free slots, scattered, near ones first
    for (bool anywhere : {false, true})
      for (int s = 0; s < cpu.total && static_cast<int>(chosen.size()) < need; ++s)
        if (usable(s, anywhere) && std::find(chosen.begin(), chosen.end(), s) == chosen.end()) chosen.push_back(s);
    std::sort(chosen.begin(), chosen.end());
  }
  cpu.taken.insert(chosen.begin(), chosen.end());
  return chosen;
}

// The slots of a job placed on `gpus` (ascending), in rank order. Where the nodes are known each
// rank's are near its own GPUs: rank r of a job with k GPUs per rank drives gpus[r·k, (r+1)·k)
// (its LOCAL_RANK's device; a stage split's devices; a single process's all of them).
std::vector<int> take_job_slots(CpuSlots& cpu, const PendingJob& j, const std::vector<int>& gpus,
                                const std::vector<Slot>& slots) {
  auto nodes_of = [&](std::size_t from, std::size_t to) {
    std::set<int> nodes;
    for (const auto& s : slots)
      if (s.gpu.node >= 0 && std::find(gpus.begin() + from, gpus.begin() + to, s.gpu.index) != gpus.begin() + to)
        nodes.insert(s.gpu.node);
    return nodes;
  };
  const int need = cpu_slots_needed(j, cpu.total);
  const std::set<int> all = nodes_of(0, gpus.size());
  const std::size_t ranks = static_cast<std::size_t>(std::max(1, j.ranks));
  if (all.empty() || cpu.core_nodes.empty() || j.cpus <= 0 || need != j.cpus * j.ranks || gpus.size() % ranks != 0)
    return take_slots(cpu, need, all);
  const std::size_t k = gpus.size() / ranks;
  std::vector<int> out;
  for (std::size_t r = 0; r < ranks; ++r) {
    auto mine = take_slots(cpu, j.cpus, nodes_of(r * k, (r + 1) * k));
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

std::string cpu_wait_reason(int need, int free, int total) {
  return "waiting for " + std::to_string(need) + " CPU slot" + (need == 1 ? "" : "s") + " (" + std::to_string(free) +
         " of " + std::to_string(total) + " free)";
}

std::string cpu_wait_reason(int need, const CpuSlots& cpu) { return cpu_wait_reason(need, free_slots(cpu), cpu.total); }

std::string too_many_gpus_reason(const PendingJob& j, std::size_t gpus) {
  return "needs " + std::to_string(j.gpus) + " GPUs; this machine has " + std::to_string(gpus);
}

const char* k_gpus_held = "waiting for GPUs held by higher-priority jobs";

}  // namespace

int cpu_slots_needed(const PendingJob& j, int total) {
  const long long per_rank = j.cpus > 0 ? j.cpus : j.gpus == 0 ? 1 : 0;
  return static_cast<int>(std::min<long long>(per_rank * j.ranks, total));
}

std::string tail_wait_reason(const PendingJob& j, const TailState& tail) {
  // As the pass's own branches, in the state it stopped in: a job needing CPU slots finds none it
  // can take, and one needing none finds every GPU held and reserved.
  if (j.gpus > tail.gpu_count) return too_many_gpus_reason(j, static_cast<std::size_t>(tail.gpu_count));
  const int need = cpu_slots_needed(j, tail.cpu_total);
  if (need > 0) return cpu_wait_reason(need, tail.cpu_free, tail.cpu_total);
  return k_gpus_held;
}

std::string batch_limit_reason(std::int64_t batch, const BatchLimit& limit) {
  return "batch " + std::to_string(batch) + " runs " + std::to_string(limit.running) + " jobs, its limit (max_running " +
         std::to_string(limit.limit) + ")";
}

bool user_at_limit(const UserCap& cap, int gpus) {
  return (cap.max_running > 0 && cap.running >= cap.max_running) || (cap.max_gpus > 0 && cap.gpus + gpus > cap.max_gpus);
}

std::string user_limit_reason(const std::string& name, const UserCap& cap, int gpus) {
  if (cap.max_running > 0 && cap.running >= cap.max_running)
    return name + " runs " + std::to_string(cap.running) + " jobs, their limit (max_running " +
           std::to_string(cap.max_running) + ")";
  return name + " holds " + std::to_string(cap.gpus) + " GPUs; " + std::to_string(gpus) +
         " more would pass their limit (max_gpus " + std::to_string(cap.max_gpus) + ")";
}

void fair_order(std::vector<PendingJob>& queue, const std::map<std::uint32_t, int>& held,
                const std::map<std::uint32_t, double>& usage) {
  const auto units = [](const PendingJob& j) { return std::max(j.gpus, 1); };
  std::vector<PendingJob> out;
  out.reserve(queue.size());
  for (std::size_t begin = 0; begin < queue.size();) {
    std::size_t end = begin + 1;
    bool several = false;
    while (end < queue.size() && queue[end].priority == queue[begin].priority) {
      several = several || queue[end].user != queue[begin].user;
      ++end;
    }
    if (!several) {
      std::move(queue.begin() + static_cast<std::ptrdiff_t>(begin), queue.begin() + static_cast<std::ptrdiff_t>(end),
                std::back_inserter(out));
      begin = end;
      continue;
    }
    // Each user's jobs of the run, in order; then a merge by (held, usage, uid), smallest first.
    std::map<std::uint32_t, std::vector<std::size_t>> mine;
    for (std::size_t i = begin; i < end; ++i) mine[queue[i].user].push_back(i);
    using Key = std::tuple<long long, double, std::uint32_t>;
    std::priority_queue<Key, std::vector<Key>, std::greater<>> next;
    std::map<std::uint32_t, std::pair<long long, std::size_t>> state;  // uid -> (held, next of mine)
    for (const auto& [uid, _] : mine) {
      const auto h = held.find(uid);
      const auto u = usage.find(uid);
      state[uid] = {h == held.end() ? 0 : h->second, 0};
      next.emplace(state[uid].first, u == usage.end() ? 0.0 : u->second, uid);
    }
    while (!next.empty()) {
      auto [h, use, uid] = next.top();
      next.pop();
      auto& [held_now, k] = state[uid];
      const auto& list = mine[uid];
      out.push_back(std::move(queue[list[k]]));
      held_now += units(out.back());
      if (++k < list.size()) next.emplace(held_now, use, uid);
    }
    begin = end;
  }
  queue = std::move(out);
}

Plan schedule(std::vector<PendingJob> queue, std::vector<GpuState> gpus, double now, CpuSlots cpu, bool stop_early,
              BatchLimits limits, UserCaps users) {
  // Priority first; within one, the order given (submission order, or gpuqd's fair share).
  const auto before = [](const PendingJob& a, const PendingJob& b) { return a.priority > b.priority; };
  if (!std::is_sorted(queue.begin(), queue.end(), before)) std::stable_sort(queue.begin(), queue.end(), before);
  std::vector<Slot> slots;
  slots.reserve(gpus.size());
  for (auto& g : gpus) slots.push_back({g});

  // Which later jobs could still start: one needing CPU slots only while a slot can be taken, a
  // GPU job needing none (no `cpus`) only while some GPU is not held whole and reserved, and one
  // needing neither (a pool of no slots) always. Once every kind left is blocked, the pass stops.
  std::size_t past_needy = 0, past_slotless = 0, past_free = 0;
  for (std::size_t i = 0; i < queue.size(); ++i) {
    if (queue[i].gpus > static_cast<int>(slots.size())) continue;  // never starts, whatever is free
    if (cpu_slots_needed(queue[i], cpu.total) > 0) past_needy = i + 1;
    else if (queue[i].gpus > 0) past_slotless = i + 1;
    else past_free = i + 1;
  }
  const auto gpus_dead = [&] {
    return std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.reserved && s.gpu.exclusive; });
  };

  Plan plan;
  bool cpu_blocked = false;
  // Whether every job that waits for slots so far is in plan.wanting_slots: a job listed after one
  // that is not (a GPU job waiting for slots too) could take, through a suspension, the slots that
  // one waits for ahead of it.
  bool slots_listed = true;
  // The limit of the batch of the job before: a batch's jobs mostly lie together in line, so a
  // full batch costs a comparison per job, not a lookup.
  std::int64_t limit_batch = 0;
  BatchLimit* limit = nullptr;
  bool noted = false;  // limit_batch is in plan.at_limit
  for (std::size_t i = 0; i < queue.size(); ++i) {
    const PendingJob& j = queue[i];
    if (stop_early && i >= past_free && (i >= past_needy || cpu_blocked || free_slots(cpu) == 0) &&
        (i >= past_slotless || gpus_dead())) {
      plan.stopped = true;
      plan.tail = {static_cast<int>(slots.size()), free_slots(cpu), cpu.total};
      // The job it stops at may still start on slots a suspension lends it (preemption.hpp).
      const auto limited = [&] {
        const auto batch = limits.find(j.batch);
        const auto user = users.find(j.user);
        return (batch != limits.end() && batch->second.running >= batch->second.limit) ||
               (user != users.end() && user_at_limit(user->second, j.gpus));
      };
      if (j.gpus == 0 && slots_listed && plan.wanting_slots.empty() && cpu_slots_needed(j, cpu.total) > 0 && !limited())
        plan.wanting_slots.push_back(j);
      break;
    }
    if (j.gpus > static_cast<int>(slots.size())) {
      plan.waiting[j.id] = too_many_gpus_reason(j, slots.size());
      continue;
    }
    if (j.batch != limit_batch) {
      limit_batch = j.batch;
      auto it = limits.find(j.batch);
      limit = it == limits.end() ? nullptr : &it->second;
      noted = false;
    }
    if (limit && limit->running >= limit->limit) {
      if (!noted) plan.at_limit.emplace(j.batch, *limit);  // as the batch first reached its limit
      noted = true;
      continue;
    }
    UserCap* cap = nullptr;
    if (!users.empty())
      if (auto it = users.find(j.user); it != users.end()) cap = &it->second;
    if (cap && user_at_limit(*cap, j.gpus)) {
      plan.users_at_limit.emplace(j.user, *cap);  // as the user first reached a limit
      continue;
    }
    const auto started = [&] {
      if (limit) ++limit->running;
      if (cap) ++cap->running, cap->gpus += j.gpus;
    };
    const int need = cpu_slots_needed(j, cpu.total);
    const bool cpus_free = need == 0 || (!cpu_blocked && free_slots(cpu) >= need);
    if (j.gpus == 0) {
      if (cpus_free) {
        plan.start.push_back({j.id, {}, take_slots(cpu, need)});
        started();
      } else {
        cpu_blocked = true;
        plan.waiting[j.id] = cpu_wait_reason(need, cpu);
        slots_listed = slots_listed && plan.wanting_slots.size() < k_max_wanting;
        if (slots_listed) plan.wanting_slots.push_back(j);
      }
      continue;
    }
    if (!cpus_free) {
      // Hold its GPUs too, or GPU-only jobs behind it could keep taking them.
      cpu_blocked = true;
      slots_listed = false;
      if (auto held = reserve(slots, j); !held.empty()) plan.reservations[j.id] = held;
      plan.waiting[j.id] = cpu_wait_reason(need, cpu);
      continue;
    }
    auto chosen = pick(slots, j, now, cpu);
    if (!chosen.empty()) {
      auto cpu_slots = take_job_slots(cpu, j, chosen, slots);
      plan.start.push_back({j.id, std::move(chosen), std::move(cpu_slots)});
      started();
      continue;
    }
    plan.wanting_gpus.push_back(j);
    auto held = reserve(slots, j);
    if (!held.empty()) {
      plan.reservations[j.id] = held;
      plan.waiting[j.id] = "waiting for " + std::to_string(j.gpus) + (j.shared ? " GPU with " + std::to_string(j.memory_mb) + " MiB free" : j.gpus == 1 ? " free GPU" : " free GPUs") + " (reserved)";
    } else {
      plan.waiting[j.id] = k_gpus_held;
    }
  }
  return plan;
}

Handover hand_over(const std::vector<PendingJob>& queue, BatchLimits limits,
                   const std::function<std::string(const PendingJob&)>& array_key, std::size_t max_array) {
  Handover out;
  std::map<std::pair<std::int64_t, std::string>, std::size_t> open;  // (batch, key) -> its array
  std::set<std::int64_t> open_batches;  // those with an array in this pass, which their jobs may join
  for (const auto& job : queue) {
    auto l = limits.find(job.batch);
    const bool full = l != limits.end() && l->second.running >= l->second.limit;
    if (full && !open_batches.count(job.batch)) {  // a throttled sweep's waiting jobs cost no key each
      out.plan.at_limit[job.batch] = l->second;
      continue;
    }
    const std::string key = array_key(job);
    if (auto o = key.empty() ? open.end() : open.find({job.batch, key});
        o != open.end() && out.arrays[o->second].ids.size() < max_array) {
      out.arrays[o->second].ids.push_back(job.id);
      continue;
    }
    if (full) {
      out.plan.at_limit[job.batch] = l->second;
      continue;
    }
    if (key.empty()) {
      if (l != limits.end()) ++l->second.running;
      out.plan.start.push_back({job.id, {}, {}});
      continue;
    }
    open[{job.batch, key}] = out.arrays.size();
    open_batches.insert(job.batch);
    out.arrays.push_back({{job.id}, l == limits.end() ? 0 : l->second.limit - l->second.running});
    if (l != limits.end()) l->second.running = l->second.limit;
  }
  return out;
}

}  // namespace gpuq::daemon
