// Requests waiting for gpuqd's one thread take turns by user: each user's requests wait in order,
// and the users with some waiting are served one request each in rotation. Without it a request
// waited behind every request already read, so a user with 256 connections each asking for a
// large status put another user's `gpuq status` behind 256 of them; now it starts after at most
// one request of each other user with requests waiting. Each request is run from a handler of its
// own, so reads, timers and the parts of long requests run between them. A long request (a
// submission's writing, a clean, a restart: parts.hpp) takes one turn to start; its later parts,
// each at most k_part, run in the io_context's order, not in turns.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>

namespace gpuq::daemon {

class Turns : public std::enable_shared_from_this<Turns> {
 public:
  explicit Turns(boost::asio::any_io_executor executor) : m_executor(std::move(executor)) {}
  // Runs `request` on the executor, in `uid`'s turn.
  void add(uid_t uid, std::function<void()> request);
  std::size_t waiting() const;

 private:
  void run_next();
  boost::asio::any_io_executor m_executor;
  std::unordered_map<uid_t, std::deque<std::function<void()>>> m_queues;
  std::deque<uid_t> m_rotation;  // the users with requests waiting, the next to be served first
  bool m_posted = false;  // a handler to run the next request is queued
};

}  // namespace gpuq::daemon
