// The socket server and its connections (see server.hpp).
#include "daemon/server.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>

#include "common/paths.hpp"
#include "common/protocol.hpp"
#include "daemon/daemon.hpp"
#include "daemon/turns.hpp"

namespace gpuq::daemon {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;

namespace {

// Whether `reply` answers a request gpuqd knows, well formed: refusals of a line as not one, or as
// malformed (bad_request, unknown_command, too_large), are not activity; any other answer is,
// a refusal for want of rights or room included.
bool is_request_answered(const nlohmann::json& reply) {
  if (!reply.is_object()) return true;
  if (const auto ok = reply.find("ok"); ok != reply.end() && ok->is_boolean() && ok->get<bool>()) return true;
  const auto error = reply.find("error");
  if (error == reply.end() || !error->is_object()) return true;
  const auto found = error->find("code");
  if (found == error->end() || !found->is_string()) return true;
  const std::string& code = found->get_ref<const std::string&>();
  for (auto junk : {ErrorCode::bad_request, ErrorCode::unknown_command, ErrorCode::too_large})
    if (code == to_string(junk)) return false;
  return true;
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Connections one user may hold, and all users but the admins (Server::listen).
  struct Limits {
    std::size_t per_user = 0, room = 0;
  };
  Connection(local::socket socket, Daemon& daemon, std::shared_ptr<Turns> turns, double idle_s, Limits limits)
      : m_limits(limits),
        m_socket(std::move(socket)),
        m_daemon(daemon),
        m_turns(std::move(turns)),
        m_outbox(daemon.outbox()),
        m_idle(m_socket.get_executor()),
        m_write_timer(m_socket.get_executor()),
        m_idle_s(idle_s) {}
  ~Connection() {
    if (m_key) m_outbox->forget(m_key);
  }

  void start() {
    ucred cred{};
    socklen_t len = sizeof(cred);
    const bool known = ::getsockopt(m_socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    auto caller = known
                      ? m_daemon.identify(cred.uid)
                      : Result<Caller>(Error{ErrorCode::forbidden, "cannot tell who is calling (SO_PEERCRED failed)"});
    const bool admin = caller && caller->admin;
    // What its replies hold until it reads them counts against its user's bound, and it against
    // the bounds on connections unless it is an admin's (outbox.hpp).
    std::weak_ptr<Connection> weak = shared_from_this();
    m_key = m_outbox->open(
        known ? cred.uid : static_cast<uid_t>(-1),
        [weak] {
          if (auto self = weak.lock()) self->drop();
        },
        !admin);
    if (!caller) {
      send(common::error_reply(caller.error().code, caller.error().message), true);
      return;
    }
    m_caller = *caller;
    m_caller.connection = m_key;
    if (auto over = admin ? std::nullopt : over_limits(cred.uid)) {
      send(common::error_reply(over->code, over->message), true);
      return;
    }
    m_caller.protocol_minor = 0;  // until its hello says otherwise: a missing minor reads as 0
    read();
  }

 private:
  // Why a connection of `uid` (not an admin's) is one too many, now that it counts; or nothing.
  std::optional<Error> over_limits(uid_t uid) const {
    if (m_outbox->connections_of(uid) > m_limits.per_user)
      return Error{ErrorCode::too_large, "you have " + std::to_string(m_limits.per_user) +
                                             " connections to gpuqd open, the most one user may "
                                             "(connections_per_user); this one is closed: close some first"};
    if (m_outbox->connections_counted() > m_limits.room)
      return Error{ErrorCode::unavailable, "gpuqd holds " + std::to_string(m_limits.room) +
                                               " connections, all its descriptors allow beside room for the admins; "
                                               "this one is closed: try again later"};
    return std::nullopt;
  }

  // Waits for the next request. Idle means idle: the limit counts from the last request answered
  // (or the connection's start), so lines that are not requests (not JSON, unknown commands,
  // malformed, too long) sent to keep a connection open do not; a held wait or watch is not idle.
  void read() {
    if (!m_socket.is_open()) return;  // gone while its last request was answered: read no more of it
    auto self = shared_from_this();
    m_idle.expires_at(m_active_at + std::chrono::milliseconds(static_cast<long long>(m_idle_s * 1000)));
    m_idle.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->m_socket.close();  // silent client: let it go
    });
    read_line();
  }

