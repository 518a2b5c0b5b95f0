// The state store: round trips, transitions, event offsets, and refusing files that are not ours.
#include <doctest/doctest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "daemon/store.hpp"

using namespace gpuq::daemon;

namespace {
struct TempDb {
  std::string path = "/tmp/gpuq-unit-store-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".db";
  ~TempDb() {
    for (auto suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  }
  static inline int counter = 0;
};

// Runs `sql` on the database file directly, as another program (or an older gpuq) would.
void raw_exec(const std::string& path, const char* sql) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &raw) == SQLITE_OK);
  CHECK(sqlite3_exec(raw, sql, nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(raw);
}

JobRecord job_named(const std::string& name) {
  JobRecord j;
  j.spec.name = name;
  j.spec.command = {"true"};
  j.spec.cwd = "/";
  return j;
}
}  // namespace

TEST_SUITE_BEGIN("store");

TEST_CASE("a batch is stored with ids, resolved dependencies and a first transition") {
  TempDb db;
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  std::vector<JobRecord> jobs{job_named("a"), job_named("b")};
  jobs[1].spec.after = {{"a", 0}, {"", 99}};
  auto batch = (*store)->insert_batch(jobs, {{}, {0}}, "/home", {{"PATH", "/bin"}}, 10.0);
  CHECK(batch == 1);
  CHECK(jobs[0].id == 1);
  CHECK(jobs[1].after == std::vector<std::int64_t>{1, 99});
  auto b = (*store)->get(2);
  REQUIRE(b.has_value());
  CHECK(b->spec.name == "b");
  CHECK(b->after == std::vector<std::int64_t>{1, 99});
  CHECK(b->state == gpuq::JobState::queued);
  CHECK((*store)->history(2).size() == 1);
  CHECK((*store)->batch_env(1)["PATH"] == "/bin");
  CHECK((*store)->count_jobs() == 2);
  CHECK((*store)->batch_limits().empty());
  std::vector<JobRecord> more{job_named("c")};
  CHECK((*store)->insert_batch(more, {{}}, "/", json::object(), 11.0, 4) == 2);
  CHECK((*store)->batch_limits() == std::map<std::int64_t, int>{{2, 4}});
}

TEST_CASE("hooks due with a job's end are found until started, then never again, and a restart forgets started ones") {
  TempDb db;
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  std::vector<JobRecord> jobs{job_named("a"), job_named("b")};
  (*store)->insert_batch(jobs, {{}, {}}, "/", {}, 1.0);
  for (auto& j : jobs) {
    j.state = gpuq::JobState::succeeded;
    j.hook_due = j.id == 1;  // only a's ending has hooks
  }
  (*store)->update_many({&jobs[0], &jobs[1]});
  using Due = std::vector<DueHook>;
  const DueHook a_ended{1, HookEvent::finish, {}}, b_ended{2, HookEvent::finish, {}},
      b_preempted{2, HookEvent::preempt, "job 9"};
  CHECK((*store)->due_hooks() == Due{a_ended});
  (*store)->hooks_started(a_ended);
  CHECK((*store)->due_hooks().empty());
  jobs[1].preempt_hook_due = true;  // b preempted (twice, by job 9), then ended: each event's hooks, once each
  jobs[1].run.preempted_by = "job 8";
  (*store)->update_many({&jobs[1]});
  jobs[1].run.preempted_by = "job 9";  // the last preemption's word is the hook's
  (*store)->update_many({&jobs[1]});
  jobs[1].run.preempted_by = "";  // it started again: who preempted it is the due hook's to say
  jobs[1].preempt_hook_due = false;
  jobs[1].hook_due = true;
  (*store)->update_many({&jobs[1]});
  CHECK((*store)->due_hooks() == Due{b_ended, b_preempted});
  store->reset();
  store = Store::open(db.path);
  REQUIRE(store.ok());
  (*store)->forget_started_hooks();
  CHECK((*store)->due_hooks() == Due{b_ended, b_preempted});  // 1 was started: it runs on, or ran
  // Preempted again while its on_preempt hook runs: due again once that one is done.
  (*store)->hooks_started(b_preempted);
  CHECK((*store)->due_hooks() == Due{b_ended});
  jobs[1].hook_due = false;
  jobs[1].preempt_hook_due = true;
  jobs[1].run.preempted_by = "job 9";
  (*store)->update_many({&jobs[1]});
  (*store)->hooks_done(b_preempted);
  CHECK((*store)->due_hooks() == Due{b_ended, b_preempted});
  (*store)->hooks_started(b_preempted);
  (*store)->hooks_done(b_preempted);
  CHECK((*store)->due_hooks() == Due{b_ended});
  (*store)->hooks_started(b_ended);
  (*store)->hooks_done(b_ended);
  CHECK((*store)->due_hooks().empty());
  jobs[1].preempt_hook_due = false;
  jobs[1].hook_due = true;
  (*store)->update_many({&jobs[1]});  // a due hook of a job later forgotten is not run
  (*store)->remove_jobs({2});
  CHECK((*store)->due_hooks().empty());
}

