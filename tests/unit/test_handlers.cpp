// gpuqd's request handlers in process: a Daemon over an in-memory store and fake GPUs, driven
// through dispatch() as the server drives it, its io_context run until each reply arrives. No
// socket and no client. Jobs launch for real, with /bin/false as their supervisor, which exits at
// once without an exit record: every attempt fails, "the job's supervisor ended without recording
// an outcome", which gives the tests ended jobs without running anything.
#include <doctest/doctest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "daemon/daemon.hpp"
#include "daemon/lifecycle.hpp"
#include "tests/unit/temp_dir.hpp"

using namespace gpuq::daemon;
using gpuq::common::json;

namespace {

struct Core {
  gpuq::testing::TempDir temp{"gpuq-unit-handlers"};  // removed with all in it, after the rest is gone
  const std::string dir = temp.path;
  asio::io_context io;
  // Keeps run_one() waiting while a submit is checked on gpuqd's helper thread.
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::unique_ptr<Daemon> daemon;

  explicit Core(const std::string& gpus = "fake:2:16000",
                std::function<std::unique_ptr<Executor>(asio::io_context&, Executor::Ended)> make_executor = {},
                std::function<void(Config&)> tweak = {}, const std::string& store_path = ":memory:") {
    Config config;
    config.state_dir = dir;
    config.shim_path = "/bin/false";
    config.retry_backoff_s = 0;
    config.make_executor = std::move(make_executor);
    if (tweak) tweak(config);
    auto store = Store::open(store_path);
    REQUIRE(store);
    auto inventory = Inventory::create(gpus, std::nullopt);
    REQUIRE(inventory);
    daemon = std::make_unique<Daemon>(io, config, std::move(*store), std::move(*inventory));
    daemon->recover();
  }
  ~Core() {
    daemon.reset();
  }

  // The reply to `request` (from `caller`), running gpuqd's loop until it comes.
  json call(const json& request, const Caller& caller = Caller::self()) {
    std::optional<json> reply;
    daemon->dispatch(caller, request, [&](json r) { reply = std::move(r); });
    // A bound, not a wait: a reply that never comes fails the test instead of hanging it.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!reply) {
      if (std::chrono::steady_clock::now() > give_up) FAIL("no reply within 60 s to " << request.dump());
      io.run_one_for(std::chrono::seconds(1));
    }
    return *reply;
  }
  // Runs what is ready on gpuqd's loop (a scheduling pass a request posted), waiting for nothing.
  void settle() {
    while (io.poll() > 0) {
    }
  }
  // Its body; the test fails on an error reply.
  json ok(const json& request) {
    json r = call(request);
    INFO(r.dump());
    REQUIRE(r.value("ok", false));
    return r;
  }
  std::string error_code(const json& request) {
    json r = call(request);
    INFO(r.dump());
    REQUIRE_FALSE(r.value("ok", true));
    return r["error"]["code"].get<std::string>();
  }
  std::vector<std::int64_t> submit(json jobs, bool hold = false) {
    json r = ok({{"cmd", "submit"}, {"jobs", std::move(jobs)}, {"cwd", dir}, {"hold", hold}});
    return r["ids"].get<std::vector<std::int64_t>>();
  }
  std::string state_of(std::int64_t id) { return ok({{"cmd", "show"}, {"id", id}})["job"]["state"].get<std::string>(); }
};

json job(const std::string& name, json extra = json::object()) {
  json j{{"name", name}, {"command", {"true"}}};
  j.update(extra);
  return j;
}

}  // namespace

TEST_SUITE_BEGIN("handlers");

