// Users (daemon/users.hpp): who a caller is, lab mode's limits and the priority ceiling, fair
// share's decaying memory, accounts looked up once. No daemon, no store: a directory of made-up
// users stands in for the user database.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <map>

#include "daemon/users.hpp"
#include "tests/unit/refusal.hpp"

using namespace gpuq::daemon;
using gpuq::ErrorCode;
using gpuq::RequestError;

using gpuq::testing::refusal;

namespace {

constexpr uid_t k_alice = 7001, k_bob = 7002, k_carol = 7003;
constexpr gid_t k_admins = 800;

// alice and bob exist; carol is in the admin group until `carol_admin` is cleared. Lookups counted.
struct FakeDirectory {
  bool carol_admin = true;
  int account_lookups = 0, name_lookups = 0;
  Users::Directory directory() {
    return {[this](uid_t uid) {
              ++name_lookups;
              return std::string(uid == k_alice ? "alice" : uid == k_bob ? "bob" : uid == k_carol ? "carol" : "") +
                     std::to_string(uid);
            },
            [this](uid_t uid) -> gpuq::Result<gpuq::common::Account> {
              ++account_lookups;
              if (uid != k_alice && uid != k_bob && uid != k_carol) return gpuq::Error{ErrorCode::not_found, "no such uid"};
              gpuq::common::Account a;
              a.uid = uid;
              a.gid = uid;
              a.name = uid == k_alice ? "alice" : uid == k_bob ? "bob" : "carol";
              a.groups = {uid};
              if (uid == k_carol && carol_admin) a.groups.push_back(k_admins);
              return a;
            }};
  }
};

Users::Rules lab_rules() {
  Users::Rules r;
  r.multi_user = true;
  r.user_limits["alice" + std::to_string(k_alice)] = {0, 2, 3};  // max_gpus 2, max_queued 3
  r.user_limits["*"] = {1, 0, 0};
  r.usage_half_life_s = 100;
  r.max_priority = 10;
  r.admin_gid = k_admins;
  r.admin_group = "gpuadmins";
  return r;
}

JobRecord job(uid_t owner, int gpus, int priority = 0) {
  JobRecord r;
  r.uid = owner;
  r.spec.name = "j";
  r.spec.gpus = gpus;
  r.spec.priority = priority;
  return r;
}

}  // namespace

TEST_SUITE_BEGIN("users");

TEST_CASE("outside lab mode gpuqd serves its own user and root, both as admins, and refuses every other uid") {
  FakeDirectory dir;
  Users users(Users::Rules{}, dir.directory());
  auto self = users.identify(::getuid());
  REQUIRE(self);
  CHECK(self->admin);
  auto root = users.identify(0);
  REQUIRE(root);
  CHECK(root->admin);
  if (::getuid() != k_bob) {
    auto other = users.identify(k_bob);
    REQUIRE(!other);
    CHECK(other.error().code == ErrorCode::forbidden);
    CHECK(other.error().message.find("--multi-user") != std::string::npos);
  }
}

TEST_CASE("in lab mode root and the admin group's members are admins; the group is read again after a minute") {
  FakeDirectory dir;
  Users users(lab_rules(), dir.directory());
  const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  CHECK(users.identify(0, t0)->admin);
  CHECK_FALSE(users.identify(k_alice, t0)->admin);
  CHECK(users.identify(k_carol, t0)->admin);
  dir.carol_admin = false;  // taken out of the group: the cached answer stands for its minute
  const int lookups = dir.account_lookups;
  CHECK(users.identify(k_carol, t0 + std::chrono::seconds(59))->admin);
  CHECK(dir.account_lookups == lookups);
  CHECK_FALSE(users.identify(k_carol, t0 + std::chrono::seconds(61))->admin);
  CHECK(dir.account_lookups == lookups + 1);
}

TEST_CASE("a user's limits are their own entry, else the \"*\" entry, and none outside lab mode") {
  FakeDirectory dir;
  Users users(lab_rules(), dir.directory());
  REQUIRE(users.limits_of(k_alice));
  CHECK(users.limits_of(k_alice)->max_gpus == 2);
  REQUIRE(users.limits_of(k_bob));
  CHECK(users.limits_of(k_bob)->max_running == 1);
  auto single = lab_rules();
  single.multi_user = false;
  Users one(single, dir.directory());
  CHECK(one.limits_of(k_alice) == nullptr);
}