TEST_CASE("a result nested without limit by an older gpuq reads back as a note, not a deep value") {
  TempDb db;
  std::int64_t id = 0;
  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    std::vector<JobRecord> jobs{job_named("deep")};
    (*store)->insert_batch(jobs, {{}}, "/", json::object(), 1.0);
    id = jobs[0].id;
  }
  const std::string deep = std::string(50000, '[') + std::string(50000, ']');
  raw_exec(db.path, ("UPDATE jobs SET result='{\"x\": " + deep + "}', progress='{\"step\": 3}'").c_str());
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  auto job = (*store)->get(id);
  REQUIRE(job);
  CHECK(job->run.result == "(dropped: nested deeper than 64 levels)");
  CHECK(job->run.progress == json{{"step", 3}});
}

TEST_CASE("updates persist across reopening, and only active jobs load as active") {
  TempDb db;
  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    std::vector<JobRecord> jobs{job_named("a"), job_named("b"), job_named("c")};
    (*store)->insert_batch(jobs, {{}, {}, {}}, "/", json::object(), 1.0);
    jobs[0].state = gpuq::JobState::running;
    jobs[0].attempt = 1;
    jobs[0].run.gpus = {2};
    jobs[0].run.cpu_slots = {4, 5};
    jobs[0].run.cores = {8, 9};
    jobs[0].run.started_at = 2.0;
    jobs[0].run.requeue_requested = true;  // asked to go back in line (gpuq requeue): kept, not a cancel
    jobs[0].suspensions = 2;               // frozen for job 12's attempt 1 (a suspension): kept, all of it
    jobs[0].run.suspended_for = 12;
    jobs[0].run.suspended_for_attempt = 1;
    jobs[0].run.suspended_by = "job 12 (urgent)";
    jobs[0].run.suspended_at = 2.5;
    jobs[0].run.suspended_s = 7.0;
    jobs[0].run.resumed_at = 2.25;
    (*store)->update(jobs[0], true);
    jobs[1].state = gpuq::JobState::failed;
    jobs[1].run.exit_signal = 9;
    jobs[1].run.ended_at = 3.0;
    jobs[1].reason = "rank 0 was killed by signal 9";
    jobs[1].run.external_id = "slurm:4242";
    (*store)->update(jobs[1], true);
    jobs[2].state = gpuq::JobState::running;
    jobs[2].attempt = 3;
    jobs[2].preemptions = 1;
    jobs[2].run.preempt_requested = true;  // asked to stop for a preemption: kept, by whom and when
    jobs[2].run.preempted_by = "job 9 (urgent)";
    jobs[2].run.preempted_at = 4.5;
    jobs[2].run.checkpoint_at = 4.0;
    (*store)->update(jobs[2], true);
  }
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  auto active = (*store)->load_active();
  REQUIRE(active.size() == 2);
  CHECK(active[1].run.preempt_requested);
  CHECK_FALSE(active[1].run.requeue_requested);
  CHECK(active[1].preemptions == 1);
  CHECK(active[1].run.preempted_by == "job 9 (urgent)");
  CHECK(active[1].run.preempted_at == 4.5);
  CHECK(active[1].run.checkpoint_at == 4.0);
  CHECK_FALSE(active[0].run.preempt_requested);
  CHECK(active[0].state == gpuq::JobState::running);
  CHECK(active[0].run.gpus == std::vector<int>{2});
  CHECK(active[0].run.cpu_slots == std::vector<int>{4, 5});
  CHECK(active[0].run.cores == std::vector<int>{8, 9});
  CHECK(active[0].run.requeue_requested);
  CHECK(active[0].suspensions == 2);
  CHECK(active[0].run.suspended_for == 12);
  CHECK(active[0].run.suspended_for_attempt == 1);
  CHECK(active[0].run.suspended_by == "job 12 (urgent)");
  CHECK(active[0].run.suspended_at == 2.5);
  CHECK(active[0].run.suspended_s == 7.0);
  CHECK(active[0].run.resumed_at == 2.25);
  CHECK(active[1].run.suspended_for == 0);
  CHECK_FALSE(active[0].run.cancel_requested);
  auto failed = (*store)->get(2);
  CHECK_FALSE(failed->run.requeue_requested);
  CHECK(failed->run.exit_signal == 9);
  CHECK_FALSE(failed->run.exit_code.has_value());
  CHECK(failed->reason == "rank 0 was killed by signal 9");
  CHECK(failed->run.external_id == "slurm:4242");
  CHECK(active[0].run.external_id.empty());
  auto h = (*store)->history(2);
  REQUIRE(h.size() == 2);
  CHECK(h[1].state == gpuq::JobState::failed);
  CHECK(h[1].at == 3.0);
  CHECK((*store)->recent_finished(10).size() == 1);
  auto first = (*store)->page_after(0, 2);
  REQUIRE(first.size() == 2);
  auto rest = (*store)->page_after(first.back().id, 2);
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].id > first[1].id);
  CHECK((*store)->page_after(rest[0].id, 2).empty());
}