TEST_CASE("every command in the table is dispatched, and an unknown one is refused naming them all") {
  Core core;
  json r = core.call({{"cmd", "frobnicate"}});
  REQUIRE_FALSE(r["ok"].get<bool>());
  CHECK(r["error"]["code"] == "unknown_command");
  const std::string message = r["error"]["message"];
  CHECK(message.find("`frobnicate`") != std::string::npos);
  CHECK(Daemon::commands().size() >= 17);
  for (const auto& c : Daemon::commands()) {
    CAPTURE(c.name);
    CHECK(message.find(std::string(c.name)) != std::string::npos);
    if (c.name == "shutdown") continue;
    // A request with no fields reaches the command's own decoder: whatever it says, it is not
    // "unknown command".
    json reply = core.call({{"cmd", std::string(c.name)}});
    CHECK(reply.dump().find("unknown_command") == std::string::npos);
  }
  CHECK(core.error_code(json::array()) == "bad_request");
  CHECK(core.error_code({{"cmd", 7}}) == "bad_request");
}

TEST_CASE("the protocol's list of decoders, which the request fuzzer walks, names the table's commands in order") {
  std::vector<std::string> table, decoders;
  for (const auto& c : Daemon::commands()) table.emplace_back(c.name);
  for (const auto& d : gpuq::common::request_decoders()) decoders.emplace_back(d.name);
  CHECK(decoders == table);
  // The decoder a row names is the one the table's row uses: both refuse the same wrong field.
  Core core;
  int compared = 0;
  for (const auto& d : gpuq::common::request_decoders()) {
    if (d.name == "shutdown" || d.name == "gpus") continue;
    const json wrong = {{"cmd", std::string(d.name)}, {"ids", "seven"}, {"id", "seven"}, {"jobs", 7}, {"gpus", 7}};
    std::string said;
    try {
      d.check(wrong);
    } catch (const gpuq::RequestError& e) {
      said = e.what();
    }
    CAPTURE(d.name);
    if (said.empty()) continue;  // a decoder without such fields (hello, status...)
    const json reply = core.call(wrong);
    REQUIRE_FALSE(reply["ok"].get<bool>());
    CHECK(reply["error"]["message"].get<std::string>() == said);
    ++compared;
  }
  CHECK(compared >= 10);
}

TEST_CASE("hello: a client of any minor of this major is served, another major is refused") {
  Core core;
  const json newer = core.call({{"cmd", "hello"}, {"protocol_version", gpuq::common::k_protocol_version},
                                {"protocol_minor", 99}, {"client", "gpuq-next"}, {"wants", "more"}});
  REQUIRE(newer["ok"].get<bool>());
  CHECK(newer["protocol_minor"] == gpuq::common::k_protocol_minor);
  const json older = core.call({{"cmd", "hello"}, {"protocol_version", gpuq::common::k_protocol_version}});
  CHECK(older["ok"].get<bool>());
  CHECK(core.error_code({{"cmd", "hello"}, {"protocol_version", gpuq::common::k_protocol_version + 1},
                         {"protocol_minor", 0}}) == "version_mismatch");
}

TEST_CASE("a field of the wrong type is refused by the command's decoder, naming the field") {
  Core core;
  json r = core.call({{"cmd", "status"}, {"limit", "many"}});
  CHECK(r["error"]["code"] == "bad_request");
  CHECK(r["error"]["message"].get<std::string>().find("`limit`") != std::string::npos);
  r = core.call({{"cmd", "cancel"}, {"ids", {0}}});
  CHECK(r["error"]["message"].get<std::string>().find("`ids`") != std::string::npos);
}

TEST_CASE("held jobs stay queued until released; a queued job cancelled ends at once") {
  Core core;
  auto ids = core.submit(json::array({job("a"), job("b")}), /*hold=*/true);
  REQUIRE(ids.size() == 2);
  json status = core.ok({{"cmd", "status"}});
  REQUIRE(status["jobs"].size() == 2);
  for (const auto& j : status["jobs"]) {
    CHECK(j["state"] == "queued");
    CHECK(j["held"] == true);
  }
  json cancel = core.ok({{"cmd", "cancel"}, {"ids", {ids[1]}}});
  CHECK(cancel["jobs"][0]["state"] == "cancelled");
  CHECK(cancel["jobs"][0]["changed"] == true);
  CHECK(core.state_of(ids[1]) == "cancelled");
  // Cancelling again changes nothing, and says so.
  cancel = core.ok({{"cmd", "cancel"}, {"ids", {ids[1]}}});
  CHECK(cancel["jobs"][0]["changed"] == false);

  json released = core.ok({{"cmd", "release"}, {"ids", {ids[0]}}});
  CHECK(released["jobs"][0]["changed"] == true);
  // Released, it runs under /bin/false as its supervisor and fails: wait answers once it has.
  json waited = core.ok({{"cmd", "wait"}, {"ids", {ids[0]}}});
  REQUIRE(waited["jobs"].size() == 1);
  CHECK(waited["jobs"][0]["state"] == "failed");
  CHECK(waited["jobs"][0]["reason"].get<std::string>().find("without recording an outcome") != std::string::npos);
}

