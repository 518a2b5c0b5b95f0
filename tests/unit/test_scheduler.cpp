// Scheduler policies: order, gangs, packing, reservations, backfill, CPU slots and NUMA. Pure: no
// daemon needed.
#include <doctest/doctest.h>

#include <random>
#include <set>

#include "daemon/scheduler.hpp"

using namespace gpuq::daemon;

namespace {
std::vector<GpuState> idle_gpus(int n, std::int64_t mb = 81920) {
  std::vector<GpuState> g;
  for (int i = 0; i < n; ++i) g.push_back({i, mb, 0, 0, 0, false, 0});
  return g;
}
PendingJob exclusive(std::int64_t id, int gpus, int priority = 0, double timeout = 0) {
  return {id, priority, gpus, false, 0, timeout};
}
PendingJob shared(std::int64_t id, std::int64_t mb, int priority = 0) { return {id, priority, 1, true, mb, 0}; }
void hold(GpuState& g, bool excl, std::int64_t mb, double free_at = k_never) {
  g.holders++;
  g.exclusive = excl;
  g.allocated_mb += excl ? g.total_mb : mb;
  g.free_at = free_at;
}
// n idle GPUs on the NUMA nodes listed.
std::vector<GpuState> gpus_on(const std::vector<int>& nodes) {
  auto g = idle_gpus(static_cast<int>(nodes.size()));
  for (std::size_t i = 0; i < nodes.size(); ++i)
    g[i].node = nodes[i];
  return g;
}
std::vector<std::int64_t> started(const Plan& p) {
  std::vector<std::int64_t> ids;
  for (const auto& s : p.start) ids.push_back(s.id);
  return ids;
}
// Why `j` waits after the pass `p`: the pass's word for the jobs it examined, else the tail's.
std::string why(const Plan& p, const PendingJob& j) {
  if (const auto it = p.waiting.find(j.id); it != p.waiting.end()) return it->second;
  return p.stopped ? tail_wait_reason(j, p.tail) : "";
}
}  // namespace

TEST_SUITE_BEGIN("scheduler");

TEST_CASE("exclusive jobs each get their own GPU, never more jobs than GPUs") {
  std::vector<PendingJob> q;
  for (int i = 1; i <= 6; ++i) q.push_back(exclusive(i, 1));
  auto p = schedule(q, idle_gpus(4), 0);
  REQUIRE(p.start.size() == 4);
  std::set<int> used;
  for (const auto& s : p.start) {
    REQUIRE(s.gpus.size() == 1);
    used.insert(s.gpus[0]);
  }
  CHECK(used.size() == 4);
  CHECK(started(p) == std::vector<std::int64_t>{1, 2, 3, 4});
}

TEST_CASE("higher priority starts first, then submission order") {
  auto p = schedule({exclusive(1, 1), exclusive(2, 1, 5), exclusive(3, 1), exclusive(4, 1, 5)}, idle_gpus(2), 0);
  CHECK(started(p) == std::vector<std::int64_t>{2, 4});
}

TEST_CASE("jobs without GPUs always start") {
  auto gpus = idle_gpus(1);
  hold(gpus[0], true, 0);
  auto p = schedule({exclusive(1, 0), exclusive(2, 1), exclusive(3, 0)}, gpus, 0);
  CHECK(started(p) == std::vector<std::int64_t>{1, 3});
}

TEST_CASE("a 2-GPU ddp job waits until both GPUs are free, then gets both at once") {
  auto gpus = idle_gpus(2);
  hold(gpus[1], true, 0);
  auto p = schedule({exclusive(1, 2)}, gpus, 0);
  CHECK(p.start.empty());
  CHECK(p.reservations.at(1).size() == 2);
  gpus = idle_gpus(2);
  p = schedule({exclusive(1, 2)}, gpus, 0);
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{0, 1});
}

TEST_CASE("a big gang is not starved by a stream of small jobs") {
  // GPU 3 is busy; the 4-GPU job at the head of the queue reserves all four, so the small jobs
  // behind it may not take GPUs 0-2 even though they are idle now.
  auto gpus = idle_gpus(4);
  hold(gpus[3], true, 0);
  auto p = schedule({exclusive(1, 4), exclusive(2, 1), exclusive(3, 1)}, gpus, 0);
  CHECK(p.start.empty());
  CHECK(p.reservations.at(1) == std::vector<int>{0, 1, 2, 3});
  CHECK(p.waiting.count(2) == 1);
}

