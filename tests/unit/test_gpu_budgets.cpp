// GPU memory budgets (daemon/gpu_budgets.hpp): who is stopped, who has a budget raised.
#include <doctest/doctest.h>

#include "daemon/config.hpp"
#include "daemon/gpu_budgets.hpp"

using namespace gpuq::daemon;

namespace {
// A shared job under judgement, its policy `requeue` unless said.
BudgetJob job(std::int64_t id, int gpu, std::int64_t budget, std::int64_t used, bool may_stop = true) {
  return {id, gpu, budget, used, true, may_stop};
}
const std::vector<BudgetGpu> k_one{{0, 24576, 0}};  // a 24 GiB GPU
}  // namespace

TEST_SUITE_BEGIN("gpu_budgets");

TEST_CASE("a budget is raised half as much again, at least a quarter over what was held, in 256 MiB, up to the GPU") {
  CHECK(raised_budget_mb(20000, 0, 81559) == 30208);      // 30000, rounded up
  CHECK(raised_budget_mb(20000, 26000, 81559) == 32512);  // 32500 over 30000
  CHECK(raised_budget_mb(20000, 26000, 30000) == 30000);  // the GPU's all
  CHECK(raised_budget_mb(81559, 0, 81559) == 81559);      // at the cap: no larger
  CHECK(raised_budget_mb(90000, 0, 81559) == 90000);      // never lowered
}

TEST_CASE("jobs within their budgets, and jobs without one, are left alone") {
  CHECK(judge_budgets(k_one, {job(1, 0, 8000, 8000), job(2, 0, 8000, 100)}).empty());
  BudgetJob exclusive{3, 0, 0, 20000, false, false};  // no budget: the GPU is its own
  CHECK(judge_budgets(k_one, {exclusive}).empty());
}

TEST_CASE("over its budget beside jobs owed room the GPU no longer has: stopped, naming them; they are not") {
  // 12000 + 6000 held of 24576 leaves 6576 free; job 2 is owed 10000 - 6000 = 4000, fine; with
  // 15000 held by job 1 it is 3576 free for 4000 owed: job 1 is stopped, job 2 never.
  auto r = judge_budgets(k_one, {job(1, 0, 8000, 15000), job(2, 0, 10000, 6000)});
  REQUIRE(r.size() == 1);
  CHECK(r[0].id == 1);
  CHECK(r[0].stop);
  CHECK(r[0].short_of == std::vector<std::int64_t>{2});
  CHECK(r[0].short_mb == 424);
  CHECK(r[0].raised_mb == 18944);  // 15000 * 1.25 = 18750, in 256 MiB
  CHECK(overrun_words(r[0]) == "it held 15000 MiB of its 8000 MiB budget on GPU 0");
}

TEST_CASE("over its budget on a GPU with room for what the others are owed: its budget raised, not stopped") {
  auto r = judge_budgets(k_one, {job(1, 0, 8000, 12000)});
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].stop);
  CHECK(r[0].raised_mb == 15104);  // 12000 * 1.25 = 15000 over 12000, in 256 MiB
  CHECK(r[0].short_of.empty());
  // Never into the room another's budget claims: 24576 less job 2's 10000 leaves it 14576.
  r = judge_budgets(k_one, {job(1, 0, 8000, 12000), job(2, 0, 10000, 6000)});
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].stop);
  CHECK(r[0].raised_mb == 14576);
}

TEST_CASE("memory held outside gpuq takes from the room as any other") {
  const std::vector<BudgetGpu> crowded{{0, 24576, 6000}};
  auto r = judge_budgets(crowded, {job(1, 0, 8000, 12000), job(2, 0, 10000, 6000)});
  REQUIRE(r.size() == 1);
  CHECK(r[0].stop);  // 24576 - 6000 - 18000 = 576 free for 4000 owed
}

TEST_CASE("policy warn: raised however short its neighbours are, never stopped") {
  auto r = judge_budgets(k_one, {job(1, 0, 8000, 15000, false), job(2, 0, 10000, 6000)});
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].stop);
  CHECK(r[0].raised_mb == 15000);  // what it holds: the rest is job 2's
}

