// The attempts' owner (attempts.hpp) over a store in memory: a launch writes the record and
// launch.json before the executor is asked, a refused or impossible start ends the attempt with
// the reason, an attempt's end is a retry with backoff while retries are left and the job's end
// after, a cancel asked while it ran ends it cancelled, and the descriptor budget holds launches
// back with words that say how to raise the limit.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "daemon/attempts.hpp"
#include "daemon/lifecycle.hpp"
#include "tests/unit/daemon_bench.hpp"
#include "tests/unit/temp_dir.hpp"

using namespace gpuq::daemon;
using gpuq::JobState;
using gpuq::daemon::testing::DaemonBench;

namespace {

constexpr uid_t k_owner = 1001;

// A bench whose state dir is real, so a launch can write its files.
struct Bench : DaemonBench {
  gpuq::testing::TempDir state{"gpuq-attempts"};
  Bench() {
    config.state_dir = state.path;
    config.retry_backoff_s = 10;
    config.retry_backoff_max_s = 60;
  }
  // Launches job `id` on GPU 0: prepared, then handed to the executor.
  bool launch(std::int64_t id) {
    Active& a = jobs.at(id);
    if (!attempts.prepare(a, {id, {0}, {}}, 200)) return false;
    attempts.start(jobs.at(id));
    return true;
  }
  const JobRecord& rec(std::int64_t id) { return jobs.at(id).rec; }
  JobRecord stored(std::int64_t id) { return *store->get(id); }
};

Outcome exited(int code) {
  Outcome o;
  o.first_failure = {{"rank", 0}, {"exit_code", code}};
  o.exit_code = code;
  o.ended_at = 300;
  return o;
}

}  // namespace

TEST_SUITE_BEGIN("attempts");

TEST_CASE("a launch stores the running record and writes launch.json before the executor is asked") {
  Bench b;
  const auto id = b.submit(1, k_owner)[0];
  bool seen = false;
  b.executor.on_start = [&](const Executor::Attempt& a) {  // as the executor is asked
    seen = true;
    CHECK(b.stored(a.id).state == JobState::running);
    CHECK(b.stored(a.id).attempt == 1);
    CHECK(std::filesystem::exists(a.dir + "/launch.json"));
    CHECK(a.dir == attempt_dir(b.config.state_dir, id, 1));
  };
  REQUIRE(b.launch(id));
  CHECK(seen);
  CHECK(b.rec(id).state == JobState::running);
  CHECK(b.rec(id).attempt == 1);
  CHECK(b.rec(id).run.gpus == std::vector<int>{0});
  CHECK(b.executor.started == std::vector<std::int64_t>{id});
  std::ifstream in(attempt_dir(b.config.state_dir, id, 1) + "/launch.json");
  REQUIRE(in);
  const auto doc = nlohmann::json::parse(in);
  CHECK(doc["job_id"] == id);
  CHECK(doc["attempt"] == 1);
  CHECK(doc["ranks"][0]["argv"] == nlohmann::json::array({"true"}));
}

TEST_CASE("a start the executor refuses ends the attempt failed, in the executor's words") {
  Bench b;
  const auto id = b.submit(1, k_owner)[0];
  b.executor.refuse = gpuq::Error{gpuq::ErrorCode::internal, "sbatch: error: invalid partition"};
  REQUIRE(b.launch(id));
  const JobRecord ended = b.stored(id);
  CHECK(ended.state == JobState::failed);
  CHECK(ended.reason == "sbatch: error: invalid partition");
  CHECK_FALSE(b.jobs.contains(id));
  CHECK(b.orphan_walks == 1);  // a job that did not succeed: its handed-over dependents are looked at
  CHECK(b.passes_asked >= 1);
}

TEST_CASE("a working directory gone since submission fails the attempt, not started") {
  Bench b;
  const auto id = b.submit(1, k_owner)[0];
  JobRecord r = b.rec(id);
  r.spec.cwd = b.state.path + "/gone";
  b.store->update(r, false);
  b.jobs.apply(r);
  CHECK_FALSE(b.launch(id));
  CHECK(b.executor.started.empty());
  const JobRecord ended = b.stored(id);
  CHECK(ended.state == JobState::failed);
  CHECK(ended.reason.find("working directory " + b.state.path + "/gone is gone") != std::string::npos);
  CHECK(ended.reason.find("not started") != std::string::npos);
}

