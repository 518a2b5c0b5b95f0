// Waits (`gpuq wait`, `submit --wait`): each names jobs and is answered once none of them is
// queued or running, or at its timeout. Each id leaves a wait's pending set once, from the front,
// so a wait on a whole batch costs O(1) per job that ends. What the answer says (the jobs as the
// caller may see them) is the daemon's to build; when, and for whom, is this owner's
// (tests/unit/test_waiters.cpp).
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "daemon/reply.hpp"
#include "daemon/users.hpp"

namespace gpuq::daemon {

class Waiters {
 public:
  // The reply to a wait of `caller` on `ids`, ended or (timed_out) not.
  using Answer =
      std::function<common::JobsReply(const Caller& caller, const std::set<std::int64_t>& ids, bool timed_out)>;
  Waiters(boost::asio::io_context& io, Answer answer) : m_io(io), m_answer(std::move(answer)) {}

  // A wait of `caller` on `ids`, answered through `reply` by notify() once none is active, or at
  // `timeout_s` (0: none).
  void add(const Caller& caller, std::set<std::int64_t> ids, Later<common::JobsReply> reply, double timeout_s);
  // Answers every wait whose jobs are no longer active (`active(id)`: queued or running).
  void notify(const std::function<bool(std::int64_t)>& active);
  // Job `id` is active again (restarted): the waits that name it wait for it again.
  void came_back(std::int64_t id);
  // Whether a pending wait names `id` (a clean --forget keeps such a job).
  bool names(std::int64_t id) const;
  void for_each_named(const std::function<void(std::int64_t)>& f) const;
  std::size_t size() const { return m_waits.size(); }
  // Lets go, unanswered, of the waits asked on `connection` (Caller::connection): its client hung
  // up. A wait on 100,000 jobs holds their ids; each one a client left used to stay until its
  // jobs ended, so a loop of waits and hang-ups grew gpuqd without bound. How many went.
  std::size_t abandon(std::uint64_t connection);

 private:
  struct Wait {
    Caller caller;
    std::set<std::int64_t> ids;
    std::set<std::int64_t> pending;  // of `ids`, those not known to have ended: emptied from the front
    Later<common::JobsReply> reply;
    std::shared_ptr<boost::asio::steady_timer> timer;
  };
  void answer(Wait& done, bool timed_out);  // through its Later, exactly once
  boost::asio::io_context& m_io;
  Answer m_answer;
  std::vector<Wait> m_waits;
};

}  // namespace gpuq::daemon
