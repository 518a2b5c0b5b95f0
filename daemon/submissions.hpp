// Submissions on their way into the store. A submit is checked on a helper thread (check_batch:
// parsing, file-system lookups, the owner's account), accepted or refused on gpuqd's thread, then
// written in parts, one per turn of gpuqd's loop (Store::insert_batch_part), so that no client
// waits behind a 100,000-job matrix for more than a part's time. Submissions are written one at a
// time, in the order their checks end; the jobs exist for other requests only once all are
// written, when `written` hands them over.
#pragma once

#include <sys/types.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>

#include "common/protocol.hpp"
#include "daemon/job_table.hpp"
#include "daemon/store.hpp"
#include "daemon/submit_check.hpp"
#include "daemon/users.hpp"
#include "daemon/waiters.hpp"

namespace gpuq::daemon {

class Submissions {
 public:
  struct Batch {
    Caller caller;
    std::string cwd;
    int max_running = 0;
    std::optional<common::Account> account;  // lab mode: the owner's, looked up on the check thread
    Result<CheckedBatch> checked = Error{};
    double at = 0;                           // submitted at: set once accepted
    Store::BatchWrite write;
    std::map<std::int64_t, Active> staged;   // the jobs written so far, to go live once all are
    Later<common::SubmitReply> reply;
    std::int64_t epoch = 0, cursor = 0;  // the watch stream's, for the submitter, before the jobs went live
  };
  // On gpuqd's thread, once a batch is checked well: what refuses it now (a dependency that is
  // gone, the owner's limits), or true.
  using Accept = std::function<Result<bool>(Batch&)>;
  // On gpuqd's thread, once every job of a batch is written: its jobs go live (batch.staged, with
  // their ids), before the submitter is answered (with batch.epoch and batch.cursor).
  using Written = std::function<void(Batch&)>;

  Submissions(boost::asio::io_context& io, Store& store, Accept accept, Written written);
  ~Submissions();  // waits for a check under way

  // Checks `sub` off gpuqd's thread, then (accepted) writes it after those before it; `reply`
  // gets the ids, or the error that refused it. `owner`: lab mode's, whose account the jobs run as.
  void submit(const Caller& caller, common::SubmitRequest sub, const MachineFacts& facts, std::optional<uid_t> owner,
              Later<common::SubmitReply> reply);
  // Accepted, and not all written yet.
  std::size_t writing() const { return m_queue.size(); }

 private:
  void checked(const std::shared_ptr<Batch>& b);  // on gpuqd's thread, after check_batch
  void write_part();  // the next part of m_queue.front()
  void next();        // m_queue.front() is answered: on to the next

  boost::asio::io_context& m_io;
  Store& m_store;
  Accept m_accept;
  Written m_written;
  std::deque<std::shared_ptr<Batch>> m_queue;  // accepted, to be written in this order
  boost::asio::thread_pool m_check_thread{1};  // declared last: joined before the rest goes
};

}  // namespace gpuq::daemon