TEST_CASE("a failed attempt is retried after a backoff while retries are left, then the job fails") {
  Bench b;
  const auto id = b.submit(1, k_owner)[0];
  {
    JobRecord r = b.rec(id);
    r.spec.retries = 1;
    b.store->update(r, false);
    b.jobs.apply(r);
  }
  REQUIRE(b.launch(id));
  b.attempts.finish(b.jobs.at(id), exited(3));
  const JobRecord& again = b.rec(id);
  CHECK(again.state == JobState::queued);
  CHECK(again.reason == "attempt 1 failed (rank 0 exited with code 3); retry 1/1 in 10 s");
  CHECK(b.metrics.retries == 1);
  CHECK(b.metrics.run_time.count == 1);

  REQUIRE(b.launch(id));
  CHECK(b.rec(id).attempt == 2);
  b.attempts.finish(b.jobs.at(id), exited(4));
  const JobRecord ended = b.stored(id);
  CHECK(ended.state == JobState::failed);
  CHECK(ended.reason == "rank 0 exited with code 4");
  CHECK(b.metrics.retries == 1);
}

TEST_CASE("an attempt cancelled while it ran ends cancelled, and one that exited 0 succeeds") {
  Bench b;
  const auto ids = b.submit(2, k_owner);
  REQUIRE(b.launch(ids[0]));
  REQUIRE(b.launch(ids[1]));
  JobRecord asked = b.rec(ids[0]);
  asked.run.cancel_requested = true;
  b.jobs.apply(asked);
  Outcome killed = exited(0);
  killed.first_failure = {{"rank", 0}, {"signal", 15}};
  b.attempts.finish(b.jobs.at(ids[0]), killed);
  CHECK(b.stored(ids[0]).state == JobState::cancelled);
  CHECK(b.stored(ids[0]).reason == "cancelled while running");

  Outcome ok;
  ok.all_ok = true;
  ok.exit_code = 0;
  const int walks = b.orphan_walks;
  b.attempts.finish(b.jobs.at(ids[1]), ok);
  CHECK(b.stored(ids[1]).state == JobState::succeeded);
  CHECK(b.orphan_walks == walks);  // a success leaves its dependents' hand-overs as they are
}

TEST_CASE("a preempted attempt goes back in line, unless it ended on its own first: timed out, failed, succeeded") {
  Bench b;
  const auto ids = b.submit(5, k_owner);
  for (auto id : ids)
    REQUIRE(b.launch(id));
  for (auto id : ids)
    b.jobs.apply(next_record(b.rec(id), event::PreemptRequested{"job 9 (urgent)", 250}));
  Outcome stopped;  // stopped by the preemption's signal: no rank failed on its own
  stopped.cancelled = true;
  stopped.ended_at = 300;
  b.attempts.finish(b.jobs.at(ids[0]), stopped);
  CHECK(b.stored(ids[0]).state == JobState::queued);
  CHECK(b.stored(ids[0]).preemptions == 1);
  CHECK(b.stored(ids[0]).reason == "preempted by job 9 (urgent): attempt 1 was stopped");
  Outcome timed_out;  // its timeout's teardown had begun when the preemption came
  timed_out.timed_out = true;
  b.attempts.finish(b.jobs.at(ids[1]), timed_out);
  CHECK(b.stored(ids[1]).state == JobState::timed_out);
  CHECK(b.stored(ids[1]).preemptions == 0);
  b.attempts.finish(b.jobs.at(ids[2]), exited(3));  // a rank had failed: a failure (retries 0)
  CHECK(b.stored(ids[2]).state == JobState::failed);
  Outcome ok;
  ok.all_ok = true;
  ok.exit_code = 0;
  b.attempts.finish(b.jobs.at(ids[3]), ok);
  CHECK(b.stored(ids[3]).state == JobState::succeeded);
  JobRecord both = b.rec(ids[4]);  // a cancel asked too wins
  both.run.cancel_requested = true;
  b.jobs.apply(both);
  b.attempts.finish(b.jobs.at(ids[4]), stopped);
  CHECK(b.stored(ids[4]).state == JobState::cancelled);
}

TEST_CASE("an attempt the other system preempted (Slurm) goes back in line as preempted by it, no retry spent") {
  Bench b;
  const auto ids = b.submit(2, k_owner);
  REQUIRE(b.launch(ids[0]));
  REQUIRE(b.launch(ids[1]));
  Outcome slurm = Outcome::failed("Slurm job 42 ended PREEMPTED");
  slurm.preempted_by = "Slurm";
  b.attempts.finish(b.jobs.at(ids[0]), slurm);
  const JobRecord back = b.stored(ids[0]);
  CHECK(back.state == JobState::queued);
  CHECK((back.attempt == 1 && back.attempt_base == 1 && back.preemptions == 1));
  CHECK(back.run.preempted_by == "Slurm");
  CHECK(back.reason == "preempted by Slurm: attempt 1 was stopped");
  b.attempts.finish(b.jobs.at(ids[1]), Outcome::failed("Slurm job 43 ended NODE_FAIL"));  // not a preemption
  CHECK(b.stored(ids[1]).state == JobState::failed);
}

