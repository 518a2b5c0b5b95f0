// gpuqd's socket server: a unix stream socket (0600 in a 0700 directory; in lab mode 0666, or 0660
// in a group, in a 0755 one), one JSON request per line, replies in order. Each peer is named by
// SO_PEERCRED, and Daemon::identify says whether and as whom it is served; users take turns on
// gpuqd's thread (turns.hpp). Lines over
// k_max_request_bytes are refused without buffering them whole; a connection that sends nothing
// for the idle timeout is closed, so no client can pin the daemon. Out of file descriptors,
// accepting pauses (100 ms at a time) instead of failing again at once in a loop.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <memory>
#include <optional>
#include <string>

#include "common/error.hpp"

namespace gpuq::daemon {

class Daemon;
class Turns;

// Who may reach the socket, and how much of it.
struct SocketAccess {
  bool everyone = false;        // lab mode: every local user (gpuqd tells them apart)
  std::optional<gid_t> group;   // lab mode: this group's members only
  // Connections one user may hold open at once (admins: any). All users but the admins together
  // may hold as many as gpuqd's descriptor limit leaves after k_reserved_descriptors: accepting
  // never fails for an admin because others hold every descriptor.
  int connections_per_user = 256;
};
constexpr int k_reserved_descriptors = 512;
constexpr int k_accepts_per_turn =
    256;  // connections accepted in one go (Server::accept)  // for gpuqd's own files (store, jobs, logs) and admins

class Server {
 public:
  Server(boost::asio::io_context& io, Daemon& daemon, std::string socket_path, double idle_timeout_s = 300,
         SocketAccess access = {});
  ~Server();
  // Binds the socket. Refuses when another gpuqd answers on it; removes a stale socket file.
  Result<bool> listen();
  void close();

 private:
  void accept();
  boost::asio::io_context& m_io;
  Daemon& m_daemon;
  std::string m_path;
  double m_idle_timeout_s;
  SocketAccess m_access;
  boost::asio::local::stream_protocol::acceptor m_acceptor;
  boost::asio::steady_timer m_accept_retry;  // after a failed accept (out of file descriptors)
  bool m_accept_failing = false;
  std::size_t m_connections_per_user = 1, m_connections_room = 0;  // set by listen()
  std::shared_ptr<Turns> m_turns;                                  // the connections' requests, by user in turn
};

}  // namespace gpuq::daemon