TEST_CASE("releasing a held job is what starts it") {
  Core core;
  auto ids = core.submit(job("held"), /*hold=*/true);
  core.settle();  // the pass the submit asked for, which finds nothing to start
  // Nothing else happens meanwhile (no other request, no job ending) to start a pass.
  CHECK(core.ok({{"cmd", "release"}, {"ids", ids}})["jobs"][0]["changed"] == true);
  CHECK(core.ok({{"cmd", "wait"}, {"ids", ids}})["jobs"][0]["attempt"] == 1);
}

TEST_CASE("restart takes the jobs that failed waiting for the restarted one, and says which") {
  Core core;
  auto ids = core.submit(json::array({job("head"), job("tail", {{"after", {"head"}}})}));
  REQUIRE(ids.size() == 2);
  json waited = core.ok({{"cmd", "wait"}, {"ids", ids}});
  CHECK(core.state_of(ids[0]) == "failed");
  CHECK(core.state_of(ids[1]) == "failed");  // for its dependency: it never ran
  CHECK(core.ok({{"cmd", "show"}, {"id", ids[1]}})["job"]["attempt"] == 0);

  // The tail alone cannot restart: it would wait for a job that failed.
  CHECK(core.error_code({{"cmd", "restart"}, {"ids", {ids[1]}}}) == "wrong_state");
  json restarted = core.ok({{"cmd", "restart"}, {"ids", {ids[0]}}, {"fresh", true}});
  REQUIRE(restarted["jobs"].size() == 2);
  CHECK(restarted["total"] == 2);
  CHECK(restarted["jobs"][0]["id"] == ids[0]);
  CHECK(restarted["jobs"][0]["with"] == 0);
  CHECK(restarted["jobs"][1]["id"] == ids[1]);
  CHECK(restarted["jobs"][1]["with"] == ids[0]);
  CHECK(restarted["along"] == 1);
  // Both run (and fail) again: the head its second attempt, the tail fails waiting for it again.
  core.ok({{"cmd", "wait"}, {"ids", ids}});
  json head = core.ok({{"cmd", "show"}, {"id", ids[0]}});
  CHECK(head["job"]["restarts"] == 1);
  CHECK(head["job"]["attempt"] == 2);
}

TEST_CASE("clean --forget keeps an ended job that a queued job still waits for, and says why") {
  Core core;
  auto first = core.submit(job("done"));
  core.ok({{"cmd", "wait"}, {"ids", first}});
  auto second = core.submit(job("later", {{"after", {first[0]}}}), /*hold=*/true);
  // Named by id, a needed job is refused rather than kept.
  CHECK(core.error_code({{"cmd", "clean"}, {"ids", first}, {"forget", true}}) == "wrong_state");
  // Chosen by age, it is kept, naming the job that waits for it.
  json by_age = core.call({{"cmd", "clean"}, {"ended_before", 4e9}, {"forget", true}});
  INFO(by_age.dump());
  REQUIRE(by_age["ok"] == true);
  REQUIRE(by_age["kept"].size() == 1);
  CHECK(by_age["kept"][0]["id"] == first[0]);
  CHECK(by_age["kept"][0]["reason"].get<std::string>().find(std::to_string(second[0])) != std::string::npos);
  CHECK(core.state_of(first[0]) == "failed");
  // Once the waiting job is gone, the old one can go.
  core.ok({{"cmd", "cancel"}, {"ids", second}});
  core.ok({{"cmd", "clean"}, {"ended_before", 4e9}, {"forget", true}});
  CHECK(core.error_code({{"cmd", "show"}, {"id", first[0]}}) == "not_found");
}