TEST_CASE("several over: the furthest over is stopped first, and only as many as the room owed needs") {
  // 5000 + 7000 + 2000 = 14000 held of 20000: 6000 free for 8000 owed to job 3. Stopping job 2
  // (3000 over) frees 7000: then 13000 free, enough; job 1 (1000 over) is raised.
  const std::vector<BudgetGpu> gpu{{0, 20000, 0}};
  auto r = judge_budgets(gpu, {job(1, 0, 4000, 5000), job(2, 0, 4000, 7000), job(3, 0, 10000, 2000)});
  REQUIRE(r.size() == 2);
  CHECK((r[0].id == 1 && !r[0].stop));
  CHECK((r[1].id == 2 && r[1].stop));
  CHECK(r[1].short_of == std::vector<std::int64_t>{3});
}

TEST_CASE("a job stopping is not judged, and what it holds counts as coming back: no second job stopped for it") {
  const BudgetJob stopping{1, 0, 8000, 15000, false, true, true};
  CHECK(judge_budgets(k_one, {stopping, job(2, 0, 10000, 6000)}).empty());
  // Job 3 over its budget beside job 2, owed 4000: 24576 - 7000 is room enough once job 1 is gone.
  auto r = judge_budgets(k_one, {stopping, job(2, 0, 6000, 2000), job(3, 0, 2000, 5000)});
  REQUIRE(r.size() == 1);
  CHECK((r[0].id == 3 && !r[0].stop));
}

TEST_CASE("a frozen job keeps what it holds and is owed nothing more: it neither is judged nor makes others stop") {
  const BudgetJob frozen{1, 0, 8000, 15000, false, true, false};
  auto r = judge_budgets(k_one, {frozen, job(2, 0, 6000, 2000), job(3, 0, 2000, 5000)});
  REQUIRE(r.size() == 1);
  CHECK((r[0].id == 3 && r[0].stop));  // 24576 - 22000 held leaves 2576 for the 4000 job 2 is owed
  // Frozen under its budget (a suspension placed a job beside what it keeps): its unused budget is
  // no room owed, so job 3 is raised, not stopped.
  const BudgetJob kept{1, 0, 20000, 5000, false, true, false};
  r = judge_budgets(k_one, {kept, job(3, 0, 2000, 5000)});
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].stop);
}

TEST_CASE("a job over on two GPUs is judged once: stopped where it is short of room, else raised where furthest over") {
  const std::vector<BudgetGpu> two{{0, 24576, 0}, {1, 24576, 0}};
  auto r = judge_budgets(two, {job(1, 0, 8000, 9000), job(1, 1, 8000, 15000), job(2, 1, 10000, 6000)});
  REQUIRE(r.size() == 1);
  CHECK((r[0].stop && r[0].gpu == 1));
  r = judge_budgets(two, {job(1, 0, 8000, 9000), job(1, 1, 8000, 12000)});
  REQUIRE(r.size() == 1);
  CHECK((!r[0].stop && r[0].gpu == 1 && r[0].used_mb == 12000));
  // Stopped where it is short of room, its new budget is enough for where it held most.
  const std::vector<BudgetGpu> crowded{{0, 24576, 0}, {1, 24576, 12000}};
  r = judge_budgets(crowded, {job(1, 0, 8000, 15000), job(1, 1, 8000, 9000), job(2, 1, 10000, 1000)});
  REQUIRE(r.size() == 1);
  CHECK((r[0].stop && r[0].gpu == 1));
  CHECK(r[0].raised_mb == 18944);  // GPU 0's 15000 * 1.25, not GPU 1's 12032
}

TEST_CASE("the policy: the spec's, else gpuqd's; in lab mode a spec's warn does not loosen gpuqd's requeue") {
  using gpuq::common::MemoryPolicy;
  gpuq::daemon::Config c;
  gpuq::common::JobSpec spec;
  CHECK(c.budget_stops(spec));  // requeue, gpuqd's default
  spec.gpu_memory_policy = MemoryPolicy::warn;
  CHECK_FALSE(c.budget_stops(spec));
  c.gpu_memory_policy = "warn";
  spec.gpu_memory_policy = MemoryPolicy::requeue;
  CHECK(c.budget_stops(spec));  // a job may ask to be held tighter
  spec.gpu_memory_policy = MemoryPolicy::default_;
  CHECK_FALSE(c.budget_stops(spec));
  c.multi_user = true;
  c.gpu_memory_policy = "requeue";
  spec.gpu_memory_policy = MemoryPolicy::warn;
  CHECK(c.budget_stops(spec));
}