TEST_CASE("a short job backfills onto reserved GPUs when its timeout ends before the reservation starts") {
  auto gpus = idle_gpus(2);
  hold(gpus[1], true, 0, /*free_at=*/1000);  // the running job's timeout ends at t=1000
  auto p = schedule({exclusive(1, 2), exclusive(2, 1, 0, 500), exclusive(3, 1, 0, 5000), exclusive(4, 1)}, gpus, 100);
  // job 2 (ends by 600) fits before the reservation at 1000; job 3 (ends by 5100) and job 4 (no timeout) do not
  CHECK(started(p) == std::vector<std::int64_t>{2});
}

TEST_CASE("without timeouts on running jobs there is no backfill onto a reservation") {
  auto gpus = idle_gpus(2);
  hold(gpus[1], true, 0);  // free_at = never
  auto p = schedule({exclusive(1, 2), exclusive(2, 1, 0, 1)}, gpus, 0);
  CHECK(p.start.empty());
}

TEST_CASE("shared jobs pack onto one GPU by memory, best fit, leaving other GPUs idle") {
  auto gpus = idle_gpus(2, 40000);
  auto p = schedule({shared(1, 10000), shared(2, 10000), shared(3, 15000), shared(4, 10000)}, gpus, 0);
  REQUIRE(p.start.size() == 4);
  // 10000+10000+15000 = 35000 fit on GPU 0; the fourth (10000) no longer fits there.
  CHECK(p.start[0].gpus == std::vector<int>{0});
  CHECK(p.start[1].gpus == std::vector<int>{0});
  CHECK(p.start[2].gpus == std::vector<int>{0});
  CHECK(p.start[3].gpus == std::vector<int>{1});
}

TEST_CASE("spread puts each shared job on the GPU with the fewest jobs, then the most free memory") {
  auto gpus = idle_gpus(3, 40000);
  hold(gpus[0], false, 30000);  // one job there already, 10000 free
  std::vector<PendingJob> jobs;
  for (std::int64_t id = 1; id <= 4; ++id) {
    jobs.push_back(shared(id, 5000));
    jobs.back().spread = true;
  }
  auto p = schedule(jobs, gpus, 0);
  REQUIRE(p.start.size() == 4);
  CHECK(p.start[0].gpus == std::vector<int>{1});  // GPUs 1 and 2 have none: the lower index
  CHECK(p.start[1].gpus == std::vector<int>{2});
  CHECK(p.start[2].gpus == std::vector<int>{1});  // one each now: GPU 1 has 35000 free, GPU 0 10000
  CHECK(p.start[3].gpus == std::vector<int>{2});
  // The same jobs packed: all on GPU 0 while they fit there (best fit), the rest next to it.
  for (auto& j : jobs)
    j.spread = false;
  auto packed = schedule(jobs, idle_gpus(3, 40000), 0);
  for (const auto& s : packed.start)
    CHECK(s.gpus == std::vector<int>{0});
}

TEST_CASE("best fit prefers the fuller GPU that still has room") {
  auto gpus = idle_gpus(2, 40000);
  hold(gpus[0], false, 10000);
  hold(gpus[1], false, 30000);
  auto p = schedule({shared(1, 8000)}, gpus, 0);
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{1});  // 2000 MiB left there vs 22000 on GPU 0
}

TEST_CASE("memory held outside gpuq is not there to give: shared jobs pack around it, and an exclusive job naming its memory needs that much beside it") {
  auto gpus = idle_gpus(2, 40000);
  gpus[0].foreign_mb = 30000;  // a notebook on GPU 0
  auto p = schedule({shared(1, 20000), shared(2, 8000)}, gpus, 0);
  REQUIRE(p.start.size() == 2);
  CHECK(p.start[0].gpus == std::vector<int>{1});  // 10000 MiB free on GPU 0 is too little
  CHECK(p.start[1].gpus == std::vector<int>{0});  // best fit: 10000 free there, 20000 on GPU 1

  gpus = idle_gpus(1, 40000);
  gpus[0].foreign_mb = 30000;
  PendingJob big = exclusive(3, 1), any = exclusive(4, 1);
  big.memory_mb = 20000;
  p = schedule({big}, gpus, 0);
  CHECK(p.start.empty());
  CHECK(p.waiting.count(3));
  p = schedule({any}, gpus, 0);  // a whole GPU, whatever else is on it: as asked
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{0});
}

TEST_CASE("shared jobs never land on an exclusively held GPU, and exclusive jobs never on a shared one") {
  auto gpus = idle_gpus(2);
  hold(gpus[0], true, 0);
  hold(gpus[1], false, 1000);
  auto p = schedule({shared(1, 1000), exclusive(2, 1)}, gpus, 0);
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].id == 1);
  CHECK(p.start[0].gpus == std::vector<int>{1});
}

TEST_CASE("a job asking more GPUs than exist waits with a reason instead of blocking others") {
  auto p = schedule({exclusive(1, 8), exclusive(2, 1)}, idle_gpus(4), 0);
  CHECK(started(p) == std::vector<std::int64_t>{2});
  CHECK(p.waiting.at(1).find("this machine has 4") != std::string::npos);
}