TEST_CASE("update moves a queued job in line, all or nothing") {
  Core core;
  auto ids = core.submit(json::array({job("low"), job("high")}), /*hold=*/true);
  core.ok({{"cmd", "update"}, {"ids", {ids[1]}}, {"set", {{"priority", 5}}}});
  CHECK(core.ok({{"cmd", "show"}, {"id", ids[1]}})["job"]["priority"] == 5);
  // One job that does not exist: neither changes.
  CHECK(core.error_code({{"cmd", "update"}, {"ids", {ids[0], 999}}, {"set", {{"priority", 9}}}}) == "not_found");
  CHECK(core.ok({{"cmd", "show"}, {"id", ids[0]}})["job"]["priority"] == 0);
  CHECK(core.error_code({{"cmd", "update"}, {"ids", {ids[0]}}, {"set", {{"priority", "high"}}}}) != "");
}


TEST_CASE("a job spread over several machines is refused by gpuqd on one, naming the Slurm executor") {
  Core core;
  json r = core.call({{"cmd", "submit"},
                      {"jobs", json::array({job("fine"), job("wide", {{"mode", "ddp"}, {"gpus", 2}, {"nodes", 2}})})},
                      {"cwd", core.dir}});
  REQUIRE_FALSE(r["ok"].get<bool>());
  CHECK(r["error"]["code"] == "invalid_spec");
  const std::string message = r["error"]["message"];
  CHECK(message.find("job[1] (wide)") != std::string::npos);
  CHECK(message.find("--executor slurm") != std::string::npos);
  CHECK(core.ok({{"cmd", "status"}})["jobs"].empty());  // all or nothing: `fine` is not queued either
}

// ---- an executor that places work itself (as Slurm's does) ---------------------------------------

namespace {

// What a fake cluster was asked, for the tests to read; its jobs end when a test says so.
struct FakeCluster {
  struct Handover {
    std::vector<std::int64_t> ids;
    int limit = 0;
    std::vector<std::vector<std::int64_t>> after;  // each attempt's handed-over dependencies
  };
  std::vector<Handover> handed;
  std::vector<std::int64_t> withdrawn;
  std::set<std::int64_t> live;
  std::vector<std::int64_t> offered_first;  // jobs gpuqd offered for a unit as first attempts, each time
  std::map<std::int64_t, json> outcomes;
  Executor::Ended ended;
};

class FakeExecutor final : public Executor {
 public:
  FakeExecutor(asio::io_context& io, FakeCluster& cluster) : m_io(io), m_cluster(cluster) {}
  bool places_work() const override { return true; }
  bool inherits_environment() const override { return true; }
  std::string containment() const override { return "the fake cluster's"; }
  gpuq::Result<bool> start(const Attempt& a) override { return start_array({a}, 0); }
  // First attempts of one-GPU jobs of a batch go as arrays; others alone.
  std::optional<Handover> place(const std::vector<PendingJob>& queue, const BatchLimits& limits,
                                const FirstAttempt& first) const override {
    return hand_over(
        queue, limits,
        [&](const PendingJob& job) {
          const auto a = job.batch != 0 ? first(job) : std::nullopt;
          if (a) m_cluster.offered_first.push_back(job.id);
          return a && a->spec->gpus <= 1 ? std::string("one-gpu") : std::string();
        },
        1000);
  }
  bool follows(std::int64_t dep) const override { return !external_id(dep).empty(); }
  gpuq::Result<bool> start_array(const std::vector<Attempt>& attempts, int limit) override {
    FakeCluster::Handover h{{}, limit, {}};
    for (const auto& a : attempts) {
      h.ids.push_back(a.id);
      h.after.push_back(a.after);
      m_cluster.live.insert(a.id);
      if (m_handed) asio::post(m_io, [this, id = a.id] { m_handed(id); });
    }
    m_cluster.handed.push_back(std::move(h));
    return true;
  }
  Found adopt(const Attempt& a) override { return m_cluster.live.count(a.id) ? Found::alive : Found::never_started; }
  void stop(std::int64_t id) override { finish(id, json{{"cancelled", true}}); }
  void withdraw(std::int64_t id) override {
    m_cluster.withdrawn.push_back(id);
    finish(id, json{{"withdrawn", true}});
  }
  Outcome outcome(const Attempt& a) override {
    auto it = m_cluster.outcomes.find(a.id);
    return Outcome::from_record(it == m_cluster.outcomes.end() ? json{{"error", "no outcome"}} : it->second);
  }
  std::string external_id(std::int64_t id) const override {
    return m_cluster.live.count(id) ? "fake:" + std::to_string(id) : "";
  }
  bool started(std::int64_t) const override { return false; }