  // Reads until a whole line is here. What a connection holds of lines not yet read whole counts
  // with its unread replies against its user's bound (outbox.hpp): 256 connections, each holding
  // a line of 1 MiB it never ended, used to hold 256 MiB of gpuqd's memory for the idle limit.
  // It waits for bytes without a buffer and reads what has come, so an idle connection holds
  // none.
  void read_line() {
    if (const auto nl = m_in.find('\n', m_scanned); nl != std::string::npos) {
      m_idle.cancel();
      std::string line = m_in.substr(0, nl + 1);
      take(nl + 1);
      return handle(line);
    }
    m_scanned = m_in.size();
    if (m_in.size() > common::k_max_request_bytes) {
      // Refuse, then skip the rest of the line without keeping it; the connection stays usable,
      // and the idle limit goes on running.
      send(common::error_reply(
               ErrorCode::too_large,
               "request line longer than " + std::to_string(common::k_max_request_bytes) + " bytes; refused"),
           false);
      take(m_in.size());
      return discard_line();
    }
    read_some();
  }
  // Reads what has come without blocking, and waits only once the socket says there is nothing:
  // the reactor is edge-triggered, so a wait begun after bytes came waits for the next ones (a
  // request sent before gpuqd began to wait for it was left unread).
  void wait_readable() {
    auto self = shared_from_this();
    m_socket.async_wait(local::socket::wait_read, [self](const boost::system::error_code& ec) {
      if (!ec) return self->read_some();
      self->m_idle.cancel();  // closed by the idle timer or dropped
    });
  }
  void read_some() {
    std::array<char, 65536> chunk;  // on the stack: a connection waiting for a request holds none
    const std::size_t have = m_in.size(), want = std::min(chunk.size(), common::k_max_request_bytes + 1 - have);
    const ssize_t n = ::recv(m_socket.native_handle(), chunk.data(), want, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return wait_readable();  // nothing yet
    if (n <= 0) {  // hung up, or broken
      m_idle.cancel();
      boost::system::error_code ignored;
      m_socket.close(ignored);
      return;
    }
    const auto got = static_cast<std::size_t>(n);
    if (m_in.capacity() < have + got)  // grown by doubling, never past the longest line
      m_in.reserve(std::min(std::max(2 * m_in.capacity(), have + got), common::k_max_request_bytes + 1));
    m_in.append(chunk.data(), got);
    if (!m_outbox->add(m_key, got)) return;  // dropped to make room for its user
    read_line();
  }

  // The first `n` bytes read are dealt with: no longer held (nor, beyond 64 KiB, their room).
  void take(std::size_t n) {
    m_in.erase(0, n);
    m_scanned = 0;
    m_outbox->sent(m_key, n);
    if (m_in.capacity() - m_in.size() > 65536) m_in.shrink_to_fit();
  }

  // The rest of a line too long, read through a buffer of 64 KiB that counts as held while it is.
  void discard_line() {
    auto self = shared_from_this();
    if (!m_scratch) {
      if (!m_outbox->add(m_key, k_scratch)) return;
      m_scratch = std::make_unique<std::array<char, k_scratch>>();
    }
    m_socket.async_read_some(asio::buffer(*m_scratch), [self](const boost::system::error_code& ec, std::size_t n) {
      if (ec) {  // gone, closed by the idle timer, or dropped
        self->m_idle.cancel();
        return;
      }
      auto* begin = self->m_scratch->data();
      auto* nl = std::find(begin, begin + n, '\n');
      if (nl == begin + n) return self->discard_line();
      std::size_t rest = static_cast<std::size_t>(begin + n - (nl + 1));  // the next request's bytes
      self->m_in.append(nl + 1, rest);
      self->m_scratch.reset();
      self->m_outbox->sent(self->m_key, k_scratch);
      if (!self->m_outbox->add(self->m_key, rest)) return;
      self->read_when_sent();
    });
  }

  void handle(const std::string& line) {
    auto self = shared_from_this();
    auto request = common::parse_request(line);
    if (!request) {
      send(common::error_reply(request.error().code, request.error().message), false);
      read_when_sent();
      return;
    }
    // The client's protocol minor, from its hello: what its replies may hold (Caller).
    if (const auto cmd = request->find("cmd"); cmd != request->end() && *cmd == "hello") {
      const auto minor = request->find("protocol_minor");
      m_caller.protocol_minor = minor != request->end() && minor->is_number_integer()
                                    ? static_cast<int>(std::clamp<std::int64_t>(minor->get<std::int64_t>(), 0, 1 << 20))
                                    : 0;
    }
    // In its user's turn (turns.hpp). A reply may come later (wait): the next request is read
    // once this one is answered.
    m_turns->add(m_caller.uid, [self, request = std::move(*request)] {
      if (!self->m_socket.is_open()) return;  // dropped, or closed at its idle limit, meanwhile
      self->m_held = true;
      self->m_daemon.dispatch(self->m_caller, request, [self](nlohmann::json reply) {
        self->m_held = false;
        if (is_request_answered(reply)) self->m_active_at = std::chrono::steady_clock::now();
        self->send(std::move(reply), false);
        self->read_when_sent();
      });
      if (self->m_held) self->notice_hangup();
    });
  }

  // While a request is held (a wait, a watch), a client that hangs up is let go at once: its
  // descriptor and buffers are freed and its wait or watch let go, not kept until the answer (a
  // wait on jobs that never end: for ever).
  // Bytes it sent meanwhile are left where they are, read after the answer as the next request.
  void notice_hangup() {
    if (!m_held || !m_socket.is_open()) return;
    // Looked at before waiting: the reactor is edge-triggered, so a wait begun after the client
    // hung up (with its request, as gpuqd was busy) waits for an edge that never comes.
    char c;
    const ssize_t n = ::recv(m_socket.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    const int error = errno;
    if (n > 0) return;  // bytes of its next request: read after the answer
    if (n < 0 && (error == EAGAIN || error == EWOULDBLOCK || error == EINTR)) {
      auto self = shared_from_this();
      m_socket.async_wait(local::socket::wait_read, [self](const boost::system::error_code& ec) {
        if (!ec) self->notice_hangup();
      });
      return;
    }
    boost::system::error_code ignored;
    m_socket.close(ignored);
    m_scratch.reset();
    std::string().swap(m_in);  // what it sent after the request: never read now
    // No longer one of its user's connections, and its wait or watch is let go unanswered.
    m_outbox->forget(std::exchange(m_key, 0));
    m_daemon.abandon(m_caller.connection);
  }

  // Backpressure: the next request is read only once the replies so far have been written, so
  // a client that sends and never reads holds at most one reply in gpuqd's memory; the rest
  // waits in its own socket buffer.
  void read_when_sent() {
    if (m_out.empty()) read();
    else m_read_after_write = true;
  }

  void send(nlohmann::json reply, bool close_after) {
    if (!m_socket.is_open()) return;  // dropped, or gone while its request was answered
    auto text = std::make_shared<std::string>();
    try {
      *text = reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    } catch (const std::exception& e) {
      *text = common::error_reply(ErrorCode::internal, e.what()).dump() + "\n";
    }
    reply = nullptr;                                  // its memory goes before the outbox makes room
    if (!m_outbox->add(m_key, text->size())) return;  // this very connection was dropped for it
    m_out.push_back(std::move(text));
    m_close_after = m_close_after || close_after;
    if (m_out.size() == 1) write();
  }

  // Over its user's (or everyone's) bound on unread replies, as the one that waited longest: let
  // go at once. What it holds goes with it once its last handler has run (a write's, cancelled
  // now, or one that had completed and is still to run: its reply is left for it to pop, as
  // clearing it under that handler popped an empty queue and crashed gpuqd).
  void drop() {
    boost::system::error_code ignored;
    m_socket.close(ignored);
    m_idle.cancel();
    m_write_timer.cancel();
  }

  // A client that stops reading mid-reply is disconnected after the idle timeout, like a silent one.
  void write() {
    auto self = shared_from_this();
    m_write_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_idle_s * 1000)));
    m_write_timer.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->m_socket.close();
    });
    auto text = m_out.front();  // kept by the write until it ends, even if the connection is dropped
    asio::async_write(m_socket, asio::buffer(*text), [self, text](const boost::system::error_code& ec, std::size_t) {
      self->m_write_timer.cancel();
      if (ec || !self->m_socket.is_open()) return;  // gone, or dropped: nothing more is written
      self->m_outbox->sent(self->m_key, text->size());
      self->m_out.pop_front();
      if (!self->m_out.empty())
        self->write();
      else if (self->m_close_after)
        self->linger();
      else if (std::exchange(self->m_read_after_write, false))
        self->read();
    });
  }

  // Closes once the client has read its last reply (a refusal): what it sent meanwhile (its
  // hello) is read and thrown away until it hangs up, for at most 5 s. Closed at once with that
  // unread, the client's read got ECONNRESET instead of the refusal.
  void linger() {
    boost::system::error_code ignored;
    m_socket.shutdown(local::socket::shutdown_send, ignored);
    auto self = shared_from_this();
    m_write_timer.expires_after(std::chrono::seconds(5));
    m_write_timer.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->m_socket.close();
    });
    if (!m_scratch) m_scratch = std::make_unique<std::array<char, k_scratch>>();
    linger_on();
  }
  void linger_on() {
    auto self = shared_from_this();
    m_socket.async_read_some(asio::buffer(*m_scratch), [self](const boost::system::error_code& ec, std::size_t) {
      if (!ec) return self->linger_on();
      self->m_write_timer.cancel();
      boost::system::error_code e;
      self->m_socket.close(e);
    });
  }

  Limits m_limits;
  local::socket m_socket;
  Daemon& m_daemon;
  std::shared_ptr<Turns> m_turns;
  std::shared_ptr<Outbox> m_outbox;
  Outbox::Key m_key = 0;
  Caller m_caller;
  std::string m_in;           // bytes read and not yet dealt with: a line, or part of one
  std::size_t m_scanned = 0;  // how far m_in is known to hold no newline
  asio::steady_timer m_idle;  // the idle limit, while a request is awaited (read())
  asio::steady_timer m_write_timer;  // a reply's writing, and a refusal's linger
  double m_idle_s;
  std::chrono::steady_clock::time_point m_active_at = std::chrono::steady_clock::now();  // read()
  std::deque<std::shared_ptr<const std::string>> m_out;
  static constexpr std::size_t k_scratch = 65536;
  std::unique_ptr<std::array<char, k_scratch>> m_scratch;  // only while a line too long is skipped, or in linger()
  bool m_close_after = false;
  bool m_held = false;  // a request is being answered later
  bool m_read_after_write = false;
};