TEST_CASE("an exclusive job asking more memory than a GPU has is not placed there") {
  auto p = schedule({{1, 0, 1, false, 100000, 0}}, idle_gpus(2, 81920), 0);
  CHECK(p.start.empty());
}

TEST_SUITE_END();

TEST_SUITE_BEGIN("scheduler");

TEST_CASE("jobs without GPUs are limited by CPU slots, one per rank") {
  PendingJob a{1, 0, 0, false, 0, 0, 1}, b{2, 0, 0, false, 0, 0, 1}, c{3, 0, 0, false, 0, 0, 1};
  auto p = schedule({a, b, c}, {}, 0, CpuSlots{2, {}, {}});
  CHECK(started(p) == std::vector<std::int64_t>{1, 2});
  CHECK(why(p, c) == "waiting for 1 CPU slot (0 of 2 free)");
  p = schedule({a, b, c}, {}, 0, CpuSlots{2, {0}, {}});
  CHECK(started(p) == std::vector<std::int64_t>{1});
}

TEST_CASE("jobs without GPUs waiting for CPU slots are listed for a suspension, the one a pass stops at too") {
  PendingJob a{1, 5, 0, false, 0, 0, 1}, b{2, 0, 0, false, 0, 0, 1}, g{3, 0, 1, false, 0, 0, 1};
  // Examined: the pass goes on past them for the GPU job behind.
  auto p = schedule({a, b, g}, idle_gpus(1), 0, CpuSlots{1, {0}, {}});
  CHECK(started(p) == std::vector<std::int64_t>{3});
  REQUIRE(p.wanting_slots.size() == 2);
  CHECK((p.wanting_slots[0].id == 1 && p.wanting_slots[1].id == 2));
  CHECK(p.wanting_gpus.empty());
  // Not examined: no slot is free and nothing else could start, so the pass stops at the first;
  // it is listed all the same.
  p = schedule({a, b}, {}, 0, CpuSlots{1, {0}, {}});
  CHECK(p.stopped);
  REQUIRE(p.wanting_slots.size() == 1);
  CHECK(p.wanting_slots[0].id == 1);
  // Nor one behind a GPU job that waits for slots too: it could take them ahead of that one.
  PendingJob g2{4, 9, 1, false, 0, 0, 1};
  g2.cpus = 1;
  p = schedule({g2, b}, idle_gpus(1), 0, CpuSlots{1, {0}, {}});
  CHECK(p.wanting_slots.empty());
  // One at its batch's limit is not: it would wait whatever the slots.
  a.batch = 7;
  p = schedule({a, b}, {}, 0, CpuSlots{1, {0}, {}}, true, BatchLimits{{7, {1, 1}}});
  CHECK(p.wanting_slots.empty());
}

TEST_CASE("a wide CPU gang is not starved by single-process CPU jobs behind it") {
  PendingJob gang{1, 0, 0, false, 0, 0, 4}, small{2, 0, 0, false, 0, 0, 1};
  auto p = schedule({gang, small}, {}, 0, CpuSlots{4, {0, 1}, {}});
  CHECK(p.start.empty());  // two slots are free, but the gang came first
  p = schedule({gang, small}, {}, 0, CpuSlots{4, {}, {}});
  CHECK(started(p) == std::vector<std::int64_t>{1});
}

TEST_CASE("a CPU job wider than the pool runs alone once the pool is empty") {
  PendingJob wide{1, 0, 0, false, 0, 0, 8};
  CHECK(schedule({wide}, {}, 0, CpuSlots{2, {0}, {}}).start.empty());
  CHECK(schedule({wide}, {}, 0, CpuSlots{2, {}, {}}).start.size() == 1);
}

TEST_CASE("GPU jobs without `cpus` do not use CPU slots") {
  auto p = schedule({exclusive(1, 1), {2, 0, 0, false, 0, 0, 1}}, idle_gpus(1), 0, CpuSlots{1, {0}, {}});
  CHECK(started(p) == std::vector<std::int64_t>{1});
  CHECK(p.start[0].cpu_slots.empty());
}

TEST_CASE("a job gets numbered CPU slots: the first free run long enough, else the lowest free ones") {
  PendingJob two{1, 0, 0, false, 0, 0, 1, 2}, one{2, 0, 0, false, 0, 0, 1, 0};
  // Free: 1, 3, 4, 5. Two slots fit first at 3-4; one slot goes to the first free, 1.
  auto p = schedule({two, one}, {}, 0, CpuSlots{6, {0, 2}, {}});
  REQUIRE(p.start.size() == 2);
  CHECK(p.start[0].cpu_slots == std::vector<int>{3, 4});
  CHECK(p.start[1].cpu_slots == std::vector<int>{1});
  // Free: 1, 3, 5. No run of three: the lowest three.
  PendingJob three{3, 0, 0, false, 0, 0, 1, 3};
  p = schedule({three}, {}, 0, CpuSlots{6, {0, 2, 4}, {}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].cpu_slots == std::vector<int>{1, 3, 5});
}