TEST_CASE("a read parses the details only of the jobs whose owners it is told: others' stay unread") {
  TempDb db;
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  std::vector<JobRecord> jobs{job_named("alices"), job_named("bobs")};
  jobs[0].uid = 1001, jobs[1].uid = 1002;
  (*store)->insert_batch(jobs, {{}, {}}, "/", json::object(), 1.0);
  for (auto& j : jobs) {
    j.state = gpuq::JobState::succeeded;
    j.run.ended_at = 2.0;
    j.run.progress = json{{"epoch", 3}};
    j.run.result = json{{"accuracy", 0.9}};
    j.run.first_failure = json{{"rank", 0}};
    (*store)->update(j, true);
  }
  const Store::DetailsOf alices = [](uid_t owner) { return owner == 1001; };
  for (const auto& rows : {(*store)->recent_finished(10, {}, alices), (*store)->page_after(0, 10, {}, alices)}) {
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].run.result == json{{"accuracy", 0.9}});
    CHECK(rows[0].run.progress == json{{"epoch", 3}});
    CHECK(rows[1].uid == 1002);  // what is not a detail is read for everyone
    CHECK(rows[1].state == gpuq::JobState::succeeded);
    CHECK(rows[1].run.result.is_null());
    CHECK(rows[1].run.progress.is_null());
    CHECK(rows[1].run.first_failure.is_null());
  }
  CHECK((*store)->recent_finished(10)[1].run.result == json{{"accuracy", 0.9}});  // no predicate: all
}

TEST_CASE("the jobs that failed waiting for a job are found, and a restart is one transaction with its own reasons") {
  TempDb db;
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  std::vector<JobRecord> jobs{job_named("prep"), job_named("train"), job_named("eval"), job_named("other")};
  (*store)->insert_batch(jobs, {{}, {0}, {1}, {0}}, "/", json::object(), 1.0);
  jobs[0].state = gpuq::JobState::failed;
  jobs[0].run.ended_at = 2.0;
  jobs[0].attempt = 1;
  (*store)->update(jobs[0], true);
  for (int i : {1, 3}) {  // failed waiting for prep; "other" was cancelled instead
    jobs[i].state = i == 1 ? gpuq::JobState::failed : gpuq::JobState::cancelled;
    jobs[i].run.ended_at = 3.0;
    jobs[i].blocked_by = jobs[0].id;
    jobs[i].reason = "dependency " + std::to_string(jobs[0].id) + " ended failed";
    (*store)->update(jobs[i], true);
  }
  auto waiting = (*store)->failed_waiting_for(jobs[0].id);
  REQUIRE(waiting.size() == 1);
  CHECK(waiting[0].spec.name == "train");
  CHECK(waiting[0].blocked_by == jobs[0].id);
  CHECK((*store)->failed_waiting_for(jobs[1].id).empty());

  for (int i : {0, 1}) {
    jobs[i].state = gpuq::JobState::queued;
    jobs[i].run.ended_at = 0;
    jobs[i].blocked_by = 0;
    jobs[i].reason.clear();
  }
  (*store)->update_many({&jobs[0], &jobs[1]}, {"restarted (it had ended failed)", "restarted with job 1"});
  CHECK((*store)->failed_waiting_for(jobs[0].id).empty());
  CHECK((*store)->load_active().size() == 3);  // prep, train and eval (never ended)
  CHECK((*store)->get(jobs[1].id)->reason.empty());
  auto h = (*store)->history(jobs[1].id);
  REQUIRE(h.size() == 3);
  CHECK(h[2].state == gpuq::JobState::queued);
  CHECK(h[2].reason == "restarted with job 1");
  CHECK(h[2].at > 3.0);  // when it happened, not the cleared end time
}

