// `gpuqd --metrics-listen ADDRESS:PORT`: GET /metrics over HTTP/1.1 (Boost.Beast), on gpuqd's
// io_context, for Prometheus to scrape. Nothing here may hold up the unix-socket clients, and no
// client may keep the scrapes out: a request's header is at most k_header_limit bytes (431
// beyond), must arrive whole within k_header_timeout (else the connection is closed: slowloris),
// and carries no body; the answer must be read within k_response_timeout; at most
// k_max_connections are open at once, and a new one closes the oldest (what is stuck, as a scrape
// is answered at once); every response closes its connection. The exposition is rendered at most
// once per k_render_every, so a flood of scrapes costs one rendering per period. And
// `--metrics-textfile PATH`: the same text written atomically every k_textfile_every for
// node_exporter's textfile collector.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/error.hpp"

namespace gpuq::daemon {

struct HttpEndpoint {
  std::string host;  // an IPv4 or IPv6 literal, or "localhost"
  unsigned short port = 0;
};
// "127.0.0.1:9464", "[::1]:9464", "localhost:9464" (port 0: any free one); an error naming the
// problem otherwise. Pure, for tests.
Result<HttpEndpoint> parse_http_endpoint(const std::string& text);

class MetricsServer {
 public:
  static constexpr std::size_t k_header_limit = 8192;
  static constexpr int k_max_connections = 64;
  static constexpr std::chrono::seconds k_header_timeout{5};
  static constexpr std::chrono::seconds k_response_timeout{10};
  static constexpr std::chrono::milliseconds k_render_every{500};

  MetricsServer(boost::asio::io_context& io, std::function<std::string()> render);
  ~MetricsServer();
  Result<bool> listen(const HttpEndpoint& at);
  unsigned short port() const;  // the one bound (after listen)
  void close();

  struct State;  // shared with the connections, which may outlive a close()

 private:
  void accept();
  boost::asio::io_context& m_io;
  std::shared_ptr<State> m_state;
};

// Writes render() to `path` atomically now and every `every`, while the io_context runs.
class MetricsTextfile {
 public:
  MetricsTextfile(boost::asio::io_context& io, std::string path, std::function<std::string()> render,
                  std::chrono::milliseconds every = std::chrono::seconds(10));
  void start();

 private:
  void write();
  boost::asio::steady_timer m_timer;
  std::string m_path;
  std::function<std::string()> m_render;
  std::chrono::milliseconds m_every;
  std::string m_last_error;  // said once, not every period
};

}  // namespace gpuq::daemon