// Is a daemon answering on `path`? (connect succeeds)
bool socket_in_use(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool used = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return used;
}

}  // namespace

Server::Server(asio::io_context& io, Daemon& daemon, std::string socket_path, double idle_timeout_s,
               SocketAccess access)
    : m_io(io),
      m_daemon(daemon),
      m_path(std::move(socket_path)),
      m_idle_timeout_s(idle_timeout_s),
      m_access(access),
      m_acceptor(io),
      m_accept_retry(io),
      m_turns(std::make_shared<Turns>(io.get_executor())) {}

Server::~Server() { close(); }

Result<bool> Server::listen() {
  if (m_path.size() >= sizeof(sockaddr_un::sun_path))
    return Error{ErrorCode::bad_request, "socket path too long (max 107 bytes): " + m_path};
  if (!m_access.everyone) {
    if (auto dir = common::ensure_private_dir(common::parent_dir(m_path)); !dir) return dir.error();
  } else {  // every user passes through the directory; the socket's mode says who may connect
    const std::string dir = common::parent_dir(m_path);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Error{ErrorCode::unavailable, "cannot create " + dir + ": " + std::strerror(errno)};
    struct stat d {};
    if (::lstat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode) || d.st_uid != ::geteuid() || (d.st_mode & 022))
      return Error{ErrorCode::forbidden, dir + " must be a directory of gpuqd's own that no one else can write"};
    // Made under UMask=0027 (the units), it would keep every other user from the socket.
    if ((d.st_mode & 0555) != 0555 && ::chmod(dir.c_str(), 0755) != 0)
      return Error{ErrorCode::unavailable, "cannot open " + dir + " to every user: " + std::strerror(errno)};
  }
  struct stat st {};
  if (::lstat(m_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Error{ErrorCode::bad_request, m_path + " exists and is not a socket; refusing to replace it"};
    if (socket_in_use(m_path))
      return Error{ErrorCode::unavailable, "another gpuqd is already serving " + m_path + "; stop it first (gpuq daemon stop)"};
    ::unlink(m_path.c_str());  // stale: left by a daemon that died
  }
  boost::system::error_code ec;
  m_acceptor.open(local(), ec);
  if (!ec) m_acceptor.bind(local::endpoint(m_path), ec);
  if (!ec && m_access.group && ::chown(m_path.c_str(), ::geteuid(), *m_access.group) != 0)
    ec = boost::system::error_code(errno, boost::system::system_category());
  if (!ec) ::chmod(m_path.c_str(), !m_access.everyone ? 0600 : m_access.group ? 0660 : 0666);
  if (!ec) m_acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) m_acceptor.non_blocking(true, ec);
  if (ec) return Error{ErrorCode::unavailable, "cannot listen on " + m_path + ": " + ec.message()};
  // Users but the admins may hold the descriptors gpuqd's limit leaves after a reserve (the limit
  // is read once: gpuqd sets it at start).
  rlimit files{};
  const std::size_t limit = ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                                ? static_cast<std::size_t>(files.rlim_cur)
                                : std::size_t{1} << 20;
  m_connections_room = limit > 2 * k_reserved_descriptors ? limit - k_reserved_descriptors : limit / 2;
  m_connections_per_user = static_cast<std::size_t>(std::max(1, m_access.connections_per_user));
  accept();
  return true;
}