 private:
  void finish(std::int64_t id, json outcome) {
    m_cluster.outcomes[id] = std::move(outcome);
    m_cluster.live.erase(id);
    asio::post(m_io, [this, id] { m_cluster.ended(id); });
  }
  asio::io_context& m_io;
  FakeCluster& m_cluster;
};

struct ClusterCore : Core {
  FakeCluster& cluster;
  explicit ClusterCore(FakeCluster& c, const std::string& store_path = ":memory:")
      : Core(
            "none",
            [&c](asio::io_context& loop, Executor::Ended ended) {
              c.ended = std::move(ended);
              return std::make_unique<FakeExecutor>(loop, c);
            },
            {}, store_path),
        cluster(c) {}
  // The job's attempt ends in the cluster as `outcome` says.
  void end(std::int64_t id, json outcome) {
    cluster.outcomes[id] = std::move(outcome);
    cluster.live.erase(id);
    cluster.ended(id);
    settle();
  }
  void succeed(std::int64_t id) { end(id, json{{"ranks", {{{"rank", 0}, {"exit_code", 0}}}}}); }
  json show(std::int64_t id) { return ok({{"cmd", "show"}, {"id", id}}); }
};

}  // namespace

namespace {

// Runs `sql` on a state store's file directly, as another gpuq (or damage) would have.
void raw_exec(const std::string& path, const std::string& sql) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &raw) == SQLITE_OK);
  CHECK(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(raw);
}

std::string raw_spec(const std::string& path, std::int64_t id) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw, "SELECT spec FROM jobs WHERE id=?", -1, &st, nullptr) == SQLITE_OK);
  sqlite3_bind_int64(st, 1, id);
  std::string spec;
  if (sqlite3_step(st) == SQLITE_ROW) spec = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return spec;
}

}  // namespace