TEST_CASE("`cpus` is per rank, and a job without GPUs with `cpus` takes exactly that many per rank") {
  PendingJob gang{1, 0, 0, false, 0, 0, 3, 2};  // 3 ranks x 2 cores
  PendingJob small{2, 0, 0, false, 0, 0, 1, 0};
  auto p = schedule({gang, small}, {}, 0, CpuSlots{7, {}, {}});
  REQUIRE(started(p) == std::vector<std::int64_t>{1, 2});
  CHECK(p.start[0].cpu_slots == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(p.start[1].cpu_slots == std::vector<int>{6});
  p = schedule({gang, small}, {}, 0, CpuSlots{7, {6}, {}});
  CHECK(started(p) == std::vector<std::int64_t>{1});
  CHECK(why(p, small) == "waiting for 1 CPU slot (0 of 7 free)");
}

TEST_CASE("a GPU job with `cpus` needs both, and while it waits for CPU slots it holds its GPUs") {
  PendingJob gpu_cpus{1, 0, 1, false, 0, 0, 1, 2};
  PendingJob gpu_only = exclusive(2, 1, 0, 60);
  PendingJob cpu_only{3, 0, 0, false, 0, 0, 1, 0};
  auto p = schedule({gpu_cpus, gpu_only, cpu_only}, idle_gpus(2), 0, CpuSlots{3, {}, {}});
  REQUIRE(started(p) == std::vector<std::int64_t>{1, 2, 3});
  CHECK(p.start[0].gpus == std::vector<int>{0});
  CHECK(p.start[0].cpu_slots == std::vector<int>{0, 1});
  CHECK(p.start[2].cpu_slots == std::vector<int>{2});

  // One slot free: the GPU job waits for CPUs and reserves the only GPU, which the GPU-only job
  // behind it may not take (it cannot promise to end before an unknown start); the CPU job waits
  // in order even though one slot is free.
  p = schedule({gpu_cpus, gpu_only, cpu_only}, idle_gpus(1), 0, CpuSlots{3, {0, 1}, {}});
  CHECK(started(p).empty());
  CHECK(p.waiting.at(1) == "waiting for 2 CPU slots (1 of 3 free)");
  CHECK(p.reservations.at(1) == std::vector<int>{0});
  CHECK(why(p, gpu_only) == "waiting for GPUs held by higher-priority jobs");
  CHECK(why(p, cpu_only) == "waiting for 1 CPU slot (1 of 3 free)");
}

TEST_CASE("a job asking more CPU slots than the pool has runs alone on all of them") {
  PendingJob wide{1, 0, 0, false, 0, 0, 2, 4};  // 2 ranks x 4 cores on a pool of 3
  CHECK(cpu_slots_needed(wide, 3) == 3);
  CHECK(schedule({wide}, {}, 0, CpuSlots{3, {1}, {}}).start.empty());
  auto p = schedule({wide}, {}, 0, CpuSlots{3, {}, {}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].cpu_slots == std::vector<int>{0, 1, 2});
}

TEST_CASE("slots beyond the pool (a smaller --cpu-slots after a restart) do not count as taken") {
  PendingJob one{1, 0, 0, false, 0, 0, 1, 1};
  auto p = schedule({one}, {}, 0, CpuSlots{2, {1, 5, 7}, {}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].cpu_slots == std::vector<int>{0});
}

TEST_CASE("a multi-GPU job gets GPUs of one NUMA node when one has enough free") {
  auto gpus = gpus_on({0, 0, 1, 1});
  hold(gpus[0], true, 0);
  auto p = schedule({exclusive(1, 2)}, gpus, 0);
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{2, 3});  // not 1 and 2, across the sockets
  // Where no node has enough, the lowest free GPUs, as without nodes.
  hold(gpus[2], true, 0);
  p = schedule({exclusive(1, 2)}, gpus, 0);
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{1, 3});
  // Unknown nodes: the lowest free GPUs.
  auto plain = idle_gpus(4);
  hold(plain[0], true, 0);
  CHECK(schedule({exclusive(1, 2)}, plain, 0).start[0].gpus == std::vector<int>{1, 2});
  // Shared jobs: the node of the best-fitting GPU (3, the fullest), then best fit within it.
  // Without nodes, best fit alone would take GPUs 3 and 0, across the sockets.
  auto packed = gpus_on({0, 0, 1, 1});
  hold(packed[0], false, 10000);
  hold(packed[3], false, 10000);
  hold(packed[3], false, 10000);
  PendingJob pair{1, 0, 2, true, 20000, 0};
  CHECK(schedule({pair}, packed, 0).start[0].gpus == std::vector<int>{2, 3});
  for (auto& g : packed)
    g.node = -1;
  CHECK(schedule({pair}, packed, 0).start[0].gpus == std::vector<int>{0, 3});
}

