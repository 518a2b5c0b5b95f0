// Who gpuqd's callers are and what lab mode allows each (docs/lab.md): a caller as the kernel names
// it (SO_PEERCRED) with whether it is an admin, user names and accounts looked up once, each user's
// limits (user_limits, max_priority) and fair share's memory of their GPU use. An owner of its own
// state: the job table is not here, so what a limit counts of it (jobs queued or running) is asked
// of the caller, and every rule is a unit test (tests/unit/test_users.cpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/config.hpp"
#include "common/error.hpp"
#include "common/users.hpp"
#include "daemon/store.hpp"

namespace gpuq::daemon {

// Who sent a request, as the kernel says (SO_PEERCRED), never as the request says. An admin may act
// on every job: root, a member of the admin group in lab mode, and in single-user mode every
// caller gpuqd serves at all (its own user and root).
constexpr int k_caller_minor_latest = 6;  // common::k_protocol_minor, without its header

struct Caller {
  uid_t uid = 0;
  bool admin = true;
  // The protocol minor its client said in its hello (0 without one): what its replies may hold
  // (common::k_protocol_minor; a job state a client of an older minor does not know is sent as
  // one it does).
  int protocol_minor = k_caller_minor_latest;
  // The server's key for the connection it asks on (0: none): a wait or watch it holds is let go
  // when it hangs up (Daemon::abandon).
  std::uint64_t connection = 0;
  static Caller self();  // this process's user, an admin: unit tests, and single-user mode's caller
};

// Whether `viewer` may read `r`'s details: its result, progress, labels, failure reasons, spec,
// environment, events and logs (lab mode: its owner and the admins; docs/lab.md).
bool may_read_details(const Caller& viewer, const JobRecord& r);
bool may_read_details(const Caller& viewer, uid_t owner);  // of `owner`'s jobs

class Users {
 public:
  // The configuration's rules for users (common::Settings' keys of the same names).
  struct Rules {
    bool multi_user = false;
    std::map<std::string, common::UserLimit> user_limits;
    double usage_half_life_s = 7 * 86400;
    std::optional<int> max_priority;
    std::optional<gid_t> admin_gid;  // admin_group's, resolved
    std::string admin_group;
  };
  // Where names and accounts come from: the user database, or a test's.
  struct Directory {
    std::function<std::string(uid_t)> name = common::user_name;
    std::function<Result<common::Account>(uid_t)> account = common::account_of;
  };
  explicit Users(Rules rules);  // names and accounts from the user database
  Users(Rules rules, Directory directory);

  const Rules& rules() const { return m_rules; }

  // Whom a connection's peer is, or why gpuqd does not serve it (forbidden). Admin-group
  // membership is looked up again once a minute, so a change to the group needs no restart.
  Result<Caller> identify(uid_t uid, std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) const;
  const std::string& name_of(uid_t uid) const;  // looked up once each

  // The account a job of `uid` runs as: as of its owner's last submit, else the user database's;
  // null when it has none.
  const common::Account* account(uid_t uid);
  void remember(common::Account a);  // a submitter's account, looked up off gpuqd's thread

  // Lab mode: a user's limits (user_limits by name, else "*"), or null when they have none.
  const common::UserLimit* limits_of(uid_t uid) const;
  // Fair share's memory: GPU-seconds of ended attempts, decayed to `now` (usage_half_life_s).
  double recent_use(uid_t uid, double now) const;
  void add_use(uid_t uid, double gpu_s, double at);  // nothing outside lab mode
  // Each user with GPU use remembered, and that use decayed to `now`.
  std::vector<std::pair<uid_t, double>> recent_uses(double now) const;

  // How many of a user's jobs are queued or running (or pinned by a restart under way): what
  // max_queued bounds. The job table's to say.
  using Count = std::function<std::int64_t(uid_t)>;
  // Refuses (forbidden) a submission or update of `jobs` for `owner` that its limits or the
  // priority ceiling forbid; `caller` is who asks (an admin may pass the ceiling).
  void check_submission(const Caller& caller, uid_t owner, const std::vector<JobRecord>& jobs, const Count& queued) const;
  // Refuses a restart that would take an owner of its `chosen` jobs (already counted by `queued`)
  // past max_queued.
  void check_restart(const std::map<std::int64_t, JobRecord>& chosen, const Count& queued) const;
  // Refuses (forbidden) `priority` above max_priority from one who is no admin; `who` opens the message.
  void check_priority(const Caller& caller, int priority, const std::string& who) const;

 private:
  struct Use {
    double gpu_s = 0;
    double at = 0;
  };
  Rules m_rules;
  Directory m_directory;
  std::map<uid_t, Use> m_use;
  std::map<uid_t, common::Account> m_accounts;
  mutable std::map<uid_t, std::string> m_names;
  // identify's: whether a uid is in the admin group, and until when that answer stands.
  mutable std::map<uid_t, std::pair<bool, std::chrono::steady_clock::time_point>> m_admins;
};

}  // namespace gpuq::daemon
