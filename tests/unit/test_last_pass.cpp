// What the last scheduling pass said (daemon/last_pass.hpp): a queued job's reason as of the last
// pass, in order: what the pass said of it, its batch's limit, its user's, the place where the
// pass stopped. Pure: plans and jobs made here.
#include <doctest/doctest.h>

#include "daemon/last_pass.hpp"

using namespace gpuq::daemon;

namespace {

Active queued(std::int64_t id, std::int64_t batch = 0, std::uint32_t uid = 0, int gpus = 1) {
  Active a;
  a.rec.id = id;
  a.rec.batch = batch;
  a.rec.uid = uid;
  a.rec.spec.gpus = gpus;
  return a;
}

const auto no_drain = [](int, std::string reason) { return reason; };

}  // namespace

TEST_SUITE_BEGIN("last pass");

TEST_CASE("what the pass said of a job stands for that pass, and a running job keeps its own reason") {
  LastPass last;
  Active a = queued(1);
  last.begin();
  last.say(a, "needs 1 GPU; none free");
  CHECK(last.wait_reason(a, "alice", no_drain) == "needs 1 GPU; none free");
  a.rec.state = gpuq::JobState::running;
  last.begin();
  CHECK(last.wait_reason(a, "alice", no_drain) == "needs 1 GPU; none free");
}

TEST_CASE("a job passed over without a word waits for its batch's limit, else its user's, else the pass's tail") {
  LastPass last;
  last.begin();
  Plan plan;
  plan.at_limit[7] = {2, 2};
  plan.users_at_limit[1000] = {0, 0, 2, 2};  // alice holds her 2 GPUs
  plan.stopped = true;
  plan.tail = {4, 0, 8};
  plan.reservations[3] = {0, 1};
  last.remember(plan);
  const Active in_batch = queued(10, 7, 1000), of_alice = queued(11, 8, 1000), behind = queued(12, 9, 2000, 4);
  CHECK(last.wait_reason(in_batch, "alice", no_drain) == batch_limit_reason(7, {2, 2}));
  CHECK(last.wait_reason(of_alice, "alice", no_drain) == user_limit_reason("alice", {0, 0, 2, 2}, 1));
  const std::string tail = tail_wait_reason(pending_of(behind.rec), {4, 0, 8});
  CHECK(last.wait_reason(behind, "bob", no_drain) == tail);
  CHECK(last.wait_reason(behind, "bob", [](int gpus, std::string r) { return r + " +" + std::to_string(gpus); }) ==
        tail + " +4");
  CHECK(last.batch_at_limit(7) != nullptr);
  CHECK(last.batch_at_limit(8) == nullptr);
  CHECK(last.reservations().at(3) == std::vector<int>{0, 1});
}

TEST_CASE("a user under their cap is not told they are at it") {
  LastPass last;
  last.begin();
  Plan plan;
  plan.users_at_limit[1000] = {0, 0, 4, 3};  // one GPU of four left
  last.remember(plan);
  Active small = queued(1, 0, 1000, 1), big = queued(2, 0, 1000, 2);
  small.wait_reason = "earlier";
  CHECK(last.wait_reason(small, "alice", no_drain) == "earlier");
  CHECK(last.wait_reason(big, "alice", no_drain) == user_limit_reason("alice", {0, 0, 4, 3}, 2));
}

TEST_SUITE_END();
