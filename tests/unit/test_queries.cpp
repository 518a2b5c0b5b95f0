// The read-only handlers (daemon/queries.cpp) as functions of what they read (daemon/reads.hpp):
// no daemon, no socket, no process started. A store in memory, a job table and fake GPUs are
// filled by hand, so each case sets exactly the state it asks about: lab mode's visibility rule,
// the words for a missing or forgotten job, what `why` says a queued job waits for, what `gpus`
// and a metrics scrape report.
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/hooks.hpp"
#include "daemon/metrics.hpp"
#include "tests/unit/daemon_bench.hpp"
#include "tests/unit/refusal.hpp"

using namespace gpuq::daemon;
using gpuq::daemon::testing::DaemonBench;
using gpuq::ErrorCode;
using gpuq::JobState;
using gpuq::RequestError;
using gpuq::common::json;

using gpuq::testing::refusal;

namespace {

gpuq::common::JobInfo find(const gpuq::common::JobsReply& reply, std::int64_t id) {
  for (const auto& j : reply.jobs)
    if (j.id == id) return j;
  FAIL("job " << id << " is not in the reply");
  return {};
}

bool has(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

const Caller k_alice{1001, false}, k_bob{1002, false}, k_admin{0, true};

}  // namespace

TEST_SUITE_BEGIN("queries");

TEST_CASE("status shows another user's job by its public fields alone, and its owner and admins all of it") {
  DaemonBench b;
  const auto ids = b.submit(2, k_bob.uid);
  b.end(ids[0], JobState::failed, json{{"loss", 0.25}});
  for (const Caller& viewer : {k_alice, k_bob, k_admin}) {
    CAPTURE(viewer.uid);
    const auto reply = queries::status(b.reads(), viewer, {});
    CHECK(reply.total == 2);
    const auto ended = find(reply, ids[0]);
    const auto queued = find(reply, ids[1]);
    CHECK(ended.user == "user1002");
    CHECK(ended.state == JobState::failed);
    const bool owner_or_admin = viewer.uid != k_alice.uid;
    CHECK(ended.details_hidden == !owner_or_admin);
    CHECK(ended.result.is_null() == !owner_or_admin);       // its result is its owner's
    CHECK(ended.labels.empty() == !owner_or_admin);
    CHECK(ended.reason.empty() == !owner_or_admin);         // a failure's reason may quote its output
    CHECK(queued.details_hidden == !owner_or_admin);
  }
}

TEST_CASE("show, events and results of another user's job are refused naming its owner; a missing id says whether it was forgotten") {
  DaemonBench b;
  const auto ids = b.submit(1, k_bob.uid);
  b.end(ids[0], JobState::succeeded, json{{"acc", 0.9}});
  std::string message;
  CHECK(refusal([&] { queries::show(b.reads(), k_alice, {ids[0]}); }, message) == ErrorCode::forbidden);
  CHECK(message.find("belongs to user1002") != std::string::npos);
  CHECK(refusal([&] { queries::events(b.reads(), k_alice, {.id = ids[0], .type = ""}); }, message) == ErrorCode::forbidden);
  CHECK(refusal([&] { queries::results(b.reads(), k_alice, {.ids = {ids[0]}}); }, message) == ErrorCode::forbidden);
  CHECK(queries::show(b.reads(), k_bob, {ids[0]}).job.result == json{{"acc", 0.9}});
  CHECK(queries::results(b.reads(), k_admin, {.ids = {ids[0]}}).jobs.size() == 1);

  CHECK(refusal([&] { queries::show(b.reads(), k_admin, {ids[0] + 1}); }, message) == ErrorCode::not_found);
  CHECK(message == "no job " + std::to_string(ids[0] + 1));
  b.store->remove_jobs({ids[0]});
  CHECK(refusal([&] { queries::show(b.reads(), k_admin, {ids[0]}); }, message) == ErrorCode::not_found);
  CHECK(message.find("was forgotten") != std::string::npos);
  // An attempt past the last is named as such.
  const auto more = b.submit(1, k_bob.uid);
  b.end(more[0], JobState::failed);
  CHECK(refusal([&] { queries::events(b.reads(), k_bob, {.id = more[0], .attempt = 2, .type = ""}); }, message) == ErrorCode::not_found);
  CHECK(message.find("has 1 attempt(s); there is no attempt 2") != std::string::npos);
}

TEST_CASE("why says a queued job waits for a dependency, drained GPUs and the job ahead, and when the holders' timeouts let it start") {
  DaemonBench b;
  // Job 0 runs on GPU 0 with a timeout; job 1 is ahead in line; job 2 (2 GPUs) waits for job 3, which failed.
  const auto ids = b.submit(4, k_alice.uid);
  b.run(ids[0], {0}, 50);
  b.end(ids[3], JobState::failed);
  JobRecord waiting = b.jobs.at(ids[2]).rec;
  waiting.after = {ids[3]};
  waiting.spec.gpus = 2;
  b.jobs.apply(waiting);
  b.health.set_drained({{1}, {}, "fan"}, true);

  auto why = queries::why(b.reads(), k_bob, {ids[2]});
  INFO(json(why.details).dump());
  CHECK(has(why.details, "it waits for job " + std::to_string(ids[3]) + " to succeed, which is failed"));
  CHECK(has(why.details, "it asks for 2 GPUs, and only 1 are in service"));
  CHECK(has(why.details, "1 job(s) are ahead of it in line"));
  CHECK(why.ahead == 1);
  REQUIRE(why.holders.size() == 1);
  CHECK(why.holders[0].id == ids[0]);
  CHECK(why.holders[0].ends_by == 110 + 50 + b.config.grace_s);  // started, plus its timeout and the grace
  CHECK(why.estimated_start.is_null());  // not while it cannot fit
  // GPU 1 back in service: it lacks the one GPU job 0 holds, free once job 0's timeout and grace are up.
  b.health.set_drained({{1}, {}, ""}, false);
  why = queries::why(b.reads(), k_bob, {ids[2]});
  CHECK_FALSE(has(why.details, "in service"));
  CHECK(why.estimated_start == 110 + 50 + b.config.grace_s);
  // A running job's why says so, and nothing of a wait.
  const auto running = queries::why(b.reads(), k_alice, {ids[0]});
  CHECK(running.details == std::vector<std::string>{"it is running"});
  // An ended one's says it waits for nothing, its state left to the header.
  const auto ended = queries::why(b.reads(), k_bob, {ids[3]});
  CHECK(ended.details == std::vector<std::string>{"it waits for nothing: it has ended (gpuq show " +
                                                  std::to_string(ids[3]) + " says how)"});
  // The status reason of a running job comes from its executor where the record has none.
  CHECK(find(queries::status(b.reads(), k_alice, {}), ids[0]).reason == "on node n" + std::to_string(ids[0]));
}

TEST_CASE("status without all bounds the queue it lists, and counts the whole of it") {
  DaemonBench b;
  b.submit(5, k_alice.uid);
  gpuq::common::StatusRequest q;
  q.queued = 2;
  const auto reply = queries::status(b.reads(), k_alice, q);
  CHECK(reply.jobs.size() == 2);
  CHECK(reply.queued_total == 5);
  CHECK(reply.total == 5);
}

TEST_CASE("hello refuses another major version and takes any minor; it says who the caller is") {
  DaemonBench b;
  gpuq::common::HelloRequest q;
  const auto reply = queries::hello(b.reads(), k_alice, q);
  CHECK(reply.user == "user1001");
  CHECK_FALSE(reply.admin);
  CHECK(reply.multi_user == b.config.multi_user);
  q.protocol_version = gpuq::common::k_protocol_version + 1;
  std::string message;
  CHECK(refusal([&] { queries::hello(b.reads(), k_alice, q); }, message) == ErrorCode::version_mismatch);
  CHECK(message.find("client speaks protocol " + std::to_string(q.protocol_version)) != std::string::npos);
}

TEST_CASE("usage counts each user's queued and running jobs and the GPUs they hold") {
  DaemonBench b;
  const auto alice = b.submit(3, k_alice.uid);
  const auto bob = b.submit(1, k_bob.uid);
  b.run(alice[0], {0});
  b.run(alice[1], {1});
  b.end(bob[0], JobState::succeeded);
  const auto reply = queries::usage(b.reads(), k_bob, {});
  REQUIRE(reply.users.size() == 1);  // bob has nothing queued or running, and no use recorded
  const auto& u = reply.users[0];
  CHECK(u.user == "user1001");
  CHECK(u.running == 2);
  CHECK(u.gpus == 2);
  CHECK(u.queued == 1);
  CHECK(u.gpu_hours > 0);  // started at 110 (unix time), so hours of it by now
}

TEST_CASE("gpus: which jobs hold each GPU and how, drained GPUs with their reason, the CPU slots held") {
  DaemonBench b;
  b.config.cpu_slots = 4;
  const auto ids = b.submit(3, k_bob.uid);
  b.jobs.at(ids[0]).rec.run.cpu_slots = {1, 2};
  b.run(ids[0], {0});  // exclusive: the whole GPU
  b.jobs.at(ids[1]).rec.spec.shared = true;
  b.jobs.at(ids[1]).rec.spec.gpu_memory_mb = 4000;
  b.run(ids[1], {1});  // shared: its declared memory
  b.health.set_drained({{1}, {}, "fan failure"}, true);

  const auto reply = queries::gpus(b.reads());
  CHECK(reply.source == "fake:2:16000");
  REQUIRE(reply.gpus.size() == 2);
  CHECK(reply.gpus[0].jobs == std::vector<std::int64_t>{ids[0]});
  CHECK(reply.gpus[0].exclusive);
  CHECK(reply.gpus[0].allocated_mb == 16000);
  CHECK_FALSE(reply.gpus[0].drained);
  CHECK(reply.gpus[1].jobs == std::vector<std::int64_t>{ids[1]});
  CHECK_FALSE(reply.gpus[1].exclusive);
  CHECK(reply.gpus[1].allocated_mb == 4000);
  CHECK(reply.gpus[1].drained);
  CHECK(reply.gpus[1].drain_reason == "fan failure");
  CHECK(reply.cpu_slots == 4);
  CHECK(reply.cpu_slots_used == 2);
  CHECK(reply.cores == "0-3");
}

TEST_CASE("metrics: jobs by state and user, the 50 largest batches, the GPUs as gpus reports them") {
  DaemonBench b;
  Hooks hooks{b.io, {}, *b.store, b.users, [](std::int64_t) { return json::object(); }};
  MetricCounters counters;
  counters.attempts_started = 7;
  counters.started_at = 1234.5;
  const auto bobs = b.submit(3, k_bob.uid);
  b.submit(1, k_alice.uid);
  b.run(bobs[0], {0});
  const std::string text = metrics_text(b.reads(), counters, hooks);
  CHECK(text.find("gpuq_start_time_seconds 1234.5\n") != std::string::npos);
  CHECK(text.find("gpuq_jobs{state=\"running\",user=\"user1002\"} 1\n") != std::string::npos);
  CHECK(text.find("gpuq_jobs{state=\"queued\",user=\"user1002\"} 2\n") != std::string::npos);
  CHECK(text.find("gpuq_jobs{state=\"queued\",user=\"user1001\"} 1\n") != std::string::npos);
  CHECK(text.find("gpuq_attempts_started_total 7\n") != std::string::npos);
  CHECK(text.find("gpuq_gpu_jobs{gpu=\"0\",uuid=\"" + b.inventory.gpus()[0].uuid + "\"} 1\n") != std::string::npos);
  CHECK(text.find("gpuq_gpu_memory_allocated_bytes{gpu=\"0\"") != std::string::npos);

  // Sixty batches with a job each in line: fifty series, not sixty.
  for (int i = 0; i < 60; ++i) b.submit(1, k_alice.uid);
  const std::string many = metrics_text(b.reads(), counters, hooks);
  std::size_t series = 0;
  for (std::size_t at = many.find("gpuq_batch_jobs{batch="); at != std::string::npos;
       at = many.find("gpuq_batch_jobs{batch=", at + 1))
    ++series;
  CHECK(series == 2 * 50);  // queued and running of each
}

TEST_SUITE_END();
