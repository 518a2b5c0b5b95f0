// Blocking unix-socket client: write a line, read a line.
#include "common/client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "common/protocol.hpp"

namespace gpuq::common {

using json = nlohmann::json;

namespace {
double g_reply_timeout_s = 120;
}

void Client::set_reply_timeout(double seconds) { g_reply_timeout_s = seconds; }

double Client::reply_timeout(const json& request) {
  if (g_reply_timeout_s <= 0 || !request.is_object()) return g_reply_timeout_s;
  const auto cmd = request.value("cmd", std::string());
  double t = g_reply_timeout_s;
  if (cmd == "wait") {
    const auto own = request.find("timeout_s");
    const double s = own != request.end() && own->is_number() ? own->get<double>() : 0.0;
    if (!(s > 0)) return 0;
    t = s + g_reply_timeout_s;
  } else if (cmd == "watch") {  // held up to its timeout_s (30 s unless given)
    const auto own = request.find("timeout_s");
    t = (own != request.end() && own->is_number() ? own->get<double>() : 30.0) + g_reply_timeout_s;
  } else if (cmd == "submit" || cmd == "restart" || cmd == "clean") {
    t = 10 * g_reply_timeout_s;
  }
  return std::min(t, 1e9);  // ~31 years: a deadline a clock can hold
}

Result<Client> Client::connect(const std::string& socket_path, const std::string& client_name) {
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof(addr.sun_path))
    return Error{ErrorCode::bad_request, "socket path is too long (max " +
                                             std::to_string(sizeof(addr.sun_path) - 1) + " bytes): " + socket_path};
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error{ErrorCode::internal, std::string("socket(): ") + std::strerror(errno)};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  // A gpuqd that accepts nothing (its backlog full) or reads nothing (a request larger than the
  // socket's buffer) holds connect and send: they give up after the reply timeout, as a read does.
  if (g_reply_timeout_s > 0) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(std::min(g_reply_timeout_s, 1e6));
    tv.tv_usec = static_cast<suseconds_t>((g_reply_timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    if (err == EAGAIN || err == EINPROGRESS)
      return Error{ErrorCode::unavailable, "gpuqd on " + socket_path + " accepts no connection (its backlog is full)"};
    return Error{ErrorCode::unavailable, "gpuqd is not running on " + socket_path + " (" +
                                             std::strerror(err) + "); start it with `gpuq daemon start`"};
  }
  Client c(fd);
  c.m_socket_path = socket_path;
  c.m_client_name = client_name;
  auto hello = c.roundtrip(encode(cmd::hello, HelloRequest{k_protocol_version, k_protocol_minor, client_name}));
  if (!hello) return hello.error();
  c.m_hello = *hello;
  return c;
}

Client::Client(Client&& other) noexcept
    : m_fd(other.m_fd),
      m_buffer(std::move(other.m_buffer)),
      m_hello(std::move(other.m_hello)),
      m_socket_path(std::move(other.m_socket_path)),
      m_client_name(std::move(other.m_client_name)),
      m_reconnect_s(other.m_reconnect_s),
      m_on_retry(std::move(other.m_on_retry)) {
  other.m_fd = -1;
}

Client& Client::operator=(Client&& other) noexcept {
  if (this != &other) {
    if (m_fd >= 0) ::close(m_fd);
    m_fd = other.m_fd;
    other.m_fd = -1;
    m_buffer = std::move(other.m_buffer);
    m_hello = std::move(other.m_hello);
    m_socket_path = std::move(other.m_socket_path);
    m_client_name = std::move(other.m_client_name);
    m_reconnect_s = other.m_reconnect_s;
    m_on_retry = std::move(other.m_on_retry);
  }
  return *this;
}

Client::~Client() {
  if (m_fd >= 0) ::close(m_fd);
}

bool Backoff::wait() {
  if (std::chrono::steady_clock::now() >= m_deadline) return false;
  std::this_thread::sleep_for(std::chrono::duration<double>(m_delay));
  m_delay = std::min(2.0, m_delay * 2);
  return true;
}

void Client::reconnect_for(double seconds, std::function<void(const std::string&)> on_retry) {
  m_reconnect_s = seconds;
  m_on_retry = std::move(on_retry);
}

Error unreadable_reply(const json::exception& e) {
  const auto* field = dynamic_cast<const ReplyFieldError*>(&e);
  return Error{ErrorCode::internal, "gpuqd's reply is not one this gpuq (" GPUQ_VERSION ") understands: " +
                                        (field ? std::string(field->what()) : detail::plain_message(e))};
}

Result<json> Client::call(const json& request) {
  auto reply = roundtrip(request);
  if (reply || reply.error().code != ErrorCode::unavailable || m_reconnect_s <= 0) return reply;
  // gpuqd went away mid-request: connect again until one answers or the time is up. The reply
  // is unavailable only when no gpuqd answered: errors of the new one's come back as they are.
  if (m_on_retry) m_on_retry("lost gpuqd (" + reply.error().message + "); reconnecting");
  for (Backoff backoff(m_reconnect_s); backoff.wait();) {
    auto fresh = connect(m_socket_path, m_client_name);
    if (!fresh) {
      if (fresh.error().code != ErrorCode::unavailable) return fresh.error();
      reply = fresh.error();
      continue;
    }
    if (m_fd >= 0) ::close(m_fd);
    m_fd = std::exchange(fresh->m_fd, -1);
    m_buffer = std::move(fresh->m_buffer);
    m_hello = std::move(fresh->m_hello);
    reply = roundtrip(request);
    if (reply || reply.error().code != ErrorCode::unavailable) {
      if (m_on_retry) m_on_retry("reconnected");
      return reply;
    }
  }
  return reply;
}

Result<json> Client::roundtrip(const json& request) {
  if (auto sent = send(request); !sent) return sent.error();
  return receive(request);
}

void Client::drop() {
  if (m_fd >= 0) ::close(m_fd);
  m_fd = -1;
  m_buffer.clear();
}

Result<bool> Client::send(const json& request) {
  if (m_fd < 0) return Error{ErrorCode::unavailable, "lost connection to gpuqd: an earlier reply never came"};
  std::string line;
  try {
    line = request.dump() + "\n";
  } catch (const json::type_error& e) {  // JSON holds UTF-8 only: an environment variable, say, that is not
    return Error{ErrorCode::bad_request, std::string("the request cannot be sent: ") + e.what() +
                                             " (an argument or environment variable that is not UTF-8?)"};
  }
  const auto broken = [this](Error e) {  // a reply may still come: this connection is done
    drop();
    return e;
  };
  for (std::size_t sent = 0; sent < line.size();) {
    ssize_t n = ::send(m_fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return broken(Error{ErrorCode::unavailable, "gpuqd reads no request: sending one timed out"});
    if (n <= 0) return Error{ErrorCode::unavailable, std::string("lost connection to gpuqd: ") + std::strerror(errno)};
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

Result<json> Client::receive(const json& request) {
  if (m_fd < 0) return Error{ErrorCode::unavailable, "lost connection to gpuqd: an earlier reply never came"};
  const auto broken = [this](Error e) {  // a reply may still come: this connection is done
    drop();
    return e;
  };
  // One line, read within the time allowed, found by scanning only the bytes each read adds.
  const double timeout_s = reply_timeout(request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::size_t nl, scanned = 0;
  while ((nl = m_buffer.find('\n', scanned)) == std::string::npos) {
    scanned = m_buffer.size();
    if (m_buffer.size() > k_max_reply_line)
      return broken(Error{ErrorCode::internal, "gpuqd's reply is longer than " +
                                                   std::to_string(k_max_reply_line >> 20) +
                                                   " MiB without ending its line: not a reply gpuqd sends"});
    if (timeout_s > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{m_fd, POLLIN, 0};
      const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30))) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0 && std::chrono::steady_clock::now() < deadline) continue;  // a wait capped below the deadline
      if (ready == 0) {
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%g", timeout_s);
        const std::string cmd = request.is_object() ? request.value("cmd", std::string()) : std::string();
        const bool changes = cmd == "submit" || cmd == "restart" || cmd == "clean" || cmd == "cancel" ||
                             cmd == "update" || cmd == "hold" || cmd == "release";
        return broken(Error{ErrorCode::unavailable,
                            "gpuqd accepted the connection but sent no reply within " + std::string(secs) +
                                " s (setting reply_timeout_s, $GPUQ_REPLY_TIMEOUT_S; 0 waits for ever)" +
                                (changes ? "; it may still carry the request out: check `gpuq status` before "
                                           "sending it again"
                                         : "")});
      }
    }
    char chunk[65536];
    ssize_t n = ::recv(m_fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error{ErrorCode::unavailable, "gpuqd closed the connection without a reply"};
    m_buffer.append(chunk, static_cast<std::size_t>(n));
  }
  std::string reply_line = m_buffer.substr(0, nl);
  m_buffer.erase(0, nl + 1);
  auto reply = parse_untrusted(reply_line, "gpuqd's reply", 2 * k_max_json_depth);
  if (!reply) return Error{ErrorCode::internal, reply.error().message};
  return unwrap_reply(*reply);
}

}  // namespace gpuq::common