TEST_CASE("events and their file offset are stored together") {
  TempDb db;
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  std::vector<JobRecord> jobs{job_named("a")};
  (*store)->insert_batch(jobs, {{}}, "/", json::object(), 1.0);
  jobs[0].attempt = 1;
  jobs[0].run.result = {{"acc", 0.9}};
  (*store)->add_events(jobs[0], 1, 120, {{0, 1, "result", 5.0, {{"acc", 0.9}}}});
  CHECK((*store)->event_offset(1, 1, 1) == 120);
  CHECK((*store)->event_offset(1, 1, 0) == 0);
  CHECK((*store)->events(1, 1).size() == 1);
  CHECK((*store)->get(1)->run.result["acc"] == 0.9);
}

TEST_CASE("removed jobs leave no rows, their emptied batch goes with them, and no id is handed out again") {
  TempDb db;
  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    CHECK((*store)->count_jobs() == 0);  // counted now, and kept from here by the writes
    std::vector<JobRecord> first{job_named("a"), job_named("b")}, second{job_named("c")};
    const auto b1 = (*store)->insert_batch(first, {{}, {}}, "/", json::object(), 1.0);
    const auto b2 = (*store)->insert_batch(second, {{}}, "/", json::object(), 1.0, 3);
    for (auto* j : {&first[0], &first[1], &second[0]}) {
      j->state = gpuq::JobState::succeeded;
      j->attempt = 1;
      j->run.ended_at = 2.0;
      (*store)->update(*j, true);
      (*store)->add_events(*j, 0, 64, {{0, 0, "result", 2.0, {{"acc", 0.5}}}});
    }
    // b (the first batch's last job) and c (the highest job and batch ids) go; a keeps batch 1.
    CHECK((*store)->remove_jobs({first[1].id, second[0].id, 999}) == std::vector<std::int64_t>{b2});
    CHECK_FALSE((*store)->get(first[1].id));
    CHECK((*store)->history(second[0].id).empty());
    CHECK((*store)->events(second[0].id, 1).empty());
    CHECK((*store)->event_offset(second[0].id, 1, 0) == 0);
    CHECK((*store)->batch_limits().empty());  // c's batch, with its limit, is gone
    CHECK((*store)->count_jobs() == 1);
    CHECK((*store)->events(first[0].id, 1).size() == 1);  // a is untouched
    CHECK((*store)->history(first[0].id).size() == 2);
    CHECK((*store)->was_removed(second[0].id));
    CHECK((*store)->was_removed(b2, true));
    CHECK_FALSE((*store)->was_removed(first[0].id));  // still there
    CHECK_FALSE((*store)->was_removed(b1, true));
    CHECK_FALSE((*store)->was_removed(4));  // never existed
    CHECK_FALSE((*store)->was_removed(3, true));
  }
  auto store = Store::open(db.path);  // the high-water marks are durable
  REQUIRE(store.ok());
  std::vector<JobRecord> next{job_named("d")};
  const auto b3 = (*store)->insert_batch(next, {{}}, "/", json::object(), 5.0);
  CHECK(b3 == 3);
  CHECK(next[0].id == 4);
  CHECK((*store)->get(4)->spec.name == "d");
  CHECK((*store)->was_removed(3));
  CHECK((*store)->count_jobs() == 2);
  CHECK((*store)->remove_jobs({next[0].id}) == std::vector<std::int64_t>{b3});
  CHECK((*store)->count_jobs() == 1);
  std::vector<JobRecord> last{job_named("e"), job_named("f")};
  (*store)->insert_batch(last, {{}, {0}}, "/", json::object(), 6.0);
  CHECK((*store)->count_jobs() == 3);
  // The kept count is what a scan of the table finds (a filter that every job passes scans).
  CHECK((*store)->count_jobs({0, {gpuq::JobState::queued, gpuq::JobState::succeeded}, ""}) == 3);
  CHECK(last[0].id == 5);
  CHECK(last[1].after == std::vector<std::int64_t>{5});
}

