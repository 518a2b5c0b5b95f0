// Blocking unix-socket client: write a line, read a line.
#include "common/client.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "common/protocol.hpp"

namespace gpuq::common {

using json = nlohmann::json;

Result<Client> Client::connect(const std::string& socket_path, const std::string& client_name) {
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof(addr.sun_path))
    return Error{ErrorCode::bad_request, "socket path is too long (max " +
                                             std::to_string(sizeof(addr.sun_path) - 1) + " bytes): " + socket_path};
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error{ErrorCode::internal, std::string("socket(): ") + std::strerror(errno)};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    return Error{ErrorCode::unavailable, "gpuqd is not running on " + socket_path + " (" +
                                             std::strerror(err) + "); start it with `gpuq daemon start`"};
  }
  Client c(fd);
  c.m_socket_path = socket_path;
  c.m_client_name = client_name;
  auto hello = c.roundtrip(encode(HelloRequest{k_protocol_version, client_name}));
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
    ::close(m_fd);
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
  std::string line = request.dump() + "\n";
  for (std::size_t sent = 0; sent < line.size();) {
    ssize_t n = ::send(m_fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error{ErrorCode::unavailable, std::string("lost connection to gpuqd: ") + std::strerror(errno)};
    sent += static_cast<std::size_t>(n);
  }
  std::size_t nl;
  while ((nl = m_buffer.find('\n')) == std::string::npos) {
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