TEST_CASE("an attempt that failed after an OOM kill ends out_of_memory, retried only if its spec asks") {
  Bench b;
  const auto ids = b.submit(3, k_owner);
  for (std::int64_t id : ids) {
    JobRecord r = b.rec(id);
    r.spec.retries = 2;
    r.spec.memory_mb = 64;
    r.spec.retry_on_oom = id == ids[1];
    b.store->update(r, false);
    b.jobs.apply(r);
    REQUIRE(b.launch(id));
  }
  // A shell wrapper whose child the OOM killer took: the wrapper exited 137, the cgroup counted it.
  Outcome wrapped = exited(137);
  wrapped.oom_kills = 1;
  b.attempts.finish(b.jobs.at(ids[0]), wrapped);
  const JobRecord oom = b.stored(ids[0]);
  CHECK(oom.state == JobState::out_of_memory);  // not retried, though retries are left
  CHECK(oom.reason ==
        "out of memory: the OOM killer killed 1 process of it (its limit: 64 MiB a rank); rank 0 exited with code 137");
  CHECK(b.metrics.retries == 0);

  Outcome twice = exited(137);
  twice.oom_kills = 2;
  b.attempts.finish(b.jobs.at(ids[1]), twice);
  CHECK(b.rec(ids[1]).state == JobState::queued);  // retry_on_oom
  CHECK(b.rec(ids[1]).reason.find("attempt 1 failed (out of memory: the OOM killer killed 2 processes of it") == 0);
  CHECK(b.metrics.retries == 1);

  // A process of it killed, and it succeeded all the same (a worker it did without): succeeded.
  Outcome ok;
  ok.all_ok = true;
  ok.exit_code = 0;
  ok.oom_kills = 1;
  b.attempts.finish(b.jobs.at(ids[2]), ok);
  CHECK(b.stored(ids[2]).state == JobState::succeeded);
}

TEST_CASE("an attempt whose processes live on drains its GPUs until they are gone, and only its own drain is undone") {
  Bench b;
  const auto ids = b.submit(5, k_owner);
  for (auto id : ids)
    REQUIRE(b.launch(id));  // each on GPU 0 (as shared jobs may be)
  const std::string gpu0 = b.inventory.find(0)->uuid;
  Outcome ok;
  ok.all_ok = true;
  ok.exit_code = 0;
  b.attempts.finish(b.jobs.at(ids[3]), ok);  // nothing of it lingers
  CHECK_FALSE(b.health.drained(gpu0));
  CHECK(b.stored(ids[3]).reason.empty());

  b.executor.lingers[ids[0]] = "processes of it did not die within 30 s of SIGKILL (stuck in the kernel?)";
  b.executor.lingers[ids[1]] = "stuck too";
  b.attempts.finish(b.jobs.at(ids[0]), ok);
  CHECK(b.stored(ids[0]).state == JobState::succeeded);
  CHECK(b.stored(ids[0]).reason.find("GPU 0 drained until they are gone") != std::string::npos);
  REQUIRE(b.health.drained(gpu0));
  CHECK(b.health.drained().at(gpu0).find("job " + std::to_string(ids[0]) + ": processes of it did not die") == 0);
  b.attempts.finish(b.jobs.at(ids[1]), ok);  // a second job lingering on the same GPU
  b.attempts.released(ids[0]);
  CHECK(b.health.drained(gpu0));  // the second's processes are still on it
  b.attempts.released(ids[1]);
  CHECK_FALSE(b.health.drained(gpu0));  // back in service once neither lingers

  // Drained by an admin while the job's processes linger: their drain stays when those are gone.
  b.executor.lingers[ids[4]] = "stuck";
  b.attempts.finish(b.jobs.at(ids[4]), ok);
  b.health.set_drained({{0}, {}, "cabling"}, true);
  b.attempts.released(ids[4]);
  CHECK(b.health.drained().at(gpu0) == "cabling");
  b.health.set_drained({{0}, {}, ""}, false);

  // Drained by an admin (or a health check) before the attempt ended: that drain stays, reason and all.
  b.health.set_drained({{0}, {}, "fan failure"}, true);
  b.executor.lingers[ids[2]] = "stuck";
  b.attempts.finish(b.jobs.at(ids[2]), ok);
  CHECK(b.health.drained().at(gpu0) == "fan failure");
  b.attempts.released(ids[2]);
  CHECK(b.health.drained().at(gpu0) == "fan failure");
}

