// Helpers shared by the CLI's commands (see rpc.hpp).
#include "cli/rpc.hpp"

#include "cli/format.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

namespace gpuq::cli {

using json = nlohmann::json;
using common::Client;

int report(const Error& e) {
  std::cerr << "gpuq: " << printable_lines(e.message) << "\n";  // may quote a job's words
  return e.code == ErrorCode::unavailable ? k_exit_unavailable
         : e.code == ErrorCode::forbidden ? k_exit_forbidden
                                          : k_exit_refused;
}

void outlive_restarts(const Options& o, Client& client) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  const double window = o.reconnect_s;
  client.reconnect_for(window, [tty, window](const std::string& what) {
    if (!tty) return;
    std::cerr << "gpuq: " << what;
    if (what != "reconnected") std::cerr << " for up to " << window << " s";
    std::cerr << "\n";
  });
}

Result<Client> connect(const Options& o, bool waiting) {
  auto client = Client::connect(o.socket);
  const auto unanswered = [&] {
    return waiting && !client && client.error().code == ErrorCode::unavailable && std::filesystem::exists(o.socket);
  };
  if (o.reconnect_s > 0 && unanswered() && ::isatty(STDERR_FILENO) == 1)
    std::cerr << "gpuq: gpuqd does not answer on " << o.socket << "; waiting for up to " << o.reconnect_s << " s\n";
  for (common::Backoff backoff(o.reconnect_s); unanswered() && backoff.wait();) client = Client::connect(o.socket);
  return client;
}

Result<json> call(const Options& o, const json& req, bool reconnect) {
  auto client = connect(o, reconnect);
  if (!client) return client.error();
  if (reconnect) outlive_restarts(o, *client);
  return client->call(req);
}

Result<common::JobsReply> all_results(Client& client, common::ResultsRequest req) {
  common::JobsReply all;
  for (bool more = true; more;) {
    auto page = client.call(common::cmd::results, req);
    if (!page) return page.error();
    more = page->more && !page->jobs.empty();
    if (more) req.after = page->jobs.back().id;
    std::move(page->jobs.begin(), page->jobs.end(), std::back_inserter(all.jobs));
  }
  return all;
}

Result<common::JobsReply> all_results(const Options& o, const common::ResultsRequest& req) {
  auto client = connect(o);
  if (!client) return client.error();
  return all_results(*client, req);
}

void print_json(const json& j) { std::cout << j.dump(2) << "\n"; }

Result<common::WatchReply> stream_position(Client& client) {
  if (client.hello().value("protocol_minor", 0) < 2) return common::WatchReply{};
  common::WatchRequest now;
  now.timeout_s = 0;
  return client.call(common::cmd::watch, now);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int add_batch_ids(const Options& o, std::int64_t batch, std::vector<std::int64_t>& ids) {
  if (batch != 0) {
    common::ResultsRequest req;
    req.batch = batch;
    auto reply = all_results(o, req);
    if (!reply) return report(reply.error());
    for (const auto& j : reply->jobs)
      if (std::find(ids.begin(), ids.end(), j.id) == ids.end()) ids.push_back(j.id);
  }
  if (ids.empty()) {
    std::cerr << "gpuq: give job ids or --batch B\n";
    return k_exit_usage;
  }
  return 0;
}

}  // namespace gpuq::cli