TEST_CASE("events page by seq, filter by type and stay within their attempt") {
  TempDb db;
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  std::vector<JobRecord> jobs{job_named("a")};
  (*store)->insert_batch(jobs, {{}}, "/", json::object(), 1.0);
  jobs[0].attempt = 1;
  std::vector<EventRow> rows;
  for (int i = 0; i < 5; ++i) rows.push_back({0, 0, "progress", 1.0 + i, {{"step", i}}});
  rows.push_back({0, 0, "result", 9.0, {{"acc", 0.5}}});
  (*store)->add_events(jobs[0], 0, 10, rows);
  jobs[0].attempt = 2;
  (*store)->add_events(jobs[0], 0, 10, {{0, 0, "progress", 20.0, {{"step", 99}}}});

  auto first = (*store)->events(1, 1, 0, 2, "progress");
  REQUIRE(first.size() == 2);
  CHECK(first[0].data["step"] == 0);
  CHECK(first[1].seq > first[0].seq);
  auto rest = (*store)->events(1, 1, first[1].seq, 100, "progress");
  REQUIRE(rest.size() == 3);
  CHECK(rest[0].data["step"] == 2);
  CHECK(rest[2].data["step"] == 4);
  CHECK((*store)->events(1, 1, 0, 100, "result").size() == 1);
  CHECK((*store)->events(1, 1).size() == 6);
  auto second = (*store)->events(1, 2);
  REQUIRE(second.size() == 1);
  CHECK(second[0].data["step"] == 99);
}

TEST_CASE("a file that is not a database is refused, not overwritten") {
  TempDb db;
  { std::ofstream(db.path) << "precious notes, not a database\n"; }
  auto store = Store::open(db.path);
  REQUIRE_FALSE(store.ok());
  CHECK(store.error().message.find("not a readable SQLite database") != std::string::npos);
  std::ifstream in(db.path);
  std::string first;
  std::getline(in, first);
  CHECK(first == "precious notes, not a database");
}

TEST_CASE("another program's SQLite database is refused") {
  TempDb db;
  raw_exec(db.path, "CREATE TABLE mine(x)");
  auto store = Store::open(db.path);
  REQUIRE_FALSE(store.ok());
  CHECK(store.error().message.find("gpuq did not create") != std::string::npos);
}

