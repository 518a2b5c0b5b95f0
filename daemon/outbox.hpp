// Replies gpuqd has made and its clients have not read yet, and request lines read in part, counted
// by user and in all, and bounded: a client that asks and never reads holds its reply in gpuqd's
// memory (a connection holds one at a time: the next request is read once the last reply is
// written), so without a bound 30 connections asking for 64 MiB each held 743 MB; one that sends
// most of a line and never ends it holds that (up to 1 MiB a connection). When bytes would take
// their user past k_per_user, or every user past k_total, connections are dropped to make room:
// of that user (of the user holding most, for the total), the one that has held bytes longest
// first. A client that reads, and ends its lines, is seldom the one that has held longest; one
// that does not is let go.
// It also counts each user's open connections, and all but the admins', which the server bounds
// (server.hpp, SocketAccess).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

namespace gpuq::daemon {

class Outbox {
 public:
  static constexpr std::size_t k_per_user = 32 << 20;
  static constexpr std::size_t k_total = 256 << 20;
  using Key = std::uint64_t;

  explicit Outbox(std::size_t per_user = k_per_user, std::size_t total = k_total)
      : m_per_user(per_user), m_total_limit(total) {}

  // A connection of `uid`; `drop` closes it and frees what it holds (then calls forget).
  // `counted`: against the bounds on connections (not an admin's).
  Key open(uid_t uid, std::function<void()> drop, bool counted = true);
  void forget(Key k);  // closed: what it held is released
  // `k` holds `bytes` more (a reply queued, or a request's bytes read). Room is made first
  // (above); false when `k` itself was dropped.
  bool add(Key k, std::size_t bytes);
  void sent(Key k, std::size_t bytes);  // no longer held: written to the client, or dealt with

  // Connections open, of `uid` and of everyone who is not an admin (`open`'s `counted`).
  std::size_t connections_of(uid_t uid) const;
  std::size_t connections_counted() const { return m_counted; }
  std::size_t connections() const { return m_entries.size(); }
  std::size_t unsent() const { return m_total; }
  std::size_t unsent_of(uid_t uid) const;
  std::uint64_t dropped() const { return m_dropped; }

 private:
  struct Entry {
    uid_t uid = 0;
    std::size_t bytes = 0;
    std::uint64_t since = 0;  // when it began to hold unread bytes (an order, not a time)
    std::function<void()> drop;
    bool counted = true;
  };
  // The connection of `uid` whose reply has waited longest, or 0.
  Key oldest_of(uid_t uid) const;
  void drop(Key k, const std::string& why);

  std::size_t m_per_user, m_total_limit;
  std::unordered_map<Key, Entry> m_entries;
  std::unordered_map<uid_t, std::size_t> m_by_user;  // users holding unread bytes
  std::unordered_map<uid_t, std::size_t> m_connections;  // users with connections open
  std::size_t m_counted = 0;
  std::size_t m_total = 0;
  Key m_next = 1;
  std::uint64_t m_seq = 0, m_dropped = 0;
  double m_said_at = 0;  // gpuqd's log says so at most every 10 s
};

}  // namespace gpuq::daemon
