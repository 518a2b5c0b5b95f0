// Unread replies, bounded (daemon/outbox.hpp).
#include <doctest/doctest.h>

#include <memory>
#include <set>

#include "daemon/outbox.hpp"

using gpuq::daemon::Outbox;

namespace {
constexpr std::size_t MiB = 1 << 20;

// Connections of an outbox, each dropped by closing (recorded) and forgetting, as the server's are.
struct Clients {
  Outbox box;
  std::set<Outbox::Key> dropped;
  explicit Clients(std::size_t per_user, std::size_t total) : box(per_user, total) {}
  Outbox::Key open(uid_t uid) {
    auto k = std::make_shared<Outbox::Key>(0);
    *k = box.open(uid, [this, k] { dropped.insert(*k); });
    return *k;
  }
};
}  // namespace

TEST_CASE("a user's unread replies stay under its bound: the connection that waited longest goes first") {
  Clients c(32 * MiB, 256 * MiB);
  const auto a = c.open(1000), b = c.open(1000), d = c.open(1000);
  CHECK(c.box.add(a, 12 * MiB));
  CHECK(c.box.add(b, 12 * MiB));
  CHECK(c.box.unsent_of(1000) == 24 * MiB);
  CHECK(c.box.add(d, 12 * MiB));  // 36 MiB: `a`, unread longest, is let go
  CHECK(c.dropped == std::set<Outbox::Key>{a});
  CHECK(c.box.unsent_of(1000) == 24 * MiB);
  CHECK(c.box.dropped() == 1);
  // One that reads is no longer the oldest holder: what it read leaves the count.
  c.box.sent(b, 12 * MiB);
  const auto e = c.open(1000);
  CHECK(c.box.add(b, 12 * MiB));  // b holds again, now after d
  CHECK(c.box.add(e, 12 * MiB));  // 36: d, the oldest now, goes
  CHECK(c.dropped == std::set<Outbox::Key>{a, d});
  CHECK(c.box.unsent() == 24 * MiB);
  c.box.forget(b);
  c.box.forget(e);
  CHECK(c.box.unsent() == 0);
  CHECK(c.box.unsent_of(1000) == 0);
}

TEST_CASE("another user's unread replies do not count against one's own; the total's bound takes from the biggest holder") {
  Clients c(32 * MiB, 40 * MiB);
  const auto mine = c.open(1000), theirs1 = c.open(2000), theirs2 = c.open(2000);
  CHECK(c.box.add(theirs1, 15 * MiB));
  CHECK(c.box.add(theirs2, 15 * MiB));
  CHECK(c.box.add(mine, 8 * MiB));  // 38 of 40 in all
  CHECK(c.dropped.empty());
  // 46 in all: room is made from user 2000, who holds most, its oldest first, not from mine.
  const auto mine2 = c.open(1000);
  CHECK(c.box.add(mine2, 8 * MiB));
  CHECK(c.dropped == std::set<Outbox::Key>{theirs1});
  CHECK(c.box.unsent() == 31 * MiB);
  CHECK(c.box.unsent_of(1000) == 16 * MiB);
}

TEST_CASE("a connection over its bound on its own is dropped, and says so to the caller") {
  Clients c(32 * MiB, 256 * MiB);
  const auto a = c.open(1000), b = c.open(1000);
  CHECK(c.box.add(a, 20 * MiB));
  CHECK(c.box.add(a, 4 * MiB));  // a second reply while the first is unread (a refusal, say)
  CHECK(c.box.add(b, 4 * MiB));
  CHECK_FALSE(c.box.add(a, 8 * MiB));  // a is the oldest holder: it goes, with its new reply
  CHECK(c.dropped == std::set<Outbox::Key>{a});
  CHECK(c.box.unsent() == 4 * MiB);
  // A reply larger than the bound alone, where nothing else is held, goes through.
  const auto big = c.open(3000);
  CHECK(c.box.add(big, 40 * MiB));
  CHECK(c.box.unsent_of(3000) == 40 * MiB);
}

TEST_CASE("connections are counted by user, and those of admins apart from the rest") {
  Outbox box;
  const auto a = box.open(1000, {}), b = box.open(1000, {}), admin = box.open(0, {}, false);
  CHECK(box.connections_of(1000) == 2);
  CHECK(box.connections_of(0) == 1);
  CHECK(box.connections_counted() == 2);
  box.forget(a);
  box.forget(admin);
  CHECK(box.connections_of(1000) == 1);
  CHECK(box.connections_of(0) == 0);
  CHECK(box.connections_counted() == 1);
  box.forget(b);
  box.forget(b);  // once
  CHECK(box.connections_counted() == 0);
}