TEST_CASE("a job whose stored spec does not parse never runs: failed at recovery if queued, never requeued, updated or restarted") {
  gpuq::testing::TempDir state("gpuq-unit-handlers-spec");
  const std::string db = state.path + "/state.db";
  std::vector<std::int64_t> ids;
  {
    FakeCluster first;
    ClusterCore core(first, db);
    ids = core.submit(json::array({job("later"), job("after-it", {{"after", {"later"}}}), job("fine"), job("running"),
                                   job("never-started")}),
                      /*hold=*/true);
    REQUIRE(ids.size() == 5);
  }
  // As a later gpuq would have written them (a field this one does not know, retries it would
  // take), and two of them running when gpuqd stopped; one of those had not started.
  const std::string later = R"({"name":"later","command":["true"],"retries":3,"gang_timeout_s":30})";
  std::string sql;
  for (std::size_t i : {0, 3, 4})
    sql += "UPDATE jobs SET spec='" + later + "' WHERE id=" + std::to_string(ids[i]) + ";";
  for (std::size_t i : {3, 4})
    sql += "UPDATE jobs SET state='running', attempt=1, held=0, started_at=5 WHERE id=" + std::to_string(ids[i]) + ";";
  raw_exec(db, sql);

  FakeCluster cluster;
  cluster.live = {ids[3]};  // still running in the cluster; ids[4] never got there
  ClusterCore core(cluster, db);
  core.settle();
  json queued = core.show(ids[0]);
  CHECK(queued["job"]["state"] == "failed");
  CHECK(queued["job"]["attempt"] == 0);
  const std::string reason = queued["job"]["reason"];
  CHECK(reason.find("its stored spec does not parse") == 0);
  CHECK(reason.find("gang_timeout_s") != std::string::npos);
  CHECK(queued["spec_error"].get<std::string>().find("unknown field `gang_timeout_s`") != std::string::npos);
  CHECK(core.state_of(ids[1]) == "failed");  // it waited for the one that failed
  CHECK(core.state_of(ids[2]) == "queued");  // the rest is as it was
  CHECK(core.show(ids[4])["job"]["reason"].get<std::string>().find("its stored spec does not parse") == 0);
  CHECK(cluster.handed.empty());  // nothing went over to run

  json r = core.call({{"cmd", "restart"}, {"ids", {ids[0]}}});
  CHECK(r["error"]["code"] == "wrong_state");
  CHECK(r["error"]["message"].get<std::string>().find("cannot be restarted: its stored spec does not parse") !=
        std::string::npos);
  CHECK(core.state_of(ids[3]) == "running");
  r = core.call({{"cmd", "update"}, {"ids", {ids[3]}}, {"set", {{"retries", 5}}}});
  CHECK(r["error"]["code"] == "wrong_state");
  CHECK(r["error"]["message"].get<std::string>().find("cannot be updated: its stored spec does not parse") !=
        std::string::npos);
  // The running one ends as it ends, failed here, and is not retried (its unread spec had 3; the
  // default one it has now has none, and lifecycle refuses such a job a retry in any case).
  core.end(ids[3], json{{"ranks", {{{"rank", 0}, {"exit_code", 1}}}}});
  CHECK(core.state_of(ids[3]) == "failed");
  CHECK(cluster.handed.empty());
  // Nothing wrote over the specs it could not read.
  for (std::size_t i : {0, 3, 4}) CHECK(raw_spec(db, ids[i]) == later);
}

TEST_CASE("a restart resumed at start leaves a job whose stored spec does not parse as it ended, and requeues the rest") {
  gpuq::testing::TempDir state("gpuq-unit-handlers-resume");
  const std::string db = state.path + "/state.db";
  std::vector<std::int64_t> ids;
  {
    Core first("fake:2:16000", {}, {}, db);
    ids = first.submit(json::array({job("a"), job("b"), job("c")}));
    first.ok({{"cmd", "wait"}, {"ids", ids}});  // each fails: /bin/false is its supervisor
  }
  {  // A restart of the three cut short after its first part, as gpuqd's death leaves it.
    auto store = Store::open(db);
    REQUIRE(store);
    Store::RestartPlan plan;
    plan.jobs = {{ids[0], 0}, {ids[1], 0}, {ids[2], 0}};
    const JobRecord requeued = next_record(*(*store)->get(ids[0]), event::Restarted{});
    (*store)->write_restart_part(plan, {&requeued}, {"restarted"}, 1);
    REQUIRE((*store)->unfinished_restarts().size() == 1);
  }
  raw_exec(db, "UPDATE jobs SET spec='{\"name\":\"b\",\"command\":[\"true\"],\"gang_timeout_s\":30}' WHERE id=" +
                   std::to_string(ids[1]));
  {
    Core core("fake:2:16000", {}, {}, db);
    json waited = core.ok({{"cmd", "wait"}, {"ids", {ids[0], ids[2]}}});
    for (const auto& j : waited["jobs"]) CHECK(j["attempt"] == 2);  // restarted, and ran again
    json b = core.ok({{"cmd", "show"}, {"id", ids[1]}});
    CHECK(b["job"]["state"] == "failed");  // as it ended: it has nothing to run
    CHECK(b["job"]["attempt"] == 1);
    CHECK(b["job"]["restarts"] == 0);
  }
  auto store = Store::open(db);
  REQUIRE(store);
  CHECK((*store)->unfinished_restarts().empty());  // finished, not retried forever
}