void Server::close() {
  if (!m_acceptor.is_open()) return;
  m_accept_retry.cancel();
  boost::system::error_code ec;
  m_acceptor.close(ec);
  ::unlink(m_path.c_str());
}

// Takes every connection waiting, up to k_accepts_per_turn in one turn of the thread (the rest in
// the next), and waits only once none is left: the reactor is edge-triggered, so a wait begun
// with connections still in the backlog waits for another client to connect. One per turn, a
// connection waited in the backlog behind every other, each accepted between two users' requests
// (turns.hpp): behind 64 of one user's reconnecting clients, another's `gpuq status` took 6 to
// 10 s to be accepted.
void Server::accept() {
  if (!m_acceptor.is_open()) return;
  for (int taken = 0; taken < k_accepts_per_turn; ++taken) {
    boost::system::error_code e;
    local::socket socket(m_io);
    m_acceptor.accept(socket, e);                        // the acceptor does not block (listen())
    if (e == asio::error::connection_aborted) continue;  // gone before it was taken
    if (e == asio::error::would_block || e == asio::error::try_again) {
      m_acceptor.async_wait(local::acceptor::wait_read, [this](const boost::system::error_code& ec) {
        if (ec != asio::error::operation_aborted) accept();
      });
      return;
    }
    if (e) {
      // EMFILE or ENFILE, mostly: the connection stays in the backlog, so accepting again at
      // once fails again at once, at 100% CPU. Pause; the client is served once fds free up.
      if (!std::exchange(m_accept_failing, true))
        std::cerr << "gpuqd: cannot accept connections (" << e.message() << "); trying again every 100 ms\n";
      m_accept_retry.expires_after(std::chrono::milliseconds(100));
      m_accept_retry.async_wait([this](const boost::system::error_code& again) {
        if (!again) accept();
      });
      return;
    }
    if (std::exchange(m_accept_failing, false)) std::cerr << "gpuqd: accepting connections again\n";
    std::make_shared<Connection>(std::move(socket), m_daemon, m_turns, m_idle_timeout_s,
                                 Connection::Limits{m_connections_per_user, m_connections_room})
        ->start();
  }
  asio::post(m_io, [this] { accept(); });  // more may wait: after what is queued now
}

}  // namespace gpuq::daemon