namespace {
int user_version(const std::string& path) {
  sqlite3* raw = nullptr;
  sqlite3_stmt* st = nullptr;
  int v = -1;
  if (sqlite3_open(path.c_str(), &raw) == SQLITE_OK &&
      sqlite3_prepare_v2(raw, "PRAGMA user_version", -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return v;
}
}  // namespace

TEST_CASE("a version 15 store's due on_finish hooks are kept as due on_finish hooks") {
  TempDb db;
  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    std::vector<JobRecord> jobs{job_named("a"), job_named("b")};
    (*store)->insert_batch(jobs, {{}, {}}, "/", {}, 1.0);
  }
  // The table as versions 13 to 15 had it: one row a job, its on_finish hooks'.
  raw_exec(db.path,
           "DROP TABLE hook_runs; CREATE TABLE hooks(job_id INTEGER PRIMARY KEY, started INTEGER NOT NULL "
           "DEFAULT 0); INSERT INTO hooks VALUES(1, 0), (2, 1); ALTER TABLE jobs DROP COLUMN gpu_budget; "
           "PRAGMA user_version=15;");
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  CHECK(user_version(db.path) == 17);
  CHECK((*store)->due_hooks() == std::vector<DueHook>{{1, HookEvent::finish, {}}});
  (*store)->forget_started_hooks();  // 2's had started: it is not run again
  CHECK((*store)->due_hooks() == std::vector<DueHook>{{1, HookEvent::finish, {}}});
  store->reset();
  // A store whose migrations from an older version stopped at 13 (a crash between steps): the
  // table 13 would have made is missing, and the store opens all the same.
  raw_exec(db.path,
           "DROP TABLE hook_runs; ALTER TABLE jobs DROP COLUMN first_bad_event; "
           "ALTER TABLE jobs DROP COLUMN preemption; ALTER TABLE jobs DROP COLUMN gpu_budget; PRAGMA user_version=13;");
  auto again = Store::open(db.path);
  REQUIRE(again.ok());
  CHECK(user_version(db.path) == 17);
  CHECK((*again)->due_hooks().empty());
}

TEST_CASE("a version 1 state store (before CPU slots had numbers, cores were kept, jobs restarted, batches limited or jobs removed) is migrated in place, its jobs kept") {
  TempDb db;
  // The tables as schema version 1 made them, with a running job.
  raw_exec(db.path, R"sql(
    PRAGMA application_id=1735423345; PRAGMA user_version=1;
    CREATE TABLE batches(id INTEGER PRIMARY KEY, submitted_at REAL NOT NULL, cwd TEXT NOT NULL, env TEXT NOT NULL);
    INSERT INTO batches VALUES(1, 1.0, '/', '{}');
    CREATE TABLE jobs(
      id INTEGER PRIMARY KEY, batch INTEGER NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
      state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '',
      submitted_at REAL NOT NULL, started_at REAL NOT NULL DEFAULT 0, ended_at REAL NOT NULL DEFAULT 0,
      exit_code INTEGER, exit_signal INTEGER, gpus TEXT NOT NULL DEFAULT '[]',
      master_port INTEGER NOT NULL DEFAULT 0, not_before REAL NOT NULL DEFAULT 0,
      cancel_requested INTEGER NOT NULL DEFAULT 0, progress TEXT, result TEXT,
      after TEXT NOT NULL DEFAULT '[]', bad_event_lines INTEGER NOT NULL DEFAULT 0, first_failure TEXT);
    INSERT INTO jobs(id, batch, name, spec, state, attempt, submitted_at, started_at, gpus)
      VALUES(7, 1, 'old', '{"name": "old", "command": ["true"], "cwd": "/", "labels": {"lr": "0.3"}}', 'running', 1, 1.0, 2.0, '[1]');
  )sql");

  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    auto active = (*store)->load_active();
    REQUIRE(active.size() == 1);
    CHECK(active[0].spec.name == "old");
    CHECK(active[0].run.gpus == std::vector<int>{1});
    CHECK(active[0].run.cpu_slots.empty());
    CHECK(active[0].run.cores.empty());
    CHECK(active[0].attempt_base == 0);
    CHECK(active[0].restarts == 0);
    CHECK(active[0].blocked_by == 0);
    CHECK_FALSE(active[0].held);
    CHECK(active[0].uid == ::getuid());  // jobs from before owners were kept are gpuqd's user's
    CHECK(active[0].spec.labels.at("lr") == "0.3");  // labels were text then, and stay so
    CHECK(active[0].first_bad_event.empty());
    CHECK(active[0].preemptions == 0);
    CHECK(active[0].run.preempted_by.empty());
    active[0].first_bad_event = "rank 0, line 3: not JSON";
    active[0].preemptions = 2;
    active[0].run.preempted_by = "job 9 (urgent)";
    active[0].run.preempted_at = 123.5;
    active[0].run.cpu_slots = {3};
    active[0].run.cores = {6, 7};
    active[0].attempt_base = 1;
    active[0].restarts = 1;
    active[0].held = true;
    CHECK(active[0].gpu_budget == JobRecord::GpuBudget{});  // the column a version 17 store added
    active[0].gpu_budget = {30000, "raised from 20000 MiB after CUDA ran out of memory", 1, 140.5, 26000};
    active[0].run.over_budget = "over its budget";
    (*store)->update(active[0], false);
  }
  CHECK(user_version(db.path) == 17);
  auto again = Store::open(db.path);  // opening a migrated store changes nothing
  CHECK((*again)->get(7)->run.external_id.empty());  // the column a version 11 store added
  REQUIRE(again.ok());
  CHECK((*again)->get(7)->run.cpu_slots == std::vector<int>{3});
  CHECK((*again)->get(7)->run.cores == std::vector<int>{6, 7});
  CHECK((*again)->get(7)->gpu_budget ==
        JobRecord::GpuBudget{30000, "raised from 20000 MiB after CUDA ran out of memory", 1, 140.5, 26000});
  CHECK((*again)->get(7)->run.over_budget == "over its budget");
  CHECK((*again)->get(7)->attempt_base == 1);
  CHECK((*again)->get(7)->restarts == 1);
  CHECK((*again)->get(7)->first_bad_event == "rank 0, line 3: not JSON");
  CHECK((*again)->get(7)->preemptions == 2);  // the column a version 15 store added
  CHECK((*again)->get(7)->run.preempted_by == "job 9 (urgent)");
  CHECK((*again)->get(7)->run.preempted_at == 123.5);
  CHECK((*again)->get(7)->held);
  CHECK((*again)->drained_gpus().empty());  // the table a version 6 store added
  (*again)->set_drained("GPU-a", true, "ECC errors");
  (*again)->set_drained("GPU-b", true, "");
  (*again)->set_drained("GPU-b", false, "");
  CHECK((*again)->drained_gpus() == std::map<std::string, std::string>{{"GPU-a", "ECC errors"}});
  CHECK((*again)->batch_limits().empty());  // the column a version 7 store added, 0 for old batches
  (*again)->set_batch_limit(1, 3);
  CHECK((*again)->batch_limits() == std::map<std::int64_t, int>{{1, 3}});
  (*again)->set_batch_limit(1, 0);
  CHECK((*again)->batch_limits().empty());
  // Version 8 keeps removed ids from being handed out again; an old store has none removed.
  CHECK_FALSE((*again)->was_removed(6));
  (*again)->remove_jobs({7});
  CHECK((*again)->was_removed(7));
  std::vector<JobRecord> fresh{job_named("new")};
  CHECK((*again)->insert_batch(fresh, {{}}, "/", json::object(), 9.0) == 2);
  CHECK(fresh[0].id == 8);
}