TEST_CASE("a batch's first attempts go over as one array holding its limit; a retry goes alone below the limit") {
  FakeCluster cluster;
  ClusterCore core(cluster);
  json jobs = json::array();
  for (int i = 0; i < 4; ++i) jobs.push_back(job("sweep-" + std::to_string(i), {{"gpus", 1}, {"retries", 1}}));
  jobs.push_back(job("wide", {{"gpus", 2}}));  // options an array cannot share: alone, within the limit
  auto r = core.ok({{"cmd", "submit"}, {"jobs", jobs}, {"cwd", core.dir}, {"max_running", 2}});
  const auto ids = r["ids"].get<std::vector<std::int64_t>>();
  core.settle();
  REQUIRE(cluster.handed.size() == 1);
  CHECK(cluster.handed[0].ids == std::vector<std::int64_t>(ids.begin(), ids.begin() + 4));
  CHECK(cluster.handed[0].limit == 2);  // the array holds the whole limit: `wide` waits
  CHECK(core.state_of(ids[4]) == "queued");

  // A failed attempt with a retry left waits while four of the batch are in the cluster
  core.end(ids[0], {{"error", "lost"}});
  CHECK(core.state_of(ids[0]) == "queued");
  CHECK(cluster.handed.size() == 1);
  core.succeed(ids[1]);
  core.succeed(ids[2]);  // one left there: room for one
  REQUIRE(cluster.handed.size() == 2);
  CHECK(cluster.handed[1].ids == std::vector<std::int64_t>{ids[0]});  // the retry, alone (its key is first attempts')
  CHECK(cluster.handed[1].limit == 0);
  CHECK(std::count(cluster.offered_first.begin(), cluster.offered_first.end(), ids[0]) ==
        1);  // a retry may join no unit
  CHECK(core.state_of(ids[4]) == "queued");
  core.succeed(ids[3]);
  REQUIRE(cluster.handed.size() == 3);
  CHECK(cluster.handed[2].ids == std::vector<std::int64_t>{ids[4]});
}

