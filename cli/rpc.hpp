// Helpers shared by the CLI's commands: a connection or one request to gpuqd, every page of a
// results request, JSON output. One error style: each returns its value or the Error, and a
// command that cannot go on returns report(error), which prints it and gives the exit code.
#pragma once

#include <optional>

#include "cli/commands.hpp"
#include "common/client.hpp"

namespace gpuq::cli {

// Prints "gpuq: <message>" and returns the exit code for the error (3 unreachable, 4 refused).
int report(const Error& e);
// Makes `client` reconnect for o.reconnect_s after losing gpuqd, saying so on stderr when it is a
// terminal: for clients that wait on gpuqd (`wait`, `submit --wait`, `logs -f`).
void outlive_restarts(const Options& o, common::Client& client);
// A connection to gpuqd. `waiting`: for a client that waits on gpuqd, a socket that is there but
// unanswered (a gpuqd killed and not yet back) is waited out for o.reconnect_s, as a connection
// lost later is (outlive_restarts); no socket at all is no daemon, said at once.
Result<common::Client> connect(const Options& o, bool waiting = false);
// Connects and sends one request (common::encode's); its reply, or the error. `reconnect`: the
// request is idempotent and waits on gpuqd, so a lost gpuqd is reconnected to (outlive_restarts).
Result<nlohmann::json> call(const Options& o, const nlohmann::json& req, bool reconnect = false);
// The same for command C (common::cmd::…): its reply as C's reply type, or the error.
template <class Request, class Reply>
Result<Reply> call(const Options& o, const common::Cmd<Request, Reply>& command, const Request& req = {},
                   bool reconnect = false) {
  auto body = call(o, common::encode(command, req), reconnect);
  if (!body) return body.error();
  return common::read_reply<Reply>(*body);
}
// Every job a `results` request names, over as many pages as gpuqd sends (each reply is bounded:
// common::k_max_reply_jobs), in id order.
Result<common::JobsReply> all_results(common::Client& client, common::ResultsRequest req);
Result<common::JobsReply> all_results(const Options& o, const common::ResultsRequest& req);
void print_json(const nlohmann::json& j);
// Where gpuqd's watch stream stands now (a watch answered at once): the epoch and cursor to follow
// from, taken before a look at the jobs, so that a change in between is told again, never lost.
// Epoch 0 from a gpuqd without the watch (protocol minor 2).
Result<common::WatchReply> stream_position(common::Client& client);
// Appends the ids of `batch`'s jobs (if batch != 0) to `ids`; 0, or the exit code of a failure
// (also a usage error when there are no ids at all).
int add_batch_ids(const Options& o, std::int64_t batch, std::vector<std::int64_t>& ids);
double now_s();  // unix seconds

}  // namespace gpuq::cli
