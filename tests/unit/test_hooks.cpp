// Hooks (daemon/hooks.hpp) alone: a store in memory with ended jobs whose hooks are due,
// and supervisors of the test's own (children that wait on a pipe the test closes), so the test
// says when each hook ends. What is checked: at most max_hooks run at once, the next starts when
// one ends, a job whose hooks still run keeps its place, and what a hook is handed.
#include <doctest/doctest.h>

#include <stdlib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "daemon/hooks.hpp"
#include "tests/unit/memory_store.hpp"
#include "tests/unit/temp_dir.hpp"

using namespace gpuq::daemon;
using nlohmann::json;

namespace {

struct Bench {
  gpuq::testing::TempDir temp{"gpuq-unit-hooks"};  // removed with all in it, after the rest is gone
  const std::string dir = temp.path;
  boost::asio::io_context io;
  std::unique_ptr<Store> store;
  Users users{Users::Rules{}};
  std::map<std::string, int> release;  // a hook's dir -> the pipe its child waits on
  std::map<std::string, int> pids;     // a hook's dir -> its child
  std::vector<std::string> spawned;    // hook dirs, in the order they started

  explicit Bench(int jobs) {
    store = gpuq::testing::memory_store();
    std::vector<JobRecord> batch(static_cast<std::size_t>(jobs));
    for (auto& j : batch) {
      j.spec.name = "train";
      j.spec.command = {"true"};
      j.spec.cwd = "/";
      j.spec.on_finish = {"notify", "done"};
    }
    store->insert_batch(batch, std::vector<std::vector<std::size_t>>(batch.size()), "/", {{"FROM_BATCH", "yes"}}, 1.0);
    std::vector<const JobRecord*> ended;
    for (auto& j : batch) {  // ended, its hooks due in the same write (as commit() writes it)
      j.state = gpuq::JobState::succeeded;
      j.hook_due = true;
      ended.push_back(&j);
    }
    store->update_many(ended);
  }
  ~Bench() {
    for (auto& [_, fd] : release) ::close(fd);
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }

  Hooks hooks(int max_hooks) {
    Hooks::Setup setup;
    setup.max_hooks = max_hooks;
    setup.state_dir = dir;
    return Hooks(io, setup, *store, users, [](std::int64_t id) { return json{{"job", {{"id", id}}}}; },
                 [this](const std::string& hook_dir) -> gpuq::Result<int> {
                   int p[2];
                   REQUIRE(::pipe(p) == 0);
                   const int pid = ::fork();
                   REQUIRE(pid >= 0);
                   if (pid == 0) {  // waits until the test closes the pipe's other end
                     ::close(p[1]);
                     for (const auto& [_, fd] : release) ::close(fd);  // the other hooks' ends: theirs alone
                     char c;
                     while (::read(p[0], &c, 1) > 0) {
                     }
                     ::_exit(0);
                   }
                   ::close(p[0]);
                   release[hook_dir] = p[1];
                   pids[hook_dir] = pid;
                   spawned.push_back(hook_dir);
                   return pid;
                 });
  }
  // Ends the hook in `hook_dir` and runs gpuqd's loop until its end is handled: Hooks reaps its
  // child there, before it starts the next (a reaped pid is gone; an unreaped one a zombie).
  void end(const std::string& hook_dir) {
    ::close(release.at(hook_dir));
    release.erase(hook_dir);
    const int pid = pids.at(hook_dir);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (::kill(pid, 0) == 0) {
      if (std::chrono::steady_clock::now() > give_up) FAIL("the hook's end was not handled within 60 s");
      io.run_one_for(std::chrono::seconds(1));
    }
  }
  std::string hook_dir(std::int64_t id) const { return dir + "/jobs/" + std::to_string(id) + "/on-finish-0-0"; }
};

}  // namespace

TEST_SUITE_BEGIN("hooks");

TEST_CASE("at most max_hooks hooks run at once; the next job's start when one ends, and none is lost") {
  Bench b(3);
  Hooks h = b.hooks(2);
  for (const DueHook& due : b.store->due_hooks())
    h.due(due);
  REQUIRE(h.waiting() == 3);
  h.run();
  CHECK(h.running() == 2);
  CHECK(h.waiting() == 1);
  CHECK(b.spawned == std::vector<std::string>{b.hook_dir(1), b.hook_dir(2)});
  CHECK(b.store->due_hooks() == std::vector<DueHook>{{3, HookEvent::finish, {}}});  // 1 and 2 are marked started
  b.end(b.hook_dir(1));
  CHECK(h.running() == 2);  // 1's ended, 3's started in its place
  CHECK(h.waiting() == 0);
  CHECK(b.spawned.back() == b.hook_dir(3));
  CHECK(b.store->due_hooks().empty());
  b.end(b.hook_dir(2));
  b.end(b.hook_dir(3));
  CHECK(h.running() == 0);
  CHECK(b.spawned.size() == 3);
}