TEST_CASE("a GPU job's CPU slots are on its GPU's NUMA node, each DDP rank's near its own GPU") {
  // Slots 0-1 on node 0, 2-3 on node 1; GPU 0 on node 0 is busy, so the job gets GPU 1.
  auto gpus = gpus_on({0, 1});
  hold(gpus[0], true, 0);
  PendingJob one{1, 0, 1, false, 0, 0, 1, 2};
  auto p = schedule({one}, gpus, 0, CpuSlots{4, {}, {0, 0, 1, 1}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{1});
  CHECK(p.start[0].cpu_slots == std::vector<int>{2, 3});
  // Slots map to cores cyclically (more slots than cores): slot 5 is core 1's.
  p = schedule({one}, gpus, 0, CpuSlots{6, {2, 3}, {0, 1}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].cpu_slots == std::vector<int>{1, 5});

  // A 2-rank DDP job over both nodes' GPUs (none has two): rank 0 drives GPU 0 (node 0) and
  // gets node 0's slot, rank 1 node 1's, listed in rank order.
  PendingJob ddp{2, 0, 2, false, 0, 0, 2, 1};
  p = schedule({ddp}, gpus_on({0, 1}), 0, CpuSlots{4, {}, {1, 1, 0, 0}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{0, 1});
  CHECK(p.start[0].cpu_slots == std::vector<int>{2, 0});

  // Hybrid (2 ranks x 2 stages): rank r drives GPUs 2r and 2r+1, here on node 1 for rank 0.
  PendingJob hybrid{3, 0, 4, false, 0, 0, 2, 1};
  p = schedule({hybrid}, gpus_on({1, 1, 0, 0}), 0, CpuSlots{4, {}, {0, 0, 1, 1}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].cpu_slots == std::vector<int>{2, 0});
}

TEST_CASE("a job with `cpus` prefers a GPU whose node still has free slots") {
  // Node 0's slots (0, 1) are taken: GPU 1 on node 1, beside free cores, rather than GPU 0.
  PendingJob one{1, 0, 1, false, 0, 0, 1, 2};
  auto p = schedule({one}, gpus_on({0, 1}), 0, CpuSlots{4, {0, 1}, {0, 0, 1, 1}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{1});
  CHECK(p.start[0].cpu_slots == std::vector<int>{2, 3});
  // A job without `cpus` keeps the lowest GPU.
  CHECK(schedule({exclusive(2, 1)}, gpus_on({0, 1}), 0, CpuSlots{4, {0, 1}, {0, 0, 1, 1}}).start[0].gpus ==
        std::vector<int>{0});
  // Where no node has enough, the order is as without nodes.
  p = schedule({one}, gpus_on({0, 1}), 0, CpuSlots{4, {0, 2}, {0, 0, 1, 1}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{0});
}

TEST_CASE("NUMA is a preference: with no free slot near its GPU a job takes others and starts") {
  PendingJob one{1, 0, 1, false, 0, 0, 1, 2};
  auto gpus = gpus_on({1});  // GPU 0 is on node 1, whose only free slot is 3
  auto p = schedule({one}, gpus, 0, CpuSlots{4, {2}, {0, 0, 1, 1}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].gpus == std::vector<int>{0});
  CHECK(p.start[0].cpu_slots == std::vector<int>{0, 3});  // the near one, then the lowest other
  // Near slots that are not consecutive still come first.
  p = schedule({one}, gpus, 0, CpuSlots{6, {3}, {1, 0, 1, 0, 1, 0}});
  REQUIRE(p.start.size() == 1);
  CHECK(p.start[0].cpu_slots == std::vector<int>{0, 2});
  // Jobs without GPUs ignore nodes: the first run, as before.
  PendingJob cpu_only{2, 0, 0, false, 0, 0, 1, 2};
  p = schedule({cpu_only}, {}, 0, CpuSlots{4, {}, {1, 1, 0, 0}});
  CHECK(p.start[0].cpu_slots == std::vector<int>{0, 1});
}

TEST_CASE("a deep queue behind busy GPUs is examined only up to where nothing more can start") {
  // 8 busy GPUs, one just freed, 10,000 single-GPU jobs: one starts, 8 reserve a GPU each, and
  // the pass stops; the rest wait for the GPUs, as examining them would say.
  auto gpus = idle_gpus(8);
  for (int g = 1; g < 8; ++g) hold(gpus[g], true, 0);
  std::vector<PendingJob> queue;
  for (int id = 1; id <= 10000; ++id) queue.push_back(exclusive(id, 1));
  CpuSlots cpu{2, {0, 1}, {}};  // and no CPU slot free
  const Plan plan = schedule(queue, gpus, 0, cpu);
  CHECK(started(plan) == std::vector<std::int64_t>{1});
  CHECK(plan.stopped);
  CHECK(plan.waiting.size() == 8);
  CHECK(plan.waiting.at(2) == "waiting for 1 free GPU (reserved)");
  CHECK(tail_wait_reason(queue[9999], plan.tail) == "waiting for GPUs held by higher-priority jobs");
  CHECK(tail_wait_reason({5, 0, 0, false, 0, 0, 2}, plan.tail) == "waiting for 2 CPU slots (0 of 2 free)");
  CHECK(tail_wait_reason(exclusive(6, 9), plan.tail) == "needs 9 GPUs; this machine has 8");

  // A free CPU slot and a CPU job at the very end: the pass must reach it.
  cpu.taken = {0};
  queue.push_back({10001, 0, 0, false, 0, 0, 1});
  const Plan reach = schedule(queue, gpus, 0, cpu);
  CHECK(started(reach) == std::vector<std::int64_t>{1, 10001});
  CHECK(reach.stopped == false);
}

TEST_CASE("a batch at its limit waits without reserving anything, and the jobs behind it start") {
  auto in_batch = [](PendingJob j, std::int64_t batch) {
    j.batch = batch;
    return j;
  };
  // Batch 1 may run 2 jobs and runs 1: one more of it starts, the rest wait; batch 2 and the job
  // of no limited batch take the GPUs its waiting jobs would have had.
  const std::vector<PendingJob> queue{in_batch(exclusive(1, 1), 1), in_batch(exclusive(2, 1), 1),
                                      in_batch(exclusive(3, 1, 0, 10), 1), in_batch(exclusive(4, 2), 2),
                                      in_batch(exclusive(5, 1), 3), in_batch({6, 0, 0, false, 0, 0, 1}, 1)};
  const Plan p = schedule(queue, idle_gpus(4), 0, {}, true, {{1, {2, 1}}});
  CHECK(started(p) == std::vector<std::int64_t>{1, 4, 5});
  CHECK(p.reservations.empty());
  for (std::int64_t id : {2, 3, 6}) CHECK_FALSE(p.waiting.count(id));  // no string per job
  REQUIRE(p.at_limit.count(1));
  CHECK(batch_limit_reason(1, p.at_limit.at(1)) == "batch 1 runs 2 jobs, its limit (max_running 2)");
  CHECK_FALSE(p.at_limit.count(2));  // batch 2 had room

  // The limit counts the jobs a pass starts: a CPU job of the batch is one of them.
  PendingJob urgent_cpu = queue[5];
  urgent_cpu.priority = 1;
  const Plan cpu_first = schedule({urgent_cpu, queue[0], queue[1]}, idle_gpus(4), 0, {}, true, {{1, {2, 0}}});
  CHECK(started(cpu_first) == std::vector<std::int64_t>{6, 1});
  CHECK(batch_limit_reason(1, cpu_first.at_limit.at(1)) == "batch 1 runs 2 jobs, its limit (max_running 2)");
}

TEST_CASE("stopping early changes nothing: random queues give the same plan as examining every job") {
  std::mt19937 rng(20261123);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int stopped = 0, tail_jobs = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<GpuState> gpus = idle_gpus(pick(0, 4), 1000);
    for (auto& g : gpus) {
      const int what = pick(0, 3);  // idle, exclusive, shared, shared twice
      for (int k = 0; k < what - 1 || (what == 1 && k == 0); ++k)
        hold(g, what == 1, 300, pick(0, 1) ? k_never : pick(10, 100));
    }
    CpuSlots cpu{pick(0, 5), {}, {}};
    for (int s = 0; s < cpu.total; ++s)
      if (pick(0, 1)) cpu.taken.insert(s);
    std::vector<PendingJob> queue;
    const int n = pick(0, 25);
    for (int id = 1; id <= n; ++id) {
      PendingJob j{id, pick(-1, 1), pick(0, 5), false, 0, pick(0, 1) ? 0.0 : pick(1, 50), pick(1, 3), pick(0, 2) ? 0 : pick(1, 2)};
      j.shared = j.gpus == 1 && pick(0, 2) == 0;
      j.memory_mb = j.shared ? pick(1, 6) * 200 : pick(0, 3) ? 0 : pick(1, 12) * 100;
      j.batch = pick(0, 2);  // 1 and 2 are limited
      queue.push_back(j);
    }
    const int limit = pick(1, 3);
    const BatchLimits limits{{1, {limit, pick(0, limit)}}, {2, {1, 0}}};
    const Plan full = schedule(queue, gpus, 0, cpu, false, limits);
    const Plan early = schedule(queue, gpus, 0, cpu, true, limits);
    CHECK_FALSE(full.stopped);
    REQUIRE(early.start.size() == full.start.size());
    for (std::size_t i = 0; i < full.start.size(); ++i) {
      CHECK(early.start[i].id == full.start[i].id);
      CHECK(early.start[i].gpus == full.start[i].gpus);
      CHECK(early.start[i].cpu_slots == full.start[i].cpu_slots);
    }
    for (const auto& [id, held] : early.reservations) CHECK(full.reservations.at(id) == held);
    stopped += early.stopped;
    for (const auto& j : queue) {
      const auto it = full.waiting.find(j.id);
      if (it == full.waiting.end()) continue;  // started
      if (early.waiting.count(j.id)) {
        CHECK(early.waiting.at(j.id) == it->second);
      } else {
        // The tail's reason is about resources: a job of a limited batch there waits for them too.
        REQUIRE(early.stopped);
        if (j.batch == 0) CHECK(tail_wait_reason(j, early.tail) == it->second);
        ++tail_jobs;
      }
    }
  }
  // The comparison covered passes that stopped, and jobs they did not examine.
  CHECK(stopped > 300);
  CHECK(tail_jobs > 3000);
}

namespace {
PendingJob of_user(std::int64_t id, std::uint32_t user, int gpus = 1, int priority = 0) {
  PendingJob j = exclusive(id, gpus, priority);
  j.user = user;
  return j;
}
std::vector<std::int64_t> ids_of(const std::vector<PendingJob>& q) {
  std::vector<std::int64_t> ids;
  for (const auto& j : q) ids.push_back(j.id);
  return ids;
}
}  // namespace

TEST_CASE("fair share interleaves two users' equal-priority sweeps, the one holding fewer GPUs first") {
  // Alice submitted 1-4 first, Bob 5-8; Alice already holds 2 GPUs.
  std::vector<PendingJob> q;
  for (int i = 1; i <= 4; ++i) q.push_back(of_user(i, 1000));
  for (int i = 5; i <= 8; ++i) q.push_back(of_user(i, 1001));
  fair_order(q, {{1000, 2}}, {});
  CHECK(ids_of(q) == std::vector<std::int64_t>{5, 6, 1, 7, 2, 8, 3, 4});
  auto p = schedule(q, idle_gpus(4), 0);
  CHECK(started(p) == std::vector<std::int64_t>{5, 6, 1, 7});  // 4 GPUs end up 3 and 3 between them
}

TEST_CASE("fair share: between users holding as much, the least recent GPU use first; priority still comes first") {
  std::vector<PendingJob> q{of_user(1, 1000, 1, 5), of_user(2, 1000), of_user(3, 1001), of_user(4, 1002, 2)};
  fair_order(q, {}, {{1000, 7200}, {1001, 3600}, {1002, 0}});
  // 1 alone at priority 5; then user 1002 (no use), 1001, 1000; a 2-GPU job counts as 2 held.
  CHECK(ids_of(q) == std::vector<std::int64_t>{1, 4, 3, 2});
  // The pass keeps that order within a priority instead of sorting by id.
  auto p = schedule(q, idle_gpus(3), 0);
  CHECK(started(p) == std::vector<std::int64_t>{1, 4});
  std::vector<PendingJob> one_user{of_user(2, 1000), of_user(1, 1000)};
  fair_order(one_user, {}, {});
  CHECK(ids_of(one_user) == std::vector<std::int64_t>{2, 1});  // one user's jobs keep their order
}

TEST_CASE("a user at their limit of running jobs or GPUs waits without reserving, and the jobs behind start") {
  std::vector<PendingJob> q{of_user(1, 1000), of_user(2, 1000), of_user(3, 1000, 2), of_user(4, 1001)};
  // Alice may run 2 jobs and hold 3 GPUs; she runs 1 job on 1 GPU.
  auto p = schedule(q, idle_gpus(4), 0, {}, true, {}, {{1000, {2, 1, 3, 1}}});
  CHECK(started(p) == std::vector<std::int64_t>{1, 4});  // 2 makes her limit of 2 jobs; 3 waits too
  REQUIRE(p.users_at_limit.count(1000));
  CHECK(p.reservations.empty());
  CHECK(user_limit_reason("alice", p.users_at_limit.at(1000), 1) == "alice runs 2 jobs, their limit (max_running 2)");
  // By GPUs: 2 more GPUs would make 4, over her 3.
  p = schedule({of_user(3, 1000, 2), of_user(4, 1001)}, idle_gpus(4), 0, {}, true, {}, {{1000, {0, 1, 3, 2}}});
  CHECK(started(p) == std::vector<std::int64_t>{4});
  CHECK(user_limit_reason("alice", p.users_at_limit.at(1000), 2) ==
        "alice holds 2 GPUs; 2 more would pass their limit (max_gpus 3)");
}

TEST_SUITE_END();


// ---- handing over to another system (Slurm) -------------------------------------------------

namespace {
PendingJob in_batch(std::int64_t id, std::int64_t batch) {
  PendingJob j;
  j.id = id;
  j.batch = batch;
  return j;
}
std::vector<std::vector<std::int64_t>> ids_of(const std::vector<Handover::Array>& arrays) {
  std::vector<std::vector<std::int64_t>> out;
  for (const auto& a : arrays) out.push_back(a.ids);
  return out;
}
}  // namespace

TEST_SUITE_BEGIN("scheduler");

TEST_CASE("handing over: jobs of one key go as arrays of at most max_array, others alone, in line") {
  std::vector<PendingJob> queue;
  for (std::int64_t id = 1; id <= 5; ++id) queue.push_back(in_batch(id, 7));
  queue.push_back(in_batch(6, 0));  // no batch: alone
  queue.push_back(in_batch(8, 7));
  const auto key = [](const PendingJob& j) {
    return j.batch == 0 ? std::string() : j.id == 8 ? std::string("other") : std::string("k");
  };
  auto h = hand_over(queue, {}, key, 2);
  CHECK(ids_of(h.arrays) == std::vector<std::vector<std::int64_t>>{{1, 2}, {3, 4}, {5}, {8}});
  for (const auto& a : h.arrays) CHECK(a.limit == 0);
  REQUIRE(h.plan.start.size() == 1);
  CHECK(h.plan.start[0].id == 6);
  CHECK(h.plan.at_limit.empty());
}

TEST_CASE("handing over: an array takes the room left in its batch's limit and leaves none") {
  std::vector<PendingJob> queue;
  for (std::int64_t id = 1; id <= 5; ++id) queue.push_back(in_batch(id, 7));
  queue.push_back(in_batch(6, 7));  // a retry: goes alone, or waits
  const auto key = [](const PendingJob& j) { return j.id == 6 ? std::string() : std::string("k"); };
  BatchLimits limits{{7, {3, 1}}};  // 3 at once, 1 handed over already

  // One array of all five, running at most the 2 the limit leaves; the retry waits.
  auto h = hand_over(queue, limits, key, 100);
  REQUIRE(h.arrays.size() == 1);
  CHECK(h.arrays[0].ids == std::vector<std::int64_t>{1, 2, 3, 4, 5});
  CHECK(h.arrays[0].limit == 2);
  CHECK(h.plan.start.empty());
  REQUIRE(h.plan.at_limit.count(7));
  CHECK(h.plan.at_limit[7].running == 3);
  CHECK(h.plan.at_limit[7].limit == 3);

  // An array full at max_array: the rest of the batch waits for the next pass, not a second
  // array beside it (two arrays of %2 would run 4 at once).
  h = hand_over(queue, limits, key, 2);
  CHECK(ids_of(h.arrays) == std::vector<std::vector<std::int64_t>>{{1, 2}});
  CHECK(h.arrays[0].limit == 2);
  CHECK(h.plan.at_limit.count(7));

  // With room for one more and no array key, jobs go alone until the limit holds.
  const auto alone = [](const PendingJob&) { return std::string(); };
  h = hand_over(queue, {{7, {3, 1}}}, alone, 100);
  REQUIRE(h.plan.start.size() == 2);
  CHECK(h.plan.start[0].id == 1);
  CHECK(h.plan.start[1].id == 2);
  CHECK(h.arrays.empty());
  CHECK(h.plan.at_limit[7].running == 3);
}

TEST_CASE("handing over: a batch at its limit costs its waiting jobs no array key") {
  std::vector<PendingJob> queue;
  for (std::int64_t id = 1; id <= 1000; ++id) queue.push_back(in_batch(id, 7));
  int asked = 0;
  const auto key = [&asked](const PendingJob&) {
    ++asked;
    return std::string("k");
  };
  auto h = hand_over(queue, {{7, {4, 4}}}, key, 100);
  CHECK(asked == 0);
  CHECK(h.arrays.empty());
  CHECK(h.plan.start.empty());
  CHECK(h.plan.at_limit[7].running == 4);
}

TEST_SUITE_END();
