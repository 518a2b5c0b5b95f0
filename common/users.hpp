// Who a uid is: the accounts of lab mode (gpuqd --multi-user), where one root daemon serves every
// local user and runs each job as its owner. Read from the system's user database (NSS: files,
// LDAP, sssd); the daemon resolves an account once and hands the supervisor plain numbers, so
// gpuq-shim never needs NSS.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace gpuq::common {

// The lab daemon's socket and state, where `gpuq` also looks when the user runs no gpuqd of their
// own.
inline constexpr const char* k_lab_socket = "/run/gpuq/gpuqd.sock";
inline constexpr const char* k_lab_state_dir = "/var/lib/gpuq";

// Lab mode: what one user may hold at once (0: no limit). By name; "*" for every user not named.
struct UserLimit {
  int max_running = 0;            // jobs running at once
  int max_gpus = 0;               // GPUs held at once
  std::int64_t max_queued = 0;    // jobs not yet ended (queued and running)
};

struct Account {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string name, home, shell;
  std::vector<gid_t> groups;  // supplementary, the primary among them
};

// The account of `uid`, or not_found naming it.
Result<Account> account_of(uid_t uid);
// What a lab-mode job of `a` starts from when its client sent no environment (docs/lab.md), as
// cron gives a job: HOME, USER, LOGNAME and SHELL from the account, PATH /usr/local/bin:/usr/bin:/bin,
// LANG C.UTF-8. Never the root daemon's own environment.
std::map<std::string, std::string> minimal_environment(const Account& a);
// A user's name, or the number as text when the user database has none.
std::string user_name(uid_t uid);
// The group `name` (or a number), or not_found.
Result<gid_t> group_id(const std::string& name);

// While it lives, the calling thread reaches files as `account` does (its file-system uid and gid,
// and its groups), and with none of root's file-system capabilities: a root gpuqd checks a job's
// directory and command as their owner would. Linux keeps these per thread, and they are set with
// raw system calls (glibc's wrappers would change every thread of gpuqd). ok() is false when a
// change was refused; the destructor puts the thread's own back.
class ScopedFsIdentity {
 public:
  explicit ScopedFsIdentity(const Account& account);
  ~ScopedFsIdentity();
  ScopedFsIdentity(const ScopedFsIdentity&) = delete;
  ScopedFsIdentity& operator=(const ScopedFsIdentity&) = delete;
  bool ok() const { return m_ok; }

 private:
  uid_t m_fsuid;
  gid_t m_fsgid;
  std::vector<gid_t> m_groups;
  bool m_ok = false;
};

}  // namespace gpuq::common