namespace {
std::vector<JobRecord> chain_of(int n) {  // job i waits for job i-1 of its batch
  std::vector<JobRecord> jobs;
  for (int i = 0; i < n; ++i) jobs.push_back(job_named("j" + std::to_string(i)));
  return jobs;
}
std::vector<std::vector<std::size_t>> chain_deps(int n) {
  std::vector<std::vector<std::size_t>> deps(n);
  for (int i = 1; i < n; ++i) deps[i] = {static_cast<std::size_t>(i - 1)};
  return deps;
}
constexpr auto k_at_once = std::chrono::steady_clock::time_point::min();  // parts of 64 jobs
}  // namespace

TEST_CASE("a batch written in parts is seen by no read until its last part commits") {
  TempDb db;
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  auto& s = **store;
  std::vector<JobRecord> before{job_named("done")};
  s.insert_batch(before, {{}}, "/", json::object(), 1.0);
  auto jobs = chain_of(200);
  const auto deps = chain_deps(200);
  Store::BatchWrite w;
  CHECK_FALSE(s.insert_batch_part(w, jobs, deps, "/", json::object(), 2.0, 0, k_at_once));
  CHECK(w.batch == 2);
  CHECK(w.written == 64);
  CHECK(jobs[0].id == 2);
  CHECK(jobs[199].id == 201);  // every id is given with the first part
  CHECK(jobs[63].after == std::vector<std::int64_t>{jobs[62].id});
  for (std::int64_t id : {2, 65, 66, 201}) {
    CHECK_FALSE(s.get(id).has_value());
    CHECK_FALSE(s.exists(id));
    CHECK_FALSE(s.state_of(id).has_value());
  }
  CHECK(s.batch_jobs(2).empty());
  CHECK(s.batch_page(2, 0, 10).empty());
  CHECK(s.count_jobs() == 1);
  CHECK(s.count_jobs({0, {gpuq::JobState::queued}, ""}) == 1);  // "done" alone
  CHECK(s.page_after(0, 1000).size() == 1);
  CHECK(s.insert_batch_part(w, jobs, deps, "/", json::object(), 2.0, 0, std::chrono::steady_clock::time_point::max()));
  CHECK(w.written == 200);
  CHECK(s.get(201)->after == std::vector<std::int64_t>{200});
  CHECK(s.batch_jobs(2).size() == 200);
  CHECK(s.count_jobs() == 201);
  CHECK(s.page_after(0, 1000).size() == 201);
}

TEST_CASE("a batch whose writing was cut short (a failed part, a crash) leaves nothing, and its ids are given again") {
  TempDb db;
  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    auto jobs = chain_of(150);
    Store::BatchWrite w;
    CHECK_FALSE((*store)->insert_batch_part(w, jobs, chain_deps(150), "/", json::object(), 2.0, 0, k_at_once));
    // gpuqd dies here: the store is closed with the batch unfinished.
  }
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  auto& s = **store;
  CHECK(s.count_jobs() == 0);
  CHECK(s.page_after(0, 1000).empty());
  CHECK(s.history(1).empty());
  CHECK_FALSE(s.was_removed(1));  // never acknowledged: not "forgotten"

  auto jobs = chain_of(150);
  Store::BatchWrite w;
  CHECK_FALSE(s.insert_batch_part(w, jobs, chain_deps(150), "/", json::object(), 3.0, 0, k_at_once));
  CHECK(jobs[0].id == 1);
  s.discard_batch();  // as after a part that failed
  CHECK(s.count_jobs() == 0);
  CHECK(s.history(1).empty());
  std::vector<JobRecord> next{job_named("next")};
  CHECK(s.insert_batch(next, {{}}, "/", json::object(), 4.0) == 1);
  CHECK(next[0].id == 1);
  CHECK(s.count_jobs() == 1);
}

