// The metrics endpoint and textfile (metrics_http.hpp). The only TU with Boost.Beast.
#include "daemon/metrics_http.hpp"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <iostream>
#include <list>

#include "common/process.hpp"

namespace gpuq::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Result<HttpEndpoint> parse_http_endpoint(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Error{ErrorCode::bad_request, "metrics_listen " + text + ": " + why};
  };
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) return bad("expected HOST:PORT, as 127.0.0.1:9464");
  std::string host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    return bad("the port must be a number from 0 to 65535");
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  if (host.empty() || ec) return bad("the host must be an IP address (127.0.0.1, [::1], 0.0.0.0) or localhost");
  return HttpEndpoint{host, static_cast<unsigned short>(std::stoi(port))};
}

class MetricsConnection;

struct MetricsServer::State {
  explicit State(asio::io_context& io) : acceptor(io) {}
  tcp::acceptor acceptor;
  std::function<std::string()> render;
  int open = 0;                                        // connections now
  std::list<std::weak_ptr<MetricsConnection>> by_age;  // the open ones, the oldest first
  std::string cached;
  std::chrono::steady_clock::time_point rendered_at{};
  const std::string& text() {
    const auto now = std::chrono::steady_clock::now();
    if (cached.empty() || now - rendered_at >= k_render_every) {
      cached = render();
      rendered_at = now;
    }
    return cached;
  }
};

class MetricsConnection : public std::enable_shared_from_this<MetricsConnection> {
 public:
  MetricsConnection(tcp::socket socket, std::shared_ptr<MetricsServer::State> state)
      : m_stream(std::move(socket)), m_state(std::move(state)) {}
  ~MetricsConnection() { leave(); }

  void start() {
    ++m_state->open;
    m_age = m_state->by_age.insert(m_state->by_age.end(), weak_from_this());
    m_counted = true;
    m_parser.header_limit(MetricsServer::k_header_limit);
    m_parser.body_limit(0);
    m_stream.expires_after(MetricsServer::k_header_timeout);  // the whole request, however it trickles in
    http::async_read(m_stream, m_buffer, m_parser,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit) return respond(http::status::request_header_fields_too_large, "header too large\n");
    if (ec) return close();  // timed out, gone, not HTTP, a body: nothing to answer
    const auto& req = m_parser.get();
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get && req.method() != http::verb::head)
      return respond(http::status::method_not_allowed, "only GET /metrics\n");
    if (path != "/metrics") return respond(http::status::not_found, "gpuqd serves /metrics\n");
    respond(http::status::ok, m_state->text(), "text/plain; version=0.0.4; charset=utf-8",
            req.method() == http::verb::head);
  }

  void respond(http::status status, const std::string& body, const char* type = "text/plain; charset=utf-8",
               bool head = false) {
    m_response.result(status);
    m_response.version(11);
    m_response.set(http::field::server, "gpuqd");
    m_response.set(http::field::content_type, type);
    if (status == http::status::method_not_allowed) m_response.set(http::field::allow, "GET, HEAD");
    m_response.keep_alive(false);
    m_response.body() = head ? std::string() : body;
    m_response.prepare_payload();
    if (head) m_response.content_length(body.size());
    m_stream.expires_after(MetricsServer::k_response_timeout);  // a reader too slow for the answer is dropped
    http::async_write(m_stream, m_response,
                      [self = shared_from_this()](beast::error_code, std::size_t) { self->close(); });
  }

  void close() {
    beast::error_code ec;
    m_stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    m_stream.close();
  }

 public:
  // Closed to make room for a newer one (MetricsServer::accept); no longer counted from now.
  void evict() {
    leave();
    close();  // its handler runs with an error and does nothing more
  }

 private:
  void leave() {
    if (!std::exchange(m_counted, false)) return;
    --m_state->open;
    m_state->by_age.erase(m_age);
  }

  beast::tcp_stream m_stream;
  std::shared_ptr<MetricsServer::State> m_state;
  std::list<std::weak_ptr<MetricsConnection>>::iterator m_age;
  bool m_counted = false;  // in `open` and `by_age`
  beast::flat_buffer m_buffer{MetricsServer::k_header_limit * 2};
  http::request_parser<http::empty_body> m_parser;
  http::response<http::string_body> m_response;
};

MetricsServer::MetricsServer(asio::io_context& io, std::function<std::string()> render)
    : m_io(io), m_state(std::make_shared<State>(io)) {
  m_state->render = std::move(render);
}

MetricsServer::~MetricsServer() { close(); }

Result<bool> MetricsServer::listen(const HttpEndpoint& at) {
  boost::system::error_code ec;
  const tcp::endpoint ep(asio::ip::make_address(at.host, ec), at.port);
  auto fail = [&](const char* what) {
    return Error{ErrorCode::unavailable, std::string("metrics_listen ") + at.host + ":" + std::to_string(at.port) +
                                             ": cannot " + what + ": " + ec.message()};
  };
  if (ec) return fail("parse the address");
  m_state->acceptor.open(ep.protocol(), ec);
  if (ec) return fail("open a socket");
  m_state->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  ::fcntl(m_state->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);  // not into jobs' supervisors
  m_state->acceptor.bind(ep, ec);
  if (ec) return fail("bind");
  m_state->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen");
  accept();
  return true;
}

unsigned short MetricsServer::port() const {
  boost::system::error_code ec;
  return m_state->acceptor.local_endpoint(ec).port();
}

void MetricsServer::close() {
  boost::system::error_code ec;
  m_state->acceptor.close(ec);
}

void MetricsServer::accept() {
  m_state->acceptor.async_accept([this, state = m_state](boost::system::error_code ec, tcp::socket socket) {
    if (!state->acceptor.is_open()) return;
    if (!ec) {
      ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
      // Full: the oldest goes. A scrape is answered within a few turns of the thread, so what has
      // been open longest is what is stuck (a client that sends slowly or not at all); closing the
      // newest instead let 64 held connections blind Prometheus for as long as they were held.
      while (state->open >= k_max_connections && !state->by_age.empty()) {
        if (auto oldest = state->by_age.front().lock())
          oldest->evict();
        else
          state->by_age.pop_front();  // (not reached: each leaves the list as it closes)
      }
      std::make_shared<MetricsConnection>(std::move(socket), state)->start();
      accept();
    } else {
      // Out of file descriptors, say: try again shortly rather than spin.
      auto timer = std::make_shared<asio::steady_timer>(m_io, std::chrono::milliseconds(100));
      timer->async_wait([this, timer, state](const boost::system::error_code&) {
        if (state->acceptor.is_open()) accept();
      });
    }
  });
}

MetricsTextfile::MetricsTextfile(asio::io_context& io, std::string path, std::function<std::string()> render,
                                 std::chrono::milliseconds every)
    : m_timer(io), m_path(std::move(path)), m_render(std::move(render)), m_every(every) {}

void MetricsTextfile::start() { write(); }

void MetricsTextfile::write() {
  auto w = common::write_file_atomic(m_path, m_render(), 0644);  // node_exporter runs as a user of its own
  const std::string error = w ? "" : w.error().message;
  if (!error.empty() && error != m_last_error) std::cerr << "gpuqd: metrics_textfile: " << error << "\n";
  m_last_error = error;
  m_timer.expires_after(m_every);
  m_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) write();
  });
}

}  // namespace gpuq::daemon
