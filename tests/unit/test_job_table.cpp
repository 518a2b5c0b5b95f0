// The job table (daemon/job_table.hpp): records filed by state in the indexes a pass and the event
// tick walk, kept together through every change apply() makes; end states remembered for
// dependencies; the needs counter. Pure: records made here.
#include <doctest/doctest.h>

#include <vector>

#include "daemon/job_table.hpp"

using namespace gpuq::daemon;
using gpuq::JobState;

namespace {

JobRecord job(std::int64_t id, JobState state = JobState::queued, int priority = 0) {
  JobRecord r;
  r.id = id;
  r.spec.name = "j" + std::to_string(id);
  r.spec.priority = priority;
  r.state = state;
  return r;
}

std::vector<std::int64_t> in_line(const JobTable& t) {
  std::vector<std::int64_t> ids;
  for (const auto& [_, q] : t.queue()) ids.push_back(q.job.id);
  return ids;
}

std::vector<std::int64_t> running(const JobTable& t) {
  std::vector<std::int64_t> ids;
  for (const Active& a : t.running()) ids.push_back(a.rec.id);
  return ids;
}

}  // namespace

TEST_SUITE_BEGIN("job table");

TEST_CASE("queued jobs are in line by priority then id; held ones out of line; running ones apart") {
  JobTable t;
  std::map<std::int64_t, Active> staged;
  for (std::int64_t id : {1, 2, 3, 4}) staged[id].rec = job(id, JobState::queued, id == 3 ? 5 : 0);
  staged[4].rec.held = true;
  t.add(staged);
  CHECK(t.size() == 4);
  CHECK(in_line(t) == std::vector<std::int64_t>{3, 1, 2});
  CHECK(t.held() == std::set<std::int64_t>{4});
  auto r = job(1, JobState::running);
  const auto applied = t.apply(r);
  CHECK(applied.was == JobState::queued);
  CHECK_FALSE(applied.ended);
  CHECK(in_line(t) == std::vector<std::int64_t>{3, 2});
  CHECK(running(t) == std::vector<std::int64_t>{1});
  CHECK(t.is_running(1));
}

TEST_CASE("a change of priority refiles a queued job; releasing a held one puts it in line") {
  JobTable t;
  t.load(job(1), 0);
  t.load(job(2), 0);
  t.apply(job(2, JobState::queued, 9));
  CHECK(in_line(t) == std::vector<std::int64_t>{2, 1});
  auto held = job(1);
  held.held = true;
  t.apply(held);
  CHECK(in_line(t) == std::vector<std::int64_t>{2});
  t.apply(job(1, JobState::queued, 20));
  CHECK(in_line(t) == std::vector<std::int64_t>{1, 2});
  CHECK(t.held().empty());
}

TEST_CASE("an ended job leaves the table and every index, and its end state is remembered while jobs wait") {
  JobTable t;
  t.load(job(1, JobState::running), 0);
  auto dep = job(2);
  dep.after = {1};
  t.load(dep, 0);
  CHECK(t.any_with_deps());
  const auto applied = t.apply(job(1, JobState::failed));
  CHECK(applied.ended);
  CHECK(applied.was == JobState::running);
  CHECK_FALSE(t.contains(1));
  CHECK(running(t).empty());
  CHECK(t.known_state(1) == JobState::failed);
  CHECK(t.known_state(2) == JobState::queued);
  CHECK_FALSE(t.known_state(3));
  t.apply(job(2, JobState::cancelled));
  CHECK_FALSE(t.any_with_deps());
  CHECK(t.size() == 0);
  CHECK(t.queue().empty());
  // Nothing waits on anything: what ended is forgotten here (the store answers), not kept for
  // the whole history; and a job that ends meanwhile is not remembered.
  CHECK_FALSE(t.known_state(1));
  CHECK_FALSE(t.known_state(2));
  t.load(job(3, JobState::running), 0);
  t.apply(job(3, JobState::succeeded));
  CHECK_FALSE(t.known_state(3));
}

TEST_CASE("a job that comes back from having ended is live again, and says so") {
  JobTable t;
  t.load(job(1, JobState::running), 0);
  t.apply(job(1, JobState::succeeded));
  const auto back = t.apply(job(1));  // restarted
  CHECK(back.came_back);
  CHECK_FALSE(back.was);
  CHECK(t.known_state(1) == JobState::queued);
  CHECK(in_line(t) == std::vector<std::int64_t>{1});
}

TEST_CASE("the hook before a change sees the old state and the new record, with the job") {
  JobTable t;
  t.load(job(1), 0);
  std::optional<JobState> seen_was;
  JobState seen_now = JobState::queued;
  t.apply(job(1, JobState::running), [&](Active& a, std::optional<JobState> was, const JobRecord& now) {
    CHECK(a.rec.state == JobState::queued);  // not yet changed
    seen_was = was;
    seen_now = now.state;
  });
  CHECK(seen_was == JobState::queued);
  CHECK(seen_now == JobState::running);
}

TEST_CASE("a running job's record may change while the running jobs are walked") {
  JobTable t;
  for (std::int64_t id = 1; id <= 50; ++id) t.load(job(id, JobState::running), 0);
  int walked = 0;
  for (const Active& a : t.running()) {
    auto next = a.rec;
    next.bad_event_lines = 7;
    t.apply(next);  // its events, landed mid-walk
    ++walked;
  }
  CHECK(walked == 50);
  CHECK(t.at(25).rec.bad_event_lines == 7);
}

TEST_CASE("filing a queued job with `after` counts as a change to what ended jobs are needed for") {
  JobTable t;
  const auto before = t.needs_changed();
  t.load(job(1), 0);
  CHECK(t.needs_changed() == before);
  auto dep = job(2);
  dep.after = {1};
  t.load(dep, 0);
  CHECK(t.needs_changed() == before + 1);
  t.need_changed();
  CHECK(t.needs_changed() == before + 2);
}


TEST_CASE("a batch's max_running is kept until lifted with 0") {
  JobTable t;
  CHECK_FALSE(t.batch_limit(7));
  t.set_batch_limit(7, 2);
  t.set_batch_limit(8, 0);  // no limit: nothing kept
  CHECK(t.batch_limit(7) == 2);
  CHECK(t.batch_limits().size() == 1);
  t.set_batch_limit(7, 0);
  CHECK_FALSE(t.batch_limit(7));
  CHECK(t.batch_limits().empty());
}

TEST_SUITE_END();