TEST_CASE("a restart of several parts stores its plan with its first part, its progress with each, and is gone after its last") {
  TempDb db;
  std::vector<JobRecord> jobs = chain_of(5);
  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    auto& s = **store;
    s.insert_batch(jobs, chain_deps(5), "/", json::object(), 1.0);
    Store::RestartPlan one;  // a restart of one part stores no plan
    one.jobs = {{jobs[0].id, 0}};
    jobs[0].state = gpuq::JobState::queued;
    s.write_restart_part(one, {&jobs[0]}, {"restarted (it had ended failed)"}, 1);
    CHECK(one.done == 1);
    CHECK(s.unfinished_restarts().empty());

    Store::RestartPlan plan;
    for (int i = 1; i < 5; ++i) plan.jobs.emplace_back(jobs[i].id, jobs[i - 1].id);
    for (int i = 1; i < 5; ++i) jobs[i].reason = "requeued " + std::to_string(i);
    s.write_restart_part(plan, {&jobs[1], &jobs[2]}, {"restarted with job 1", "restarted with job 2"}, 2);
    CHECK(plan.id != 0);
    CHECK(plan.done == 2);
    // gpuqd dies here: the plan says how far it got.
  }
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  auto& s = **store;
  auto left = s.unfinished_restarts();
  REQUIRE(left.size() == 1);
  auto plan = left[0];
  CHECK(plan.done == 2);
  CHECK(plan.jobs == std::vector<std::pair<std::int64_t, std::int64_t>>{{2, 1}, {3, 2}, {4, 3}, {5, 4}});
  CHECK(s.get(2)->reason == "requeued 1");
  CHECK(s.history(2).back().reason == "restarted with job 1");
  CHECK(s.get(4)->reason.empty());  // not yet written
  s.write_restart_part(plan, {&jobs[3]}, {"restarted with job 3"}, 1);
  CHECK(s.unfinished_restarts().at(0).done == 3);
  s.write_restart_part(plan, {}, {}, 1);  // a part whose one job is gone: the plan still moves on
  CHECK(plan.id == 0);
  CHECK(plan.done == 4);
  CHECK(s.unfinished_restarts().empty());
  CHECK(s.get(4)->reason == "requeued 3");
}

TEST_CASE("a state store from a newer gpuq is refused, not downgraded") {
  TempDb db;
  REQUIRE(Store::open(db.path).ok());
  raw_exec(db.path, "PRAGMA user_version=99");
  auto store = Store::open(db.path);
  REQUIRE_FALSE(store.ok());
  CHECK(store.error().message.find("schema version 99, newer than this gpuqd's 17") != std::string::npos);
  CHECK(user_version(db.path) == 99);
}

TEST_CASE("a stored spec that does not parse reads back as a default spec that says why, its name and ranks kept, its text untouched") {
  TempDb db;
  {
    auto store = Store::open(db.path);
    REQUIRE(store.ok());
    std::vector<JobRecord> jobs{job_named("later"), job_named("damaged"), job_named("fine"), job_named("odd")};
    (*store)->insert_batch(jobs, {{}, {}, {}, {}}, "/", {}, 1.0);
  }
  // A spec as a later gpuq writes it (a field this one does not know), and one that is not JSON.
  raw_exec(db.path, R"(UPDATE jobs SET spec='{"name":"later","command":["true"],"mode":"ddp","gpus":4,"ranks":4,"nodes":2,"cpus":3,"gang_timeout_s":30}' WHERE id=1;
                       UPDATE jobs SET spec='{"name":' WHERE id=2;
                       UPDATE jobs SET spec='{"name":"a\u001b[2Jname","ranks":"many","x":1}' WHERE id=4;)");
  auto store = Store::open(db.path);
  REQUIRE(store.ok());
  auto later = (*store)->get(1);
  REQUIRE(later.has_value());
  CHECK(later->spec_error.find("gang_timeout_s") != std::string::npos);
  CHECK(later->spec.name == "later");
  CHECK(later->spec.ranks == 4);  // what adopting it and reading its end need: its layout
  CHECK(later->spec.mode == gpuq::common::Mode::ddp);
  CHECK(later->spec.gpus == 4);
  CHECK(later->spec.nodes == 2);
  CHECK(later->spec.cpus == 3);
  CHECK(later->spec.command.empty());  // nothing to run: what lifecycle.cpp refuses to launch
  auto damaged = (*store)->get(2);
  REQUIRE(damaged.has_value());
  CHECK(damaged->spec_error == "not JSON");
  CHECK(damaged->spec.name.empty());
  CHECK((*store)->get(3)->spec_error.empty());
  auto odd = (*store)->get(4);  // a name no spec allows (an escape sequence), a bad type: neither kept
  REQUIRE(odd.has_value());
  CHECK_FALSE(odd->spec_error.empty());
  CHECK(odd->spec.name.empty());
  CHECK(odd->spec.ranks == 1);
  CHECK((*store)->load_active().size() == 4);  // each still loads, to be failed, not dropped
  // Its end is stored; the spec it could not read is not written over.
  JobRecord ended = *later;
  ended.state = gpuq::JobState::failed;
  (*store)->update(ended, true);
  auto again = (*store)->get(1);
  REQUIRE(again.has_value());
  CHECK(again->state == gpuq::JobState::failed);
  CHECK(again->spec_error == later->spec_error);
}

TEST_SUITE_END();
