// Helpers shared by the CLI's commands: a connection or one request to gpuqd with errors printed,
// every page of a results request, JSON output.
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
// A connection to gpuqd, or nothing with the error printed and `code` set. `waiting`: for a client
// that waits on gpuqd, a socket that is there but unanswered (a gpuqd killed and not yet back)
// is waited out for o.reconnect_s, as a connection lost later is (outlive_restarts); no socket
// at all is no daemon, said at once.
std::optional<common::Client> connect(const Options& o, int& code, bool waiting = false);
// Connects and sends one request; on failure prints the error and sets `code`. `reconnect`: the
// request is idempotent and waits on gpuqd, so a lost gpuqd is reconnected to (outlive_restarts).
std::optional<nlohmann::json> request(const Options& o, const nlohmann::json& req, int& code, bool reconnect = false);
// Every job a `results` request names, over as many pages as gpuqd sends (each reply is bounded:
// common::k_max_reply_jobs), in id order.
Result<common::JobsReply> all_results(common::Client& client, common::ResultsRequest req);
std::optional<common::JobsReply> all_results(const Options& o, const common::ResultsRequest& req, int& code);
void print_json(const nlohmann::json& j);
// Appends the ids of `batch`'s jobs (if batch != 0) to `ids`; 0, or the exit code of a failure
// (also a usage error when there are no ids at all).
int add_batch_ids(const Options& o, std::int64_t batch, std::vector<std::int64_t>& ids);
double now_s();  // unix seconds

}  // namespace gpuq::cli
