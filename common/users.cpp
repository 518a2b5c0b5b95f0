// The user database, for lab mode (see users.hpp).
#include "common/users.hpp"

#include <grp.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpuq::common {

std::map<std::string, std::string> minimal_environment(const Account& a) {
  return {{"HOME", a.home},         {"USER", a.name},   {"LOGNAME", a.name},
          {"SHELL", a.shell.empty() ? "/bin/sh" : a.shell}, {"PATH", "/usr/local/bin:/usr/bin:/bin"},
          {"LANG", "C.UTF-8"}};
}

Result<Account> account_of(uid_t uid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  int rc;
  while ((rc = ::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found)) == ERANGE && buf.size() < (1u << 20))
    buf.resize(buf.size() * 2);
  if (rc != 0 || !found)
    return Error{ErrorCode::not_found, "uid " + std::to_string(uid) + " has no account in the user database" +
                                           (rc ? std::string(" (") + std::strerror(rc) + ")" : "")};
  Account a{uid, pw.pw_gid, pw.pw_name, pw.pw_dir ? pw.pw_dir : "/", pw.pw_shell ? pw.pw_shell : "/bin/sh", {}};
  int n = 64;
  for (int tries = 0; tries < 8; ++tries) {
    a.groups.assign(static_cast<std::size_t>(n), 0);
    int got = n;
    if (::getgrouplist(pw.pw_name, pw.pw_gid, a.groups.data(), &got) >= 0) {
      a.groups.resize(static_cast<std::size_t>(got));
      break;
    }
    n = std::max(got, n * 2);  // too small: getgrouplist said how many there are
  }
  if (std::find(a.groups.begin(), a.groups.end(), a.gid) == a.groups.end()) a.groups.push_back(a.gid);
  return a;
}

std::string user_name(uid_t uid) {
  auto a = account_of(uid);
  return a ? a->name : std::to_string(uid);
}

Result<gid_t> group_id(const std::string& name) {
  if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      name.size() < 10)
    return static_cast<gid_t>(std::stoul(name));
  std::vector<char> buf(16384);
  group gr{};
  group* found = nullptr;
  int rc;
  while ((rc = ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found)) == ERANGE && buf.size() < (1u << 22))
    buf.resize(buf.size() * 2);
  if (rc != 0 || !found) return Error{ErrorCode::not_found, "no group named `" + name + "`"};
  return gr.gr_gid;
}

ScopedFsIdentity::ScopedFsIdentity(const Account& account) : m_fsuid(::geteuid()), m_fsgid(::getegid()) {
  const int n = ::getgroups(0, nullptr);
  m_groups.resize(static_cast<std::size_t>(std::max(n, 0)));
  if (n > 0) m_groups.resize(static_cast<std::size_t>(std::max(::getgroups(n, m_groups.data()), 0)));
  // Groups first: once the fsuid is another's, the thread may no longer change them.
  if (::syscall(SYS_setgroups, account.groups.size(), account.groups.data()) != 0) return;
  ::syscall(SYS_setfsgid, account.gid);
  ::syscall(SYS_setfsuid, account.uid);
  // setfsuid says the old value whatever happens: ask again to learn the new one.
  m_ok = static_cast<uid_t>(::syscall(SYS_setfsuid, static_cast<uid_t>(-1))) == account.uid &&
         static_cast<gid_t>(::syscall(SYS_setfsgid, static_cast<gid_t>(-1))) == account.gid;
}

ScopedFsIdentity::~ScopedFsIdentity() {
  ::syscall(SYS_setfsuid, m_fsuid);
  ::syscall(SYS_setfsgid, m_fsgid);
  ::syscall(SYS_setgroups, m_groups.size(), m_groups.data());
}

}  // namespace gpuq::common