TEST_CASE("after: a job goes over once its dependency has, naming it; one failing takes it back, for its retry or for good") {
  FakeCluster cluster;
  ClusterCore core(cluster);
  const auto ids = core.submit(json::array({job("flaky", {{"retries", 1}, {"gpus", 2}}),
                                            job("next", {{"after", {"flaky"}}, {"gpus", 2}}),
                                            job("broken", {{"gpus", 2}}),
                                            job("doomed", {{"after", {"broken"}}, {"gpus", 2}})}));
  const auto flaky = ids[0], next = ids[1], broken = ids[2], doomed = ids[3];
  core.settle();
  // Each dependent goes in the pass after its dependency got its id in the cluster
  REQUIRE(cluster.handed.size() == 4);
  std::map<std::int64_t, std::vector<std::int64_t>> after;
  for (const auto& h : cluster.handed) after[h.ids.at(0)] = h.after.at(0);
  CHECK(after[next] == std::vector<std::int64_t>{flaky});
  CHECK(after[doomed] == std::vector<std::int64_t>{broken});
  CHECK(core.state_of(next) == "running");  // handed over, waiting there

  core.end(flaky, {{"error", "lost"}});  // to be retried: `next` comes back, as the same attempt
  CHECK(cluster.withdrawn == std::vector<std::int64_t>{next});
  CHECK(core.state_of(flaky) == "running");  // its retry, handed over again ...
  CHECK(core.state_of(next) == "running");   // ... and `next` after it
  REQUIRE(cluster.handed.size() == 6);
  CHECK(cluster.handed[5].ids == std::vector<std::int64_t>{next});
  CHECK(cluster.handed[5].after[0] == std::vector<std::int64_t>{flaky});
  core.succeed(flaky);
  core.succeed(next);
  CHECK(core.state_of(next) == "succeeded");
  CHECK(core.show(next)["job"]["attempt"] == 1);

  core.end(broken, {{"error", "lost"}});  // for good: `doomed` comes back and fails without running
  CHECK(cluster.withdrawn.back() == doomed);
  json d = core.show(doomed)["job"];
  CHECK(d["state"] == "failed");
  CHECK(d["reason"].get<std::string>().find("dependency " + std::to_string(broken) + " ended failed") != std::string::npos);
  CHECK(d["attempt"] == 0);
  CHECK(cluster.live.empty());
}
TEST_CASE("lab mode: callers are told apart by uid; only a job's owner or an admin may change it or read its details") {
  Core core("fake:2:16000", {}, [](Config& c) { c.multi_user = true; });
  // uid 65534 is `nobody` on Debian and Ubuntu: an account every machine has.
  const Caller owner{65534, false}, other{65533, false}, admin{4242, true};
  CHECK(core.daemon->identify(65534)->admin == false);
  CHECK(core.daemon->identify(0)->admin == true);
  json hello = core.call({{"cmd", "hello"}, {"protocol_version", gpuq::common::k_protocol_version}}, owner);
  CHECK(hello["multi_user"] == true);
  CHECK(hello["user"] == "nobody");
  CHECK(hello["admin"] == false);

  json sub = core.call({{"cmd", "submit"}, {"jobs", job("mine", {{"cwd", "/"}})}, {"cwd", "/"}, {"hold", true}}, owner);
  INFO(sub.dump());
  REQUIRE(sub["ok"] == true);
  const std::int64_t id = sub["ids"][0];
  json st = core.call({{"cmd", "status"}}, other);
  REQUIRE(st["jobs"].size() == 1);
  CHECK(st["jobs"][0]["user"] == "nobody");  // everyone sees the queue, and whose each job is
  CHECK(st["jobs"][0]["uid"] == 65534);

  for (const json& request : {json{{"cmd", "cancel"}, {"ids", {id}}}, json{{"cmd", "release"}, {"ids", {id}}},
                              json{{"cmd", "update"}, {"ids", {id}}, {"set", {{"priority", 5}}}}, json{{"cmd", "show"}, {"id", id}},
                              json{{"cmd", "events"}, {"id", id}}, json{{"cmd", "results"}, {"ids", {id}}}}) {
    CAPTURE(request.dump());
    json r = core.call(request, other);
    REQUIRE(r["ok"] == false);
    CHECK(r["error"]["code"] == "forbidden");
    const std::string message = r["error"]["message"];
    CHECK(message.find("belongs to nobody; only nobody or an admin may") != std::string::npos);
  }
  CHECK(core.call({{"cmd", "show"}, {"id", id}}, owner)["ok"] == true);
  for (const json& request : {json{{"cmd", "drain"}, {"gpus", {0}}}, json{{"cmd", "shutdown"}}}) {
    json r = core.call(request, owner);
    CHECK(r["error"]["code"] == "forbidden");
    CHECK(r["error"]["message"].get<std::string>().find("only an admin may") != std::string::npos);
  }
  CHECK(core.call({{"cmd", "update"}, {"ids", {id}}, {"set", {{"priority", 5}}}}, owner)["ok"] == true);
  CHECK(core.call({{"cmd", "cancel"}, {"ids", {id}}}, admin)["ok"] == true);
  CHECK(core.state_of(id) == "cancelled");
  // clean with nothing named takes only the caller's own ended jobs
  json cleaned = core.call({{"cmd", "clean"}, {"ended_before", 4e9}, {"forget", true}}, other);
  REQUIRE(cleaned["ok"] == true);
  CHECK(cleaned["forgotten"].empty());
  cleaned = core.call({{"cmd", "clean"}, {"ended_before", 4e9}, {"forget", true}}, owner);
  CHECK(cleaned["forgotten"] == json::array({id}));
}

TEST_CASE("single-user mode serves only gpuqd's own user and root, each as an admin") {
  Core core;
  CHECK(core.daemon->identify(::getuid())->admin);
  CHECK(core.daemon->identify(0)->admin);
  if (::getuid() != 65534) {
    auto refused = core.daemon->identify(65534);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == gpuq::ErrorCode::forbidden);
    CHECK(refused.error().message.find("gpuqd --multi-user") != std::string::npos);
  }
}

TEST_SUITE_END();
