// A blocking client for gpuqd's socket, used by the CLI and the benchmarks. It performs the hello
// exchange on connect, so a version mismatch is reported before any command is sent.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/protocol.hpp"

namespace gpuq::common {

// How a client waits for gpuqd to come back: 0.1 s, doubling to 2 s, for up to `seconds` in all.
//   for (Backoff b(seconds); !done && b.wait();) try again;
class Backoff {
 public:
  explicit Backoff(double seconds)
      : m_deadline(std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds)) {}
  bool wait();  // false once the time is up; else sleeps the next delay and returns true

 private:
  std::chrono::time_point<std::chrono::steady_clock, std::chrono::duration<double>> m_deadline;  // no overflow
  double m_delay = 0.1;
};

// A reply body read as type Reply; one of another shape (a gpuqd of another version, or not
// gpuqd) is an error that names the field, never an exception.
Error unreadable_reply(const nlohmann::json::exception& e);
template <class Reply>
Result<Reply> read_reply(const nlohmann::json& body) {
  try {
    return body.get<Reply>();
  } catch (const nlohmann::json::exception& e) {
    return unreadable_reply(e);
  }
}

class Client {
 public:
  // Connects to `socket_path` and exchanges hello. A missing or dead daemon gives an
  // `unavailable` error that says how to start one.
  static Result<Client> connect(const std::string& socket_path, const std::string& client_name = "gpuq");

  Client(Client&& other) noexcept;
  Client& operator=(Client&& other) noexcept;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // Sends one request and reads one reply line; returns the reply body or its error. A reply
  // must come within reply_timeout(request) (an `unavailable` error that says so, the connection
  // closed) and be at most k_max_reply_line bytes.
  Result<nlohmann::json> call(const nlohmann::json& request);
  // Sends command C's request and reads the reply as C's reply type: the reply, or the error
  // (gpuqd's, the connection's, or a reply this gpuq cannot read, which says so).
  template <class Request, class Reply>
  Result<Reply> call(const Cmd<Request, Reply>& command, const Request& request = {}) {
    auto body = call(encode(command, request));
    if (!body) return body.error();
    return read_reply<Reply>(*body);
  }
  // How long gpuq waits for any reply (hello included), unless the request waits by design:
  // settings' reply_timeout_s ($GPUQ_REPLY_TIMEOUT_S); 0: no limit. Set once, by main.
  static void set_reply_timeout(double seconds);
  // None (0) for a `wait` without a timeout of its own, that timeout plus the default for one
  // with; ten times the default for the requests gpuqd answers after work of its own (submit's
  // checks, restart, clean's deletions); the default for the rest.
  static double reply_timeout(const nlohmann::json& request);
  // For clients that outlive a daemon restart (`wait`, `logs -f`), with idempotent requests
  // only: when gpuqd goes away (systemctl restart, a crash and its restart), `call` connects
  // again with backoff (0.1 s doubling to 2 s) for up to `seconds` and sends the request again.
  // `on_retry` hears of each lost connection (once per outage) and of the reconnection.
  void reconnect_for(double seconds, std::function<void(const std::string& what)> on_retry = {});
  const nlohmann::json& hello() const { return m_hello; }
  // One request's two halves, for a client that waits on gpuqd's answer beside other things
  // (`top`: keys and the terminal): send() it, poll fd() for input, then receive() its reply
  // (read within reply_timeout(request), as call's). No reconnecting here: an error is final for
  // the request, and after one the connection is closed.
  Result<bool> send(const nlohmann::json& request);
  Result<nlohmann::json> receive(const nlohmann::json& request);
  int fd() const { return m_fd; }

 private:
  explicit Client(int fd) : m_fd(fd) {}
  Result<nlohmann::json> roundtrip(const nlohmann::json& request);
  void drop();  // closes the connection, forgetting what was read

  int m_fd = -1;
  std::string m_buffer;  // bytes read past the last reply line
  nlohmann::json m_hello;
  std::string m_socket_path, m_client_name;  // to connect again
  double m_reconnect_s = 0;
  std::function<void(const std::string&)> m_on_retry;
};

}  // namespace gpuq::common