TEST_CASE("fair share's memory halves every half-life, adds new use to the decayed old, and is kept only in lab mode") {
  FakeDirectory dir;
  Users users(lab_rules(), dir.directory());
  users.add_use(k_alice, 400, 1000);
  CHECK(users.recent_use(k_alice, 1000) == doctest::Approx(400));
  CHECK(users.recent_use(k_alice, 1100) == doctest::Approx(200));
  CHECK(users.recent_use(k_alice, 1200) == doctest::Approx(100));
  users.add_use(k_alice, 50, 1100);
  CHECK(users.recent_use(k_alice, 1100) == doctest::Approx(250));
  CHECK(users.recent_use(k_bob, 1100) == 0);
  const auto all = users.recent_uses(1200);
  REQUIRE(all.size() == 1);
  CHECK(all[0].first == k_alice);
  CHECK(all[0].second == doctest::Approx(125));

  auto single = lab_rules();
  single.multi_user = false;
  Users one(single, dir.directory());
  one.add_use(k_alice, 400, 1000);
  CHECK(one.recent_use(k_alice, 1000) == 0);
}

TEST_CASE("a submission past max_gpus or max_queued is refused whole, naming the user and the limit") {
  FakeDirectory dir;
  Users users(lab_rules(), dir.directory());
  const Caller alice{k_alice, false};
  std::int64_t queued = 1;
  const auto count = [&](uid_t) { return queued; };
  users.check_submission(alice, k_alice, {job(k_alice, 2), job(k_alice, 1)}, count);  // 1 + 2 <= 3
  std::string why;
  CHECK(refusal([&] { users.check_submission(alice, k_alice, {job(k_alice, 1), job(k_alice, 3)}, count); }, &why) ==
        ErrorCode::forbidden);
  CHECK(why.find("job[1]") != std::string::npos);
  CHECK(why.find("max_gpus") != std::string::npos);
  queued = 2;
  CHECK(refusal([&] { users.check_submission(alice, k_alice, {job(k_alice, 1), job(k_alice, 1)}, count); }, &why) ==
        ErrorCode::forbidden);
  CHECK(why.find("alice") != std::string::npos);
  CHECK(why.find("max_queued 3") != std::string::npos);
  users.check_submission(alice, k_alice, {job(k_alice, 1)}, count);  // 2 + 1 <= 3
}

TEST_CASE("a priority above max_priority is an admin's alone") {
  FakeDirectory dir;
  Users users(lab_rules(), dir.directory());
  const auto none = [](uid_t) { return std::int64_t{0}; };
  std::string why;
  CHECK(refusal([&] { users.check_submission({k_bob, false}, k_bob, {job(k_bob, 0, 11)}, none); }, &why) ==
        ErrorCode::forbidden);
  CHECK(why.find("max_priority 10") != std::string::npos);
  users.check_submission({k_bob, false}, k_bob, {job(k_bob, 0, 10)}, none);
  users.check_submission({k_carol, true}, k_bob, {job(k_bob, 0, 50)}, none);  // an admin, for bob
  CHECK(refusal([&] { users.check_priority({k_bob, false}, 11, "update: "); }, &why) == ErrorCode::forbidden);
  CHECK(why.rfind("update: priority 11", 0) == 0);
}

TEST_CASE("a restart is refused when it takes one of its owners past max_queued, counting its own jobs once") {
  FakeDirectory dir;
  Users users(lab_rules(), dir.directory());
  std::map<std::int64_t, JobRecord> chosen{{1, job(k_alice, 1)}, {2, job(k_alice, 1)}, {3, job(k_bob, 1)}};
  users.check_restart(chosen, [](uid_t) { return std::int64_t{3}; });  // alice: 1 + her 2 pinned
  std::string why;
  CHECK(refusal([&] { users.check_restart(chosen, [](uid_t u) { return std::int64_t{u == k_alice ? 4 : 1}; }); }, &why) ==
        ErrorCode::forbidden);
  CHECK(why.find("has 2 jobs queued or running; restarting 2") != std::string::npos);
}

TEST_CASE("accounts: a submitter's is remembered, another is looked up once, and a uid with none has none") {
  FakeDirectory dir;
  Users users(lab_rules(), dir.directory());
  gpuq::common::Account remembered;
  remembered.uid = k_alice;
  remembered.name = "alice-as-submitted";
  users.remember(remembered);
  REQUIRE(users.account(k_alice));
  CHECK(users.account(k_alice)->name == "alice-as-submitted");
  CHECK(dir.account_lookups == 0);
  REQUIRE(users.account(k_bob));
  REQUIRE(users.account(k_bob));
  CHECK(dir.account_lookups == 1);
  CHECK(users.account(4242) == nullptr);
  CHECK(users.name_of(k_bob) == users.name_of(k_bob));
  CHECK(dir.name_lookups == 1);
}

TEST_SUITE_END();
