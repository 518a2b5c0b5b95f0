// The read-only handlers (daemon/queries.cpp) as functions of what they read (daemon/reads.hpp):
// no daemon, no socket, no process started. A store in memory, a job table and fake GPUs are
// filled by hand, so each case sets exactly the state it asks about: lab mode's visibility rule,
// the words for a missing or forgotten job, what `why` says a queued job waits for.
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config.hpp"
#include "daemon/reads.hpp"

using namespace gpuq::daemon;
using gpuq::ErrorCode;
using gpuq::JobState;
using gpuq::RequestError;
using gpuq::common::json;

namespace {

// An executor that is never asked to run anything: the handlers only ask it what it can say.
struct QuietExecutor : Executor {
  std::optional<gpuq::Error> start(const Attempt&) override { return std::nullopt; }
  Found adopt(const Attempt&) override { return Found::alive; }
  void stop(std::int64_t) override {}
  Outcome outcome(const Attempt&) override { return Outcome::failed("never ran"); }
  std::string detail(std::int64_t id) const override { return "on node n" + std::to_string(id); }
};

struct Bench {
  boost::asio::io_context io;
  Config config;
  std::unique_ptr<Store> store;
  JobTable jobs;
  Users users;
  LastPass last_pass;
  Inventory inventory;
  GpuService health;
  GpuProcesses gpu_processes;
  HangWatch hangs{0, false};
  QuietExecutor executor;
  SlotCores cores{{0, 1, 2, 3}, {}};
  std::map<std::int64_t, int> batch_limits;

  static Users::Rules lab_mode() {
    Users::Rules r;
    r.multi_user = true;
    return r;
  }
  static std::unique_ptr<Store> open() {
    auto s = Store::open(":memory:");
    REQUIRE(s);
    return std::move(*s);
  }
  Bench()
      : store(open()),
        users(lab_mode(),
              Users::Directory{[](uid_t uid) { return uid == 0 ? std::string("root") : "user" + std::to_string(uid); },
                               [](uid_t) -> gpuq::Result<gpuq::common::Account> { return gpuq::Error{}; }}),
        inventory(std::move(*Inventory::create("fake:2:16000", std::nullopt))),
        health(io, inventory, *store, 0, [] {}),
        gpu_processes(io, inventory, 0, [] { return std::vector<GpuProcesses::Running>{}; }, [] {}) {
    config.state_dir = "/nonexistent/state";
  }
  Reads reads() {
    return {config, *store, jobs, users, last_pass, health, gpu_processes, hangs, executor, inventory, cores, batch_limits};
  }

  // One batch of `n` jobs of `owner`, written to the store; the queued ones live in the job table.
  std::vector<std::int64_t> submit(int n, uid_t owner, const std::vector<std::vector<std::size_t>>& deps = {}) {
    std::vector<JobRecord> recs(n);
    for (int i = 0; i < n; ++i) {
      recs[i].uid = owner;
      recs[i].spec.name = "job" + std::to_string(i);
      recs[i].spec.command = {"true"};  // a spec the store reads back as written
      recs[i].spec.cwd = "/";
      recs[i].spec.gpus = 1;
      recs[i].spec.labels = {{"lr", "0.1"}};
    }
    store->insert_batch(recs, deps.empty() ? std::vector<std::vector<std::size_t>>(n) : deps, "/", json::object(), 100);
    std::vector<std::int64_t> ids;
    for (auto& r : recs) {
      ids.push_back(r.id);
      jobs.load(r, 100);
    }
    return ids;
  }
  // Job `id` ended as `state` with `result`: in the store, and out of the job table.
  void end(std::int64_t id, JobState state, json result = nullptr) {
    JobRecord r = jobs.at(id).rec;
    r.state = state;
    r.attempt = 1;
    r.run.started_at = 110;
    r.run.ended_at = 120;
    r.run.result = std::move(result);
    r.reason = state == JobState::failed ? "exit 3: Traceback (most recent call last)" : "";
    store->update(r, true);
    jobs.apply(r);
  }
  void run(std::int64_t id, std::vector<int> gpus, double timeout_s = 0) {
    JobRecord r = jobs.at(id).rec;
    r.state = JobState::running;
    r.attempt = 1;
    r.run.started_at = 110;
    r.run.gpus = std::move(gpus);
    r.spec.timeout_s = timeout_s;
    store->update(r, true);
    jobs.apply(r);
  }
};

gpuq::common::JobInfo find(const gpuq::common::JobsReply& reply, std::int64_t id) {
  for (const auto& j : reply.jobs)
    if (j.id == id) return j;
  FAIL("job " << id << " is not in the reply");
  return {};
}

// The refusal `f` throws: its code, and its message in `message`.
ErrorCode refusal(const std::function<void()>& f, std::string& message) {
  try {
    f();
  } catch (const RequestError& e) {
    message = e.what();
    return e.code();
  }
  FAIL("not refused");
  return ErrorCode::internal;
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
  Bench b;
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
  Bench b;
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
  Bench b;
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
  // The status reason of a running job comes from its executor where the record has none.
  CHECK(find(queries::status(b.reads(), k_alice, {}), ids[0]).reason == "on node n" + std::to_string(ids[0]));
}

TEST_CASE("status without all bounds the queue it lists, and counts the whole of it") {
  Bench b;
  b.submit(5, k_alice.uid);
  gpuq::common::StatusRequest q;
  q.queued = 2;
  const auto reply = queries::status(b.reads(), k_alice, q);
  CHECK(reply.jobs.size() == 2);
  CHECK(reply.queued_total == 5);
  CHECK(reply.total == 5);
}