TEST_CASE("a job whose hooks still run waits for a later round instead of running them twice at once") {
  Bench b(1);
  Hooks h = b.hooks(4);
  h.due({1, HookEvent::finish, {}});
  h.run();
  REQUIRE(h.running() == 1);
  h.due({1, HookEvent::finish, {}});  // it ended again (restarted meanwhile) before its first hooks finished
  h.run();
  CHECK(h.running() == 1);
  CHECK(h.waiting() == 1);
  b.end(b.hook_dir(1));
  CHECK(h.waiting() == 0);  // its turn came once the first ended: it ended twice, so its hooks run twice
  CHECK(h.running() == 1);
  REQUIRE(b.spawned.size() == 2);
  CHECK(b.spawned[1] == b.hook_dir(1));
  b.end(b.hook_dir(1));
  CHECK(h.running() == 0);
}

TEST_CASE("a hook is handed the job on stdin, its batch's and its own environment, and the job's ids") {
  Bench b(1);
  Hooks h = b.hooks(1);
  h.due({1, HookEvent::finish, {}});
  h.run();
  REQUIRE(b.spawned.size() == 1);
  const std::string dir = b.hook_dir(1);
  std::ifstream in(dir + "/input.json");
  CHECK(json::parse(in) == json{{"job", {{"id", 1}}}});
  std::ifstream launch(dir + "/launch.json");
  const json doc = json::parse(launch);
  const json& rank = doc["ranks"][0];
  CHECK(rank["argv"] == json{"notify", "done"});
  CHECK(rank["stdin"] == dir + "/input.json");
  CHECK(rank["env"]["FROM_BATCH"] == "yes");
  CHECK(rank["env"]["GPUQ_JOB_ID"] == "1");
  CHECK(rank["env"]["GPUQ_JOB_STATE"] == "succeeded");
  CHECK(doc["timeout_s"] == 300);
  CHECK_FALSE(doc.contains("run_as"));  // single-user mode: as gpuqd's own user
  b.end(dir);
}

TEST_CASE("a job's hooks due twice before their turn came are queued once") {
  Bench b(1);
  Hooks h = b.hooks(1);
  h.due({1, HookEvent::preempt, "job 7"});
  h.due({1, HookEvent::preempt, "job 8"});  // preempted again before the first hook's turn
  CHECK(h.waiting() == 1);
  h.due({1, HookEvent::finish, {}});  // another event: its own turn
  CHECK(h.waiting() == 2);
}

TEST_CASE("a preemption's hooks run beside its end's, in a directory of their own, told who preempted it") {
  Bench b(1);
  auto rec = *b.store->get(1);
  rec.spec.on_preempt = {"notify", "preempted"};
  rec.state = gpuq::JobState::queued;  // back in line, as a preemption leaves it
  rec.preemptions = 2;
  rec.run.preempted_by = "";  // started again meanwhile: who preempted it is the due hook's word
  b.store->rewrite_specs({&rec}, {"on_preempt added"});
  b.store->update(rec, false);
  Hooks h = b.hooks(4);
  h.due({1, HookEvent::preempt, "job 9 (urgent)"});
  h.due({1, HookEvent::finish, {}});  // not ended (queued): its on_finish hooks have nothing to say
  h.run();
  REQUIRE(b.spawned.size() == 1);
  const std::string dir = b.temp.path + "/jobs/1/on-preempt-2-0";
  CHECK(b.spawned[0] == dir);
  std::ifstream launch(dir + "/launch.json");
  const json rank = json::parse(launch)["ranks"][0];
  CHECK(rank["argv"] == json{"notify", "preempted"});
  CHECK(rank["env"]["GPUQ_HOOK"] == "preempt");
  CHECK(rank["env"]["GPUQ_PREEMPTED_BY"] == "job 9 (urgent)");
  CHECK(rank["env"]["GPUQ_JOB_STATE"] == "queued");
  CHECK(b.store->due_hooks().empty());
  b.end(dir);
  CHECK(h.running() == 0);
}

TEST_SUITE_END();
