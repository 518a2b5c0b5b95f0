// GPU memory budgets (gpu_budgets.hpp).
#include "daemon/gpu_budgets.hpp"

#include <algorithm>
#include <map>

namespace gpuq::daemon {

std::int64_t raised_budget_mb(std::int64_t budget_mb, std::int64_t used_mb, std::int64_t cap_mb) {
  std::int64_t want = std::max(budget_mb + budget_mb / 2, used_mb + used_mb / 4);
  want = (want + 255) / 256 * 256;
  if (cap_mb > 0) want = std::min(want, cap_mb);
  return std::max(want, budget_mb);  // never lowered (a budget past the cap stays as it is)
}

std::vector<Overrun> judge_budgets(const std::vector<BudgetGpu>& gpus, const std::vector<BudgetJob>& jobs) {
  std::map<int, std::vector<const BudgetJob*>> on;
  for (const auto& j : jobs)
    on[j.gpu].push_back(&j);
  std::map<std::int64_t, Overrun> out;  // a job's, over all its GPUs
  for (const auto& g : gpus) {
    const auto here = on.find(g.gpu);
    if (here == on.end()) continue;
    std::int64_t free = g.total_mb - g.foreign_mb, owed = 0, claimed = 0;  // claimed: max(budget, held), all jobs
    std::vector<std::int64_t> owed_to;
    std::vector<const BudgetJob*> over;
    for (const BudgetJob* j : here->second) {
      if (!j->leaving) {
        free -= j->used_mb;
        claimed += std::max(j->budget_mb, j->used_mb);
      }
      if (j->judged && j->budget_mb > 0 && j->used_mb > j->budget_mb) {
        over.push_back(j);
      } else if (j->judged && j->budget_mb > j->used_mb) {  // room it may still grow into
        owed += j->budget_mb - j->used_mb;
        owed_to.push_back(j->id);
      }
    }
    std::sort(over.begin(), over.end(), [](const BudgetJob* a, const BudgetJob* b) {
      const std::int64_t x = a->used_mb - a->budget_mb, y = b->used_mb - b->budget_mb;
      return x != y ? x > y : a->id < b->id;
    });
    for (const BudgetJob* j : over) {
      // Stopped, it is placed anew with the larger budget (at most what the GPU has beside the
      // memory held outside gpuq); raised in place, at most into what no one else here claims.
      const std::int64_t larger = raised_budget_mb(j->budget_mb, j->used_mb, g.total_mb - g.foreign_mb);
      Overrun o{j->id, g.gpu, j->used_mb, j->budget_mb, larger, false, {}, 0};
      if (free < owed && j->may_stop) {
        o.stop = true;
        o.short_of = owed_to;
        o.short_mb = owed - free;
        free += j->used_mb;  // what it holds comes back once it has gone
        claimed -= j->used_mb;
      } else {
        const std::int64_t room = g.total_mb - g.foreign_mb - (claimed - j->used_mb);
        o.raised_mb = std::max(std::min(larger, room), j->used_mb);
        claimed += o.raised_mb - j->used_mb;
      }
      auto [it, fresh] = out.emplace(o.id, o);
      if (fresh) continue;
      Overrun& kept = it->second;  // another GPU of its: the stop wins, else the furthest over
      const std::int64_t most = std::max(kept.raised_mb, o.raised_mb);  // enough on each GPU of its
      if ((o.stop && !kept.stop) || (o.stop == kept.stop && o.used_mb - o.budget_mb > kept.used_mb - kept.budget_mb))
        kept = o;
      kept.raised_mb = most;
    }
  }
  std::vector<Overrun> result;
  for (auto& [_, o] : out)
    result.push_back(std::move(o));
  return result;
}

std::string overrun_words(const Overrun& o) {
  return "it held " + std::to_string(o.used_mb) + " MiB of its " + std::to_string(o.budget_mb) + " MiB budget on GPU " +
         std::to_string(o.gpu);
}

}  // namespace gpuq::daemon
