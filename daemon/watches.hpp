// Watches (`watch`: the human `gpuq wait`, `top`, any client that follows the queue): a journal
// of which jobs changed, in order, and the requests held until a change they ask about lands.
// A blocking query, as Consul's and Nomad's: a client asks for what changed after its cursor;
// gpuqd answers at once when something has, else holds the request until something does or its
// timeout passes. The answer names each job that changed once, as it is now (the daemon builds
// it: lab mode's visibility rule applied), so a client that missed three changes of one job sees
// the last; the history is `show`'s. Bounded: the journal keeps the last k_capacity changes, a
// reply at most a page of jobs, a connection one request at a time. Resumable: a cursor is an
// epoch (this gpuqd's run) and a sequence number; a client that missed changes it may see (the
// journal dropped them) or holds another run's cursor is told to `reset` (read the jobs afresh,
// then watch on), as a Kubernetes watch's 410 Gone. Nothing tells a caller of changes it may not
// see: its cursor moves only over changes it may see, and they alone reset it. A change looks only
// at the held watches that name its job or batch, and at those that name neither. When, and for
// whom, is this owner's (tests/unit/test_watches.cpp).
#pragma once

#include <sys/types.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "daemon/reply.hpp"
#include "daemon/users.hpp"

namespace gpuq::daemon {

class Watches {
 public:
  static constexpr std::size_t k_capacity = 16384;  // changes kept (32 bytes each)

  // What a change shows, and so to whom: a job's place in the queue (new, its state, attempt,
  // held; in lab mode every user sees the queue), or only its details (progress, result: its
  // owner's and the admins').
  enum class Kind : std::uint8_t { state, details };
  struct Change {
    std::int64_t id = 0;
    std::int64_t batch = 0;
    uid_t uid = 0;
    Kind kind = Kind::state;
  };
  // Fills `out.jobs` with `ids` (changed, in order of their first change) as `caller` may see
  // them, as many as the reply's bounds hold; returns how many of `ids` it took (a job forgotten
  // meanwhile counts as taken, and shows nothing).
  using Answer =
      std::function<std::size_t(const Caller& caller, const std::vector<std::int64_t>& ids, common::WatchReply& out)>;

  Watches(boost::asio::io_context& io, Answer answer, std::int64_t epoch, std::size_t capacity = k_capacity)
      : m_io(io), m_answer(std::move(answer)), m_epoch(epoch), m_capacity(capacity) {}

  std::int64_t epoch() const { return m_epoch; }
  std::int64_t head() const { return m_head; }  // the cursor after the last change
  std::size_t held() const { return m_held.size(); }
  std::uint64_t answers() const { return m_answers; }  // watches answered so far
  // The last change `caller` may see, up to the head: the cursor it may be told.
  std::int64_t visible_head(const Caller& caller) const;

  // Journals a change. The requests it concerns are answered once the handler that made it is
  // done (posted): changes that land together (a commit of many jobs) make one answer each.
  void changed(const Change& c);
  // A watch of `caller`: answered now when `q` can be answered (a change after q.after it may
  // see; a cursor that cannot be resumed; no timeout), else held until one lands or q.timeout_s.
  void add(const Caller& caller, const common::WatchRequest& q, Later<common::WatchReply> reply);
  // Lets go, unanswered, of the watches held for `connection` (Caller::connection), whose client
  // hung up. How many went.
  std::size_t abandon(std::uint64_t connection);

 private:
  struct Held {
    Caller caller;
    common::WatchRequest q;  // due: q.after is the change before the first that concerns it
    Later<common::WatchReply> reply;
    std::unique_ptr<boost::asio::steady_timer> timer;
    bool due = false;
  };
  static bool visible(const Caller& caller, const Change& c) {
    return c.kind == Kind::state || may_read_details(caller, c.uid);
  }
  static bool concerns(const Caller& caller, const common::WatchRequest& q, const Change& c);
  // The last change `caller` may see that the journal dropped (0: none).
  std::int64_t dropped_for(const Caller& caller) const;
  // The answer to `q` as the journal stands, or nullopt when there is nothing to say yet.
  std::optional<common::WatchReply> look(const Caller& caller, const common::WatchRequest& q);
  void answer_due();
  void answer(std::uint64_t key);  // a held watch, if it is still held: due, or its time up
  void file(std::uint64_t key, const common::WatchRequest& q, bool in);  // into the indexes, or out

  boost::asio::io_context& m_io;
  Answer m_answer;
  std::int64_t m_epoch;
  std::size_t m_capacity;
  std::deque<Change> m_journal;  // changes m_head - size() + 1 .. m_head
  std::int64_t m_head = 0;
  // The last changes the journal dropped, by who may see them: a change of state (everyone's), any
  // change (the admins'), a change of details (its owner's).
  std::int64_t m_dropped_state = 0, m_dropped_any = 0;
  std::unordered_map<uid_t, std::int64_t> m_dropped_details;  // one entry per user with jobs
  // By a key of their own, which their timers name: a timer whose wait had ended when its watch
  // was answered otherwise still runs its handler, which then finds nothing.
  std::map<std::uint64_t, Held> m_held;
  std::uint64_t m_next_key = 0;
  // The held watches by what they name: ids (those with ids), else a batch, else neither.
  std::unordered_multimap<std::int64_t, std::uint64_t> m_by_id, m_by_batch;
  std::set<std::uint64_t> m_open;
  bool m_posted = false;
  std::uint64_t m_answers = 0;
};

}  // namespace gpuq::daemon
