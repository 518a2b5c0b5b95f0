// Helpers shared by the CLI's commands: one request to gpuqd with errors printed, JSON output.
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
// Connects and sends one request; on failure prints the error and sets `code`. `reconnect`: the
// request is idempotent and waits on gpuqd, so a lost gpuqd is reconnected to (outlive_restarts).
std::optional<nlohmann::json> request(const Options& o, const nlohmann::json& req, int& code, bool reconnect = false);
// Every job a `results` request names, over as many pages as gpuqd sends (each reply is bounded:
// common::k_max_reply_jobs), in id order.
Result<common::JobsReply> all_results(common::Client& client, nlohmann::json req);
std::optional<common::JobsReply> all_results(const Options& o, const nlohmann::json& req, int& code);
void print_json(const nlohmann::json& j);
double now_s();  // unix seconds

}  // namespace gpuq::cli
