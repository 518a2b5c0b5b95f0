// Preemption's choice of victims: who may be preempted, the cheapest set, gangs whole, jobs
// already stopping, protection against livelock, lab mode's rules. Pure: no daemon.
#include <doctest/doctest.h>

#include <algorithm>

#include "daemon/preemption.hpp"

using namespace gpuq::daemon;

namespace {

constexpr double k_now = 10000;

std::vector<GpuState> gpus(int n, std::int64_t mb = 81920) {
  std::vector<GpuState> g;
  for (int i = 0; i < n; ++i)
    g.push_back({i, mb, 0, 0, 0, false, 0});
  return g;
}

// `gpus` as they are with these jobs running.
std::vector<GpuState> held_by(std::vector<GpuState> g, const std::vector<Runner>& running) {
  for (const Runner& r : running)
    for (int i : r.gpus) {
      g[i].holders++;
      g[i].allocated_mb += r.shared ? r.memory_mb : g[i].total_mb;
      g[i].exclusive = g[i].exclusive || !r.shared;
    }
  return g;
}

// A preemptible job of priority 0 on `on`, started `ran_s` ago.
Runner runner(std::int64_t id, std::vector<int> on, double ran_s = 600, int priority = 0) {
  Runner r;
  r.id = id;
  r.priority = priority;
  r.gpus = std::move(on);
  r.preemptible = true;
  r.started_at = k_now - ran_s;
  return r;
}

PendingJob urgent(std::int64_t id, int n, int priority = 10) {
  PendingJob j;
  j.id = id;
  j.priority = priority;
  j.gpus = n;
  return j;
}

std::vector<std::int64_t> victims(const std::vector<Preemption>& p) {
  std::vector<std::int64_t> out;
  for (const auto& x : p)
    out.push_back(x.victim);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Preemption> choose(const std::vector<PendingJob>& waiting, int n, const std::vector<Runner>& running,
                               const PreemptRules& rules = {}) {
  return choose_preemptions(waiting, held_by(gpus(n), running), running, k_now, rules);
}

}  // namespace

TEST_SUITE_BEGIN("preemption");

TEST_CASE("an urgent job preempts a lower-priority preemptible job, and nothing when a GPU is free") {
  const std::vector<Runner> running{runner(1, {0})};
  auto p = choose({urgent(9, 1)}, 1, running);
  REQUIRE(p.size() == 1);
  CHECK(p[0].victim == 1);
  CHECK(p[0].by == 9);
  CHECK(choose({urgent(9, 1)}, 2, running).empty());  // GPU 1 is free: it waits for nothing
}

TEST_CASE("only preemptible jobs of lower priority are victims") {
  Runner fixed = runner(1, {0});
  fixed.preemptible = false;
  CHECK(choose({urgent(9, 1)}, 1, {fixed}).empty());
  CHECK(choose({urgent(9, 1, 0)}, 1, {runner(1, {0})}).empty());  // equal priority
  CHECK(choose({urgent(9, 1, -5)}, 1, {runner(1, {0})}).empty());
  CHECK(preempt_refusal(fixed, urgent(9, 1), k_now, {}) == "not preemptible");
}

TEST_CASE("the cheapest victim is the one with the least work since its last checkpoint") {
  Runner old_unsaved = runner(1, {0}, 3000);
  Runner old_saved = runner(2, {1}, 3000);
  old_saved.checkpoint_at = k_now - 30;  // saved 30 s ago: 30 GPU-s lost
  Runner young = runner(3, {2}, 100);    // 100 GPU-s lost
  CHECK(victims(choose({urgent(9, 1)}, 3, {old_unsaved, old_saved, young})) == std::vector<std::int64_t>{2});
  // Equal loss: the lower priority, then the younger.
  Runner a = runner(4, {0}, 50, 1), b = runner(5, {1}, 50, 0);
  CHECK(victims(choose({urgent(9, 1)}, 2, {a, b})) == std::vector<std::int64_t>{5});
  Runner older = runner(7, {0}, 50), younger = runner(8, {1}, 50);
  older.checkpoint_at = k_now - 10, older.started_at = k_now - 900;
  younger.checkpoint_at = k_now - 10, younger.started_at = k_now - 20;
  CHECK(victims(choose({urgent(9, 1)}, 2, {older, younger})) == std::vector<std::int64_t>{8});
}

TEST_CASE("a gang is preempted whole, and only when no cheaper set makes room") {
  // A 2-GPU gang on 0-1 and a single job on 2: a 1-GPU urgent job takes the single one's GPU even
  // when the gang lost less per GPU, if the single one is cheaper in all.
  Runner gang = runner(1, {0, 1}, 400);  // 800 GPU-s
  Runner single = runner(2, {2}, 500);   // 500 GPU-s
  CHECK(victims(choose({urgent(9, 1)}, 3, {gang, single})) == std::vector<std::int64_t>{2});
  // A 2-GPU urgent job on a 2-GPU box: the gang goes, whole.
  auto p = choose({urgent(9, 2)}, 2, {runner(1, {0, 1})});
  CHECK(victims(p) == std::vector<std::int64_t>{1});
}

TEST_CASE("victims taken and then found unneeded are put back: the set is minimal") {
  // Cheapest first: job 1 (GPU 0, 10 GPU-s) is taken, then job 2 (GPUs 1-2, 2x100) makes room for
  // a 2-GPU job alone, so job 1 goes back.
  Runner cheap = runner(1, {0}, 10);
  Runner gang = runner(2, {1, 2}, 100);
  CHECK(victims(choose({urgent(9, 2)}, 3, {cheap, gang})) == std::vector<std::int64_t>{2});
}

TEST_CASE("shared jobs: the victims free enough memory on one GPU") {
  Runner a = runner(1, {0}, 100), b = runner(2, {0}, 200);
  a.shared = b.shared = true;
  a.memory_mb = b.memory_mb = 30000;
  PendingJob j = urgent(9, 1);
  j.shared = true;
  j.memory_mb = 40000;  // 20,000 MiB free: one victim is enough, the cheaper
  CHECK(victims(choose({j}, 1, {a, b})) == std::vector<std::int64_t>{1});
  j.memory_mb = 70000;  // both must go
  CHECK(victims(choose({j}, 1, {a, b})) == std::vector<std::int64_t>{1, 2});
  PendingJob whole = urgent(10, 1);  // an exclusive job needs the GPU empty
  CHECK(victims(choose({whole}, 1, {a, b})) == std::vector<std::int64_t>{1, 2});
}

TEST_CASE("nothing is preempted when even every candidate would not make room") {
  Runner fixed = runner(2, {1});
  fixed.preemptible = false;
  CHECK(choose({urgent(9, 2)}, 2, {runner(1, {0}), fixed}).empty());
}

TEST_CASE("two urgent jobs never preempt the same victim, and a victim stopping already is not asked again") {
  const std::vector<Runner> running{runner(1, {0}, 100), runner(2, {1}, 200)};
  auto p = choose({urgent(9, 1), urgent(10, 1)}, 2, running);
  REQUIRE(p.size() == 2);
  CHECK(victims(p) == std::vector<std::int64_t>{1, 2});
  CHECK(p[0].by != p[1].by);
  // In the next pass job 1 is stopping for job 9: job 9 waits for it and preempts nothing more;
  // job 10 finds job 2.
  std::vector<Runner> later = running;
  later[0].stopping = true;
  auto q = choose({urgent(9, 1), urgent(10, 1)}, 2, later);
  REQUIRE(q.size() == 1);
  CHECK(q[0].victim == 2);
  CHECK(q[0].by == 10);
  // Both stopping: nothing new.
  later[1].stopping = true;
  CHECK(choose({urgent(9, 1), urgent(10, 1)}, 2, later).empty());
}

TEST_CASE("a job preempted often enough is protected until it has run min_run_s") {
  PreemptRules rules;
  rules.protect_after = 2;
  rules.min_run_s = 300;
  Runner twice = runner(1, {0}, 100);
  twice.preemptions = 2;
  CHECK(choose({urgent(9, 1)}, 1, {twice}, rules).empty());
  CHECK(preempt_refusal(twice, urgent(9, 1), k_now, rules).find("protected") == 0);
  twice.started_at = k_now - 301;  // it has had its time
  CHECK(victims(choose({urgent(9, 1)}, 1, {twice}, rules)) == std::vector<std::int64_t>{1});
  Runner once = runner(2, {0}, 100);
  once.preemptions = 1;  // under protect_after
  CHECK(victims(choose({urgent(9, 1)}, 1, {once}, rules)) == std::vector<std::int64_t>{2});
}

TEST_CASE("lab mode: a user preempts their own jobs; another's only under fair_share, from over to under") {
  Runner bobs = runner(1, {0, 1, 2});
  bobs.user = 1002;
  PendingJob alices = urgent(9, 1);
  alices.user = 1001;
  PreemptRules rules;
  rules.lab = true;
  rules.held = {{1002, 3}};
  rules.fair_share = 2;                               // 4 GPUs, 2 users
  CHECK(choose({alices}, 3, {bobs}, rules).empty());  // never across users by default
  CHECK(preempt_refusal(bobs, alices, k_now, rules) == "another user's");
  rules.across_users = true;
  CHECK(victims(choose({alices}, 3, {bobs}, rules)) == std::vector<std::int64_t>{1});
  rules.held = {{1002, 2}, {1001, 0}};  // Bob within his share
  Runner bob2 = runner(2, {0, 1});
  bob2.user = 1002;
  CHECK(choose({alices}, 2, {bob2}, rules).empty());
  rules.held = {{1002, 3}, {1001, 2}};  // Alice would pass hers
  CHECK(choose({alices}, 3, {bobs}, rules).empty());
  Runner alices_own = runner(3, {0});
  alices_own.user = 1001;
  rules.across_users = false;
  CHECK(victims(choose({alices}, 1, {alices_own}, rules)) == std::vector<std::int64_t>{3});
}

TEST_CASE("a drained GPU's victim frees nothing usable") {
  // GPU 1 is out of service (absent from the pass's GPUs): its preemptible job is no help.
  std::vector<GpuState> in_service = gpus(2);
  in_service.erase(in_service.begin() + 1);
  const std::vector<Runner> running{runner(1, {1}, 10)};
  std::vector<GpuState> busy = in_service;
  Runner fixed = runner(2, {0});
  fixed.preemptible = false;
  busy[0].holders = 1, busy[0].exclusive = true, busy[0].allocated_mb = busy[0].total_mb;
  CHECK(choose_preemptions({urgent(9, 1)}, busy, {running[0], fixed}, k_now, {}).empty());
}

TEST_CASE("a job launched in this very pass is no victim: it has not begun") {
  Runner fresh = runner(1, {0}, 0);  // started_at == now
  CHECK(choose({urgent(9, 1)}, 1, {fresh}).empty());
  CHECK(preempt_refusal(fresh, urgent(9, 1), k_now, {}) == "launched in this pass");
}

TEST_CASE("GPUs the pass reserved for a job earlier in line are not counted as free by the jobs after it") {
  // GPU 0 free but reserved, with GPUs 1 and 3 (held by jobs that are not preemptible), for a
  // 3-GPU job E; V on GPU 2 is preemptible. U (1 GPU) must preempt V, not count on GPU 0.
  Runner n1 = runner(1, {1}), n2 = runner(2, {3}), v = runner(3, {2});
  n1.preemptible = n2.preemptible = false;
  const std::vector<Runner> running{n1, n2, v};
  const std::map<std::int64_t, std::vector<int>> reserved{{8, {0, 1, 3}}};
  auto p = choose_preemptions({urgent(8, 3), urgent(9, 1)}, held_by(gpus(4), running), running, k_now, {}, reserved);
  REQUIRE(p.size() == 1);
  CHECK(p[0].victim == 3);
  CHECK(p[0].by == 9);
  // Without the reservation, GPU 0 serves U and nothing is preempted.
  CHECK(choose_preemptions({urgent(9, 1)}, held_by(gpus(4), running), running, k_now, {}).empty());
}

TEST_CASE("lab fair share: a job waiting for GPUs coming free counts them as its user's, in every pass") {
  // Six GPUs, two users: a share of 3. Alice's six preemptible jobs hold them all; Bob's B1 (2 GPUs)
  // preempted two of them in an earlier pass, and they are stopping. B1 counts what it waits for,
  // so Bob's B2 (2 more) would take him past his share and preempts no one.
  std::vector<Runner> alices;
  for (int g = 0; g < 6; ++g) {
    alices.push_back(runner(10 + g, {g}, 100 + g));
    alices.back().user = 1001;
  }
  alices[0].stopping = alices[1].stopping = true;
  PendingJob b1 = urgent(20, 2), b2 = urgent(21, 2);
  b1.user = b2.user = 1002;
  PreemptRules rules;
  rules.lab = rules.across_users = true;
  rules.fair_share = 3;
  rules.held = {{1001, 4}};  // the stopping jobs' GPUs are not counted
  CHECK(choose_preemptions({b1, b2}, held_by(gpus(6), alices), alices, k_now, rules).empty());
  // Before any of it: Bob at 0 and Alice at 6, B2 alone preempts two of hers, the cheapest.
  alices[0].stopping = alices[1].stopping = false;
  rules.held = {{1001, 6}};
  CHECK(victims(choose_preemptions({b2}, held_by(gpus(6), alices), alices, k_now, rules)) ==
        std::vector<std::int64_t>{10, 11});
}

TEST_CASE("a pass looks at a bounded number of waiting jobs, and none at or under the victims' priority") {
  const std::vector<Runner> running{runner(1, {0})};
  std::vector<PendingJob> waiting;
  for (std::size_t i = 0; i < k_max_preempting; ++i) {
    PendingJob j = urgent(100 + static_cast<std::int64_t>(i), 2);  // cannot fit on a 1-GPU box anyway
    waiting.push_back(j);
  }
  waiting.push_back(urgent(9, 1));  // past the bound
  CHECK(choose(waiting, 1, running).empty());
  waiting.pop_back();
  waiting.resize(3);
  waiting.push_back(urgent(9, 1));
  CHECK(victims(choose(waiting, 1, running)) == std::vector<std::int64_t>{1});
}


TEST_CASE("a victim of higher priority than the waiting job is never taken, however cheap") {
  Runner high = runner(1, {0}, 10, 20), low = runner(2, {1}, 900, 0);  // the higher one lost less
  CHECK(victims(choose({urgent(9, 1, 10)}, 2, {high, low})) == std::vector<std::int64_t>{2});
  Runner equal = runner(3, {0}, 10, 10);
  CHECK(victims(choose({urgent(9, 1, 10)}, 2, {equal, low})) == std::vector<std::int64_t>{2});
}

// ---- suspension ----------------------------------------------------------------------------

namespace {

// A preemptible job that may be frozen, on CPU slots `slots` (and GPUs `on`).
Runner sleeper(std::int64_t id, std::vector<int> slots, std::vector<int> on = {}, double ran_s = 600,
               int priority = 0) {
  Runner r = runner(id, std::move(on), ran_s, priority);
  r.cpu_slots = std::move(slots);
  r.may_suspend = true;
  return r;
}

// A job without GPUs needing `slots` CPU slots (one rank).
PendingJob cpu_job(std::int64_t id, int slots, int priority = 10) {
  PendingJob j = urgent(id, 0, priority);
  j.cpus = slots;
  return j;
}

// A pool of `total` slots, those of `running` taken.
CpuSlots pool(int total, const std::vector<Runner>& running) {
  CpuSlots c;
  c.total = total;
  for (const Runner& r : running)
    c.taken.insert(r.cpu_slots.begin(), r.cpu_slots.end());
  return c;
}

std::vector<Suspension> suspend(const std::vector<PendingJob>& waiting, int total, const std::vector<Runner>& running,
                                const PreemptRules& rules = {}) {
  return choose_suspensions(waiting, {}, pool(total, running), running, k_now, rules);
}

}  // namespace

TEST_CASE("an urgent CPU job freezes a lower-priority job and runs on its slots, free ones first") {
  const std::vector<Runner> running{sleeper(1, {0, 1})};
  auto s = suspend({cpu_job(9, 2)}, 3, running);  // slot 2 free, slots 0 and 1 held
  REQUIRE(s.size() == 1);
  CHECK(s[0].by == 9);
  CHECK(s[0].victims == std::vector<std::int64_t>{1});
  CHECK(s[0].cpu_slots == std::vector<int>{0, 2});      // the free one, and one of the victim's
  CHECK(suspend({cpu_job(9, 1)}, 3, running).empty());  // it fits beside: nothing frozen
}

TEST_CASE("suspension takes only jobs that may be frozen: preemptible, lower priority, its mode, a freezer") {
  Runner not_preemptible = sleeper(1, {0});
  not_preemptible.preemptible = false;
  CHECK(suspend({cpu_job(9, 1)}, 1, {not_preemptible}).empty());
  CHECK(suspend({cpu_job(9, 1, 0)}, 1, {sleeper(1, {0})}).empty());  // equal priority
  Runner requeue_only = sleeper(1, {0});
  requeue_only.may_suspend = false;  // preempt_mode requeue, or no freezer
  CHECK(suspend({cpu_job(9, 1)}, 1, {requeue_only}).empty());
  CHECK(preempt_refusal(requeue_only, cpu_job(9, 1), k_now, {}, true).find("cannot be frozen") == 0);
  Runner stopping = sleeper(1, {0});
  stopping.stopping = true;
  CHECK(suspend({cpu_job(9, 1)}, 1, {stopping}).empty());
  Runner frozen = sleeper(1, {0});
  frozen.suspended = true;  // frozen already for another: lends nothing more
  CHECK(suspend({cpu_job(9, 1)}, 1, {frozen}).empty());
  CHECK(suspend({cpu_job(9, 1)}, 1, {sleeper(1, {0}, {}, 0)}).empty());  // launched in this pass
}

TEST_CASE("a job that is only ever frozen (preempt_mode suspend) is never stopped for GPUs") {
  Runner frozen_only = runner(1, {0});
  frozen_only.may_requeue = false;
  CHECK(choose({urgent(9, 1)}, 1, {frozen_only}).empty());
  CHECK(preempt_refusal(frozen_only, urgent(9, 1), k_now, {}).find("preempt_mode suspend") == 0);
  Runner frozen = runner(2, {0});
  frozen.suspended = true;
  CHECK(choose({urgent(9, 1)}, 1, {frozen}).empty());
}

TEST_CASE("suspension freezes the jobs that idle the fewest GPUs, then the lowest priority, then the youngest") {
  std::vector<Runner> running{sleeper(1, {0}, {0}, 600, 0), sleeper(2, {1}, {}, 900, 0),  // a GPU job; an old one
                              sleeper(3, {2}, {}, 60, 0), sleeper(4, {3}, {}, 60, 5)};    // a young one; a higher one
  // Every slot is held; each round the chosen victim is made no candidate, and the next is chosen.
  for (std::int64_t expected : {3, 2, 4, 1}) {
    CAPTURE(expected);
    auto s = suspend({cpu_job(9, 1)}, 4, running);
    REQUIRE(s.size() == 1);
    CHECK(s[0].victims == std::vector<std::int64_t>{expected});  // a GPU idles: the last resort
    running[static_cast<std::size_t>(expected - 1)].preemptible = false;
  }
  CHECK(suspend({cpu_job(9, 1)}, 4, running).empty());
}

TEST_CASE("suspension's set is minimal, and nothing is frozen when even every candidate would not make room") {
  // Cheapest first takes 1 (one slot), then 2 (three): 2 alone is enough, so 1 goes back.
  const Runner small = sleeper(1, {0}, {}, 60), big = sleeper(2, {1, 2, 3}, {}, 600);
  auto s = suspend({cpu_job(9, 3)}, 4, {small, big});
  REQUIRE(s.size() == 1);
  CHECK(s[0].victims == std::vector<std::int64_t>{2});
  CHECK(s[0].cpu_slots == std::vector<int>{1, 2, 3});
  Runner fixed = sleeper(3, {2, 3});
  fixed.preemptible = false;
  CHECK(suspend({cpu_job(9, 3)}, 4, {small, fixed}).empty());  // 1 frees one slot of the three needed
}

TEST_CASE("two waiting jobs never freeze the same victim, and the line's order holds") {
  const std::vector<Runner> running{sleeper(1, {0}), sleeper(2, {1})};
  auto s = suspend({cpu_job(8, 1), cpu_job(9, 1)}, 2, running);
  REQUIRE(s.size() == 2);
  CHECK(s[0].victims != s[1].victims);
  CHECK(s[0].cpu_slots != s[1].cpu_slots);
  // One that nothing can make room for stops the look: the job behind it waits behind it.
  Runner fixed = sleeper(3, {2});
  fixed.preemptible = false;
  CHECK(suspend({cpu_job(8, 3), cpu_job(9, 1)}, 3, {running[0], running[1], fixed}).empty());
}

TEST_CASE("a job running on what a frozen job lends is never frozen in turn") {
  // Frozen in turn, it could end (a cancel) while the third job runs on the first's slots, and
  // the first would be thawed under it.
  Runner borrower = sleeper(2, {0});
  borrower.borrows = true;
  CHECK(suspend({cpu_job(9, 1, 20)}, 1, {borrower}).empty());
  CHECK(preempt_refusal(borrower, cpu_job(9, 1, 20), k_now, {}, true) == "it runs on what a frozen job lends");
  CHECK(preempt_refusal(borrower, urgent(9, 1, 20), k_now, {}).empty());  // stopped and requeued, it may be
}

TEST_CASE("a job suspended often enough is protected until it has run min_run_s since its thaw") {
  Runner often = sleeper(1, {0}, {}, 3600);
  often.preemptions = 1;  // preemptions and suspensions together
  often.resumed_at = k_now - 10;
  PreemptRules rules;
  rules.protect_after = 1;
  rules.min_run_s = 300;
  CHECK(suspend({cpu_job(9, 1)}, 1, {often}, rules).empty());
  often.resumed_at = k_now - 400;
  CHECK(suspend({cpu_job(9, 1)}, 1, {often}, rules).size() == 1);
}

TEST_CASE("lab mode: suspension keeps to a user's own jobs") {
  Runner theirs = sleeper(1, {0});
  theirs.user = 2000;
  PendingJob mine = cpu_job(9, 1);
  mine.user = 1000;
  PreemptRules rules;
  rules.lab = true;
  CHECK(suspend({mine}, 1, {theirs}, rules).empty());
  theirs.user = 1000;
  CHECK(suspend({mine}, 1, {theirs}, rules).size() == 1);
  // Across users (fair_share), a job without GPUs never freezes another's GPU job: its GPUs would idle.
  rules.across_users = true;
  rules.fair_share = 1;
  rules.held = {{2000, 2}};
  Runner gpu_job = sleeper(1, {0}, {0, 1});
  gpu_job.user = 2000;
  CHECK(suspend({mine}, 1, {gpu_job}, rules).empty());
  CHECK(preempt_refusal(gpu_job, mine, k_now, rules, true) ==
        "another user's, holding GPUs that freezing it would idle");
  theirs.user = 2000;
  CHECK(suspend({mine}, 1, {theirs}, rules).size() == 1);  // one without GPUs, over its share: it may
}

TEST_CASE("a shared GPU job that says its memory runs beside a frozen job whose memory stays on the GPU") {
  Runner low = runner(1, {0});  // exclusive, keeping 20 GiB of an 80 GiB GPU once frozen
  low.kept_mb = 20480;
  low.may_suspend = true;
  PendingJob j = urgent(9, 1);
  j.shared = true;
  j.memory_mb = 30720;
  const auto on = [&](const std::vector<Runner>& running, const PendingJob& job,
                      const std::map<std::int64_t, std::vector<int>>& reserved = {}) {
    return choose_suspensions({job}, held_by(gpus(1), running), CpuSlots{}, running, k_now, {}, reserved);
  };
  auto s = on({low}, j);
  REQUIRE(s.size() == 1);
  CHECK(s[0].victims == std::vector<std::int64_t>{1});
  CHECK(s[0].gpus == std::vector<int>{0});
  CHECK(s[0].cpu_slots.empty());
  PendingJob big = j;
  big.memory_mb = 61441;  // more than the 60 GiB the frozen job leaves
  CHECK(on({low}, big).empty());
  PendingJob whole = urgent(9, 1);  // exclusive: never beside anyone
  CHECK(on({low}, whole).empty());
  PendingJob unsized = j;
  unsized.memory_mb = 0;  // how much it needs is not known
  CHECK(on({low}, unsized).empty());
  Runner unknown = low;
  unknown.kept_mb = 0;  // what the frozen job keeps is not known: it lends no GPU
  CHECK(on({unknown}, j).empty());
  CHECK(on({low}, j, {{5, {0}}}).empty());      // reserved for another job
  CHECK(on({low}, j, {{9, {0}}}).size() == 1);  // its own reservation
  Runner stopping = low;
  stopping.stopping = true;  // coming free: it waits for that
  CHECK(on({stopping}, j).empty());
  Runner shared_low = runner(1, {0});
  shared_low.shared = true;
  shared_low.memory_mb = 40960;
  shared_low.kept_mb = 40960;
  shared_low.may_suspend = true;
  Runner other = runner(2, {0});
  other.shared = true;
  other.memory_mb = 30720;
  other.preemptible = false;                  // 10 GiB free beside them: freezing the low one frees no memory,
  CHECK(on({shared_low, other}, j).empty());  // so nothing fits
}

TEST_SUITE_END();