TEST_CASE("GPUs drained for lingering processes are held at start for jobs still lingering and back for the others") {
  Bench b;
  const std::string gpu0 = b.inventory.find(0)->uuid, gpu1 = b.inventory.find(1)->uuid;
  const std::string stuck = ": processes of it did not die within 30 s of SIGKILL (stuck in the kernel?)";
  b.health.set_drained({{0}, {}, "job 9" + stuck}, true);
  b.health.set_drained({{1}, {}, "job 8" + stuck}, true);
  b.attempts.resume_holds({9});
  CHECK(b.health.drained(gpu0));        // job 9's processes are still there
  CHECK_FALSE(b.health.drained(gpu1));  // job 8's are gone
  b.attempts.released(9);
  CHECK_FALSE(b.health.drained(gpu0));

  b.health.set_drained({{1}, {}, "fan failure"}, true);  // not a lingering job's drain: left alone
  b.attempts.resume_holds({});
  CHECK(b.health.drained().at(gpu1) == "fan failure");
}

TEST_CASE("jobs prepared together go to the executor as one array; one alone as a job") {
  Bench b;
  const auto ids = b.submit(3, k_owner);
  for (auto id : ids)
    REQUIRE(b.attempts.prepare(b.jobs.at(id), {id, {}, {}}, 200));
  b.attempts.start_array({ids[0], ids[1]}, 1);
  CHECK(b.executor.arrays == std::vector<std::vector<std::int64_t>>{{ids[0], ids[1]}});
  CHECK(b.executor.array_limit == 1);
  CHECK(b.executor.started.empty());
  b.attempts.start_array({ids[2]}, 0);
  CHECK(b.executor.started == std::vector<std::int64_t>{ids[2]});
  CHECK(b.executor.arrays.size() == 1);
}

TEST_CASE("an array the executor refuses fails each of its jobs with the executor's words") {
  Bench b;
  const auto ids = b.submit(2, k_owner);
  for (auto id : ids)
    REQUIRE(b.attempts.prepare(b.jobs.at(id), {id, {}, {}}, 200));
  b.executor.refuse = gpuq::Error{gpuq::ErrorCode::internal, "sbatch: array too large"};
  b.attempts.start_array(ids, 0);
  for (auto id : ids) {
    CHECK(b.stored(id).state == JobState::failed);
    CHECK(b.stored(id).reason == "sbatch: array too large");
  }
}

TEST_CASE("the descriptor budget lets launches through while the reserve holds, then says why they wait") {
  DescriptorBudget budget;
  budget.begin(true, {50 + 2 * k_descriptors_per_launch, 50});
  CHECK_FALSE(budget.spend());
  CHECK_FALSE(budget.spend());
  const auto why = budget.spend();
  REQUIRE(why);
  CHECK(*why == "gpuqd is short of file descriptors (50 free, " + std::to_string(50 + k_descriptors_per_launch) +
                    " needed to start a job): raise its limit (LimitNOFILE=, ulimit -n)");
  CHECK(budget.spend());  // still short within the pass
  budget.end();
  budget.begin(true, {-1, 0});  // unknown (no /proc): nothing is held back
  for (int i = 0; i < 100; ++i)
    CHECK_FALSE(budget.spend());
  budget.end();
}

TEST_CASE("gpuqd's log says once that launches wait for descriptors, and once that they are free again") {
  std::ostringstream log;
  auto* was = std::cerr.rdbuf(log.rdbuf());
  DescriptorBudget budget;
  const auto pass = [&](bool launching, long free, int launches) {
    budget.begin(launching, {free, 50});
    for (int i = 0; i < launches; ++i)
      (void)budget.spend();
    budget.end();
  };
  pass(true, 50, 3);  // short: said once, not once a launch
  pass(true, 50, 3);  // still short: not said again
  pass(false, 0, 0);  // a pass that launches nothing says nothing
  budget.begin(true, {500, 50});
  (void)budget.spend();  // a pass that threw before its end: dropped by the next one's begin,
  pass(false, 0, 0);     // which launches nothing, so it cannot say they are free again
  pass(true, 50, 3);     // still short: not said again
  pass(true, 500, 2);    // free again: said once
  pass(true, 500, 2);
  std::cerr.rdbuf(was);
  const std::string text = log.str();
  const auto count = [&](const std::string& what) {
    int n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
      ++n;
    return n;
  };
  CHECK(count("jobs wait until some free up") == 1);
  CHECK(count("file descriptors free again; starting jobs") == 1);
  CHECK(text.rfind("free again") > text.find("wait until"));
}

TEST_SUITE_END();
