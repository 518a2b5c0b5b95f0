// What a scheduling pass is given (pass_inputs.hpp).
#include "daemon/pass_inputs.hpp"

#include <algorithm>

#include <set>

#include "daemon/config.hpp"
#include "daemon/lifecycle.hpp"

namespace gpuq::daemon {

double ends_by(const JobRecord& r, double grace_s, double preempt_grace_s, double preempt_grace_max_s) {
  // The time it stood frozen (a suspension) does not count; while it is frozen its end waits on
  // another job's.
  double at = r.spec.timeout_s > 0 && r.run.suspended_for == 0
                  ? r.run.started_at + r.spec.timeout_s + r.run.suspended_s + grace_s
                  : k_never;
  // A job preempted ends within its grace: the job it stops for holds a reservation on its GPUs
  // that lower jobs may backfill only if they end before that.
  if (r.run.preempt_requested && r.run.preempted_at > 0)
    at = std::min(
        at, r.run.preempted_at +
                std::min(r.spec.preempt_grace_s >= 0 ? r.spec.preempt_grace_s : preempt_grace_s, preempt_grace_max_s) +
                grace_s);
  return at;
}

double preempt_grace_of(const common::JobSpec& spec, const Config& config) {
  return std::min(spec.preempt_grace_s >= 0 ? spec.preempt_grace_s : config.preempt_grace_s,
                  config.preempt_grace_max_s);
}

std::map<int, GpuHolding> gpu_holdings(const Reads& reads) {
  std::map<int, std::int64_t> totals;
  for (const auto& g : reads.inventory.gpus()) totals[g.index] = g.memory_total_mb;
  std::map<int, GpuHolding> out;
  for (const Active& a : reads.jobs.running()) {
    const double ends =
        ends_by(a.rec, reads.config.grace_s, reads.config.preempt_grace_s, reads.config.preempt_grace_max_s);
    for (int index : a.rec.run.gpus) {
      const auto total = totals.find(index);
      if (total == totals.end()) continue;  // not a GPU of this machine's (any more)
      GpuHolding& h = out[index];
      h.jobs.push_back(a.rec.id);
      h.allocated_mb += a.rec.spec.shared ? gpu_budget_mb(a.rec) : total->second;
      h.exclusive = h.exclusive || !a.rec.spec.shared;
      h.free_at = std::max(h.free_at, ends);
    }
  }
  for (auto& [_, h] : out) std::sort(h.jobs.begin(), h.jobs.end());
  return out;
}

std::vector<GpuState> gpus_for_pass(const Reads& reads) {
  const auto holdings = gpu_holdings(reads);
  const auto& foreign = reads.gpu_processes.foreign_mb();
  std::vector<GpuState> gpus;
  for (const auto& g : reads.inventory.gpus()) {
    if (reads.health.drained(g.uuid)) continue;  // a drained GPU is not there for a pass
    GpuState s{g.index, g.memory_total_mb, 0, 0, 0, false, 0, g.numa_node};
    if (const auto f = foreign.find(g.index); f != foreign.end()) s.foreign_mb = f->second;
    if (const auto h = holdings.find(g.index); h != holdings.end()) {
      s.allocated_mb = h->second.allocated_mb;
      s.holders = static_cast<int>(h->second.jobs.size());
      s.exclusive = h->second.exclusive;
      s.free_at = h->second.free_at;
    }
    gpus.push_back(s);
  }
  return gpus;
}

UserCaps lab_order(const Reads& reads, std::vector<PendingJob>& queue, double now) {
  UserCaps caps;
  if (!reads.config.multi_user || queue.empty()) return caps;
  std::map<std::uint32_t, int> held;  // GPUs, a job without any counting as one
  for (const Active& running : reads.jobs.running())
    held[running.rec.uid] += std::max<int>(static_cast<int>(running.rec.run.gpus.size()), 1);
  std::map<std::uint32_t, double> usage;
  for (const auto& job : queue)
    if (!usage.count(job.user)) {
      usage[job.user] = reads.users.recent_use(job.user, now);
      if (const auto* l = reads.users.limits_of(job.user); l && (l->max_running > 0 || l->max_gpus > 0))
        caps[job.user] = {l->max_running, 0, l->max_gpus, 0};
    }
  for (const Active& running : reads.jobs.running()) {  // running jobs' GPU time so far counts as recent use
    const JobRecord& r = running.rec;
    if (auto u = usage.find(r.uid); u != usage.end() && r.run.started_at > 0)
      u->second += static_cast<double>(r.run.gpus.size()) * std::max(0.0, now - r.run.started_at);
    if (auto c = caps.find(r.uid); c != caps.end()) {
      ++c->second.running;
      c->second.gpus += static_cast<int>(r.run.gpus.size());
    }
  }
  fair_order(queue, held, usage);
  return caps;
}

std::int64_t kept_on_gpu_mb(bool seen, std::optional<std::int64_t> peak_mb, std::int64_t spec_mb) {
  if (!seen) return spec_mb;
  return peak_mb ? std::max(*peak_mb, spec_mb) : 0;
}

std::vector<Runner> runners(const Reads& reads, bool& any_preemptible,
                            const std::function<bool(std::int64_t)>& freezable) {
  std::vector<Runner> out;
  any_preemptible = false;
  std::set<std::int64_t> lent_to;  // jobs running on what a frozen job lends
  for (const Active& a : reads.jobs.running())
    if (a.rec.run.suspended_for != 0) lent_to.insert(a.rec.run.suspended_for);
  const bool seen = reads.gpu_processes.on();  // NVML lists the GPUs' processes here
  for (const Active& a : reads.jobs.running()) {
    const JobRecord& r = a.rec;
    Runner x;
    x.id = r.id;
    x.priority = r.spec.priority;
    x.user = r.uid;
    x.gpus = r.run.gpus;
    x.shared = r.spec.shared;
    x.memory_mb = gpu_budget_mb(r);
    x.preemptible = r.spec.preemptible && r.spec_error.empty();
    x.stopping = stop_asked(r);
    x.started_at = r.run.started_at;
    x.checkpoint_at = r.run.checkpoint_at;
    x.preemptions = r.preemptions + r.suspensions;
    x.resumed_at = r.run.resumed_at;
    x.cpu_slots = r.run.cpu_slots;
    x.suspended = r.run.suspended_for != 0;
    x.borrows = lent_to.count(r.id) > 0;
    // What it keeps on its GPUs frozen: at least its processes' peak as NVML saw it, and at least
    // what its spec says; where gpuqd sees no GPU processes (fake GPUs, no looks), what its spec
    // says. Unknown (0) before NVML has seen it.
    x.kept_mb = kept_on_gpu_mb(seen, seen ? reads.gpu_processes.peak_mb(r.id) : std::nullopt, gpu_budget_mb(r));
    x.may_requeue = r.spec.preempt_mode != common::PreemptMode::suspend;
    // `auto` freezes a job of one process only: a gang's collectives and rendezvous run on wall-clock
    // timeouts (NCCL's watchdog, Gloo's) that a long freeze may pass; `suspend` asks for it all the same.
    x.may_suspend = freezable && freezable(r.id) &&
                    (r.spec.preempt_mode == common::PreemptMode::suspend ||
                     (r.spec.preempt_mode == common::PreemptMode::auto_ && r.spec.ranks <= 1));
    any_preemptible =
        any_preemptible || (x.preemptible && !x.stopping && !x.suspended && x.may_requeue && !x.gpus.empty());
    out.push_back(std::move(x));
  }
  return out;
}

PreemptRules preempt_rules(const Reads& reads, const std::vector<PendingJob>& waiting) {
  PreemptRules rules;
  rules.protect_after = reads.config.preempt_protect_after;
  rules.min_run_s = reads.config.preempt_min_run_s;
  if (!reads.config.multi_user) return rules;
  rules.lab = true;
  rules.across_users = reads.config.preempt_across_users == "fair_share";
  // Each user's GPUs: distinct ones (several shared jobs on one GPU hold one), of jobs not asked
  // to stop (those are freeing theirs).
  std::set<std::uint32_t> users;
  std::map<std::uint32_t, std::set<int>> gpus_of;
  for (const Active& a : reads.jobs.running()) {
    if (!stop_asked(a.rec)) gpus_of[a.rec.uid].insert(a.rec.run.gpus.begin(), a.rec.run.gpus.end());
    if (!a.rec.run.gpus.empty()) users.insert(a.rec.uid);
  }
  for (const auto& [uid, held] : gpus_of)
    rules.held[uid] = static_cast<int>(held.size());
  for (const auto& j : waiting)
    users.insert(j.user);
  int in_service = 0;
  for (const auto& g : reads.inventory.gpus())
    in_service += !reads.health.drained(g.uuid);
  rules.fair_share = users.empty() ? 0 : static_cast<double>(in_service) / static_cast<double>(users.size());
  return rules;
}

}  // namespace gpuq::daemon
