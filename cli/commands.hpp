// The gpuq subcommands. Each returns the process exit code (docs/cli.md):
//   0 success; 1 a job did not succeed (wait, submit --wait); 2 usage error;
//   3 gpuqd not reachable; 4 gpuqd refused the request; 124 wait timed out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/protocol.hpp"

namespace gpuq::cli {

constexpr int k_exit_ok = 0;
constexpr int k_exit_job_failed = 1;
constexpr int k_exit_usage = 2;
constexpr int k_exit_unavailable = 3;
constexpr int k_exit_refused = 4;
constexpr int k_exit_timeout = 124;

struct Options {
  std::string socket;  // resolved: --socket, $GPUQ_SOCKET, default
  bool json = false;
  // How long `wait`, `submit --wait` and `logs -f` keep reconnecting after losing gpuqd (a
  // restart is ordinary: systemctl restart, a crash and its restart); setting reconnect_s.
  double reconnect_s = 60;
};

// Appends the ids of `batch`'s jobs (if batch != 0) to `ids`; 0, or the exit code of a failure
// (also a usage error when there are no ids at all).
int add_batch_ids(const Options& o, std::int64_t batch, std::vector<std::int64_t>& ids);

// `hold`: the jobs are queued held, none starts before `release`. `max_running`: at most this
// many of the batch run at once (0: no limit).
int cmd_submit(const Options& o, const std::vector<std::string>& files, bool wait, bool dry_run = false,
               bool hold = false, int max_running = 0);
// `filter`: only the jobs of a batch, in some states, with names matching a glob.
int cmd_status(const Options& o, bool all, int limit, std::int64_t queued = -2, const common::JobFilter& filter = {});
int cmd_show(const Options& o, std::int64_t id);
// `tail` >= 0: only the last `tail` lines of each rank's log (of the chosen attempt), as tail -n.
int cmd_logs(const Options& o, std::int64_t id, bool follow, int rank, int attempt, int tail = -1);
int cmd_cancel(const Options& o, const std::vector<std::int64_t>& ids);
// Removes ended jobs' files (or only their checkpoints; or with `forget` their records too): `ids`,
// the ended jobs of `batch`, those that ended over `older_than_s` ago (< 0: no age limit; alone:
// every such job).
int cmd_clean(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, double older_than_s,
              bool checkpoints_only, bool forget);
// Sets `set`'s spec fields (priority, retries, timeout_s) of `ids` and the queued jobs of `batch`.
int cmd_update(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, const nlohmann::json& set);
// Holds queued jobs out of line (`hold`), or releases them: `ids` and the queued jobs of `batch`.
int cmd_hold(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, bool hold);
// Queues ended jobs again (any of `ids`; the unsuccessful ones of `batch`), with the jobs that
// failed waiting for them; `fresh` empties their checkpoint directories first.
int cmd_restart(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, bool fresh);
int cmd_wait(const Options& o, const std::vector<std::int64_t>& ids, double timeout_s);
int cmd_result(const Options& o, std::int64_t id);
// `fields`: the result fields to show as columns (default: all plain ones, metrics first, as
// many as fit a terminal).
int cmd_results(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch,
                const std::vector<std::string>& fields);
int cmd_gpus(const Options& o);
int gpus_request(const Options& o, const nlohmann::json& req);
// Takes GPUs out of service (`drain`, with why) or back; prints the GPUs as `gpus` does.
int cmd_drain(const Options& o, const std::vector<std::string>& gpus, bool drain, const std::string& reason);
struct PlotArgs {
  std::vector<std::int64_t> ids;
  std::string output;  // .png or .svg
  std::string x = "auto";
  std::vector<std::string> metrics;  // empty: the loss and accuracy fields
  int attempt = 0;                   // 0: each job's latest
  std::string title;
  int width = 1100;
  bool log_y = false;
};
int cmd_plot(const Options& o, const PlotArgs& a);
// One attempt's events (0: the latest), of `type` ("progress", "result", or "" for both).
int cmd_events(const Options& o, std::int64_t id, int attempt, const std::string& type);
// interval_s between refreshes; once (or stdout not a terminal): print one frame and return.
int cmd_top(const Options& o, double interval_s, bool once);
// The settings in effect (socket and the daemon defaults of the configuration file) and their sources.
int cmd_config(const Options& o, const common::Settings& s, const std::string& socket_flag);
int cmd_daemon_start(const Options& o, const std::string& state_dir, const std::string& gpus);
int cmd_daemon_stop(const Options& o);
int cmd_daemon_status(const Options& o);

}  // namespace gpuq::cli
