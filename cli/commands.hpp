// The gpuq subcommands and their registrations. Each command returns the process exit code (docs/cli.md):
//   0 success; 1 a job did not succeed (wait, submit --wait); 2 usage error;
//   3 gpuqd not reachable; 4 gpuqd refused the request; 124 wait timed out.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.hpp"
#include "common/protocol.hpp"

namespace CLI {
class App;
}
namespace gpuq::common {
class Client;
}

namespace gpuq::cli {

constexpr int k_exit_ok = 0;
constexpr int k_exit_job_failed = 1;
constexpr int k_exit_usage = 2;
constexpr int k_exit_unavailable = 3;
constexpr int k_exit_refused = 4;
constexpr int k_exit_forbidden = 5;  // another user's job, an admin's command, or a caller gpuqd does not serve
constexpr int k_exit_timeout = 124;

struct Options {
  std::string socket;  // resolved: --socket, $GPUQ_SOCKET, default
  bool json = false;
  // How long `wait`, `submit --wait` and `logs -f` keep reconnecting after losing gpuqd (a
  // restart is ordinary: systemctl restart, a crash and its restart); setting reconnect_s.
  double reconnect_s = 60;
};

// What the chosen command runs, and the global options it reads (filled in after parsing).
struct Context {
  Options opt;
  std::function<int()> run;  // set by the command's parse callback
  // Read after parsing, before `run`: the settings in effect, and "--socket" when the flag set it.
  common::Settings settings;
  std::string socket_flag;
  // `gpuq run`'s command when the command line gave it after --: the arguments there, as given.
  bool command_given = false;
  std::vector<std::string> command;
};

// The commands, by group (cli/commands/*.cpp). Each registration adds one command (or a pair
// that share their options: hold/release, drain/undrain) to `app`, with the options it owns.
using Registration = void (*)(CLI::App& app, Context& ctx);
struct Command {
  std::string_view name;
  Registration add;
};
// Every command in the order `gpuq --help` lists them: the one list of gpuq's commands.
const std::vector<Command>& command_table();

void add_submit(CLI::App& app, Context& ctx);  // submit.cpp
void add_run(CLI::App& app, Context& ctx);
void add_export(CLI::App& app, Context& ctx);
void add_status(CLI::App& app, Context& ctx);  // jobs.cpp
void add_show(CLI::App& app, Context& ctx);
void add_why(CLI::App& app, Context& ctx);
void add_logs(CLI::App& app, Context& ctx);
void add_wait(CLI::App& app, Context& ctx);
void add_result(CLI::App& app, Context& ctx);
void add_results(CLI::App& app, Context& ctx);
void add_cancel(CLI::App& app, Context& ctx);   // control.cpp
void add_requeue(CLI::App& app, Context& ctx);  // control.cpp
void add_preempt(CLI::App& app, Context& ctx);  // control.cpp
void add_restart(CLI::App& app, Context& ctx);
void add_hold(CLI::App& app, Context& ctx);  // hold and release
void add_update(CLI::App& app, Context& ctx);
void add_clean(CLI::App& app, Context& ctx);
void add_gpus(CLI::App& app, Context& ctx);   // gpus.cpp
void add_drain(CLI::App& app, Context& ctx);  // drain and undrain
void add_usage(CLI::App& app, Context& ctx);
void add_plot(CLI::App& app, Context& ctx);   // events.cpp
void add_events(CLI::App& app, Context& ctx);
void add_top(CLI::App& app, Context& ctx);     // top.cpp
void add_config(CLI::App& app, Context& ctx);  // daemon.cpp
void add_daemon(CLI::App& app, Context& ctx);
void add_schema(CLI::App& app, Context& ctx);  // daemon.cpp

// Prints a job's output; with `follow`, until it ends (logs.cpp; run --follow).
int cmd_logs(const Options& o, std::int64_t id, bool follow, int rank, int attempt, int tail);
// Waits for jobs to end: 0 if all succeeded, 1 if not, 124 on timeout (jobs.cpp; submit --wait).
int cmd_wait(const Options& o, const std::vector<std::int64_t>& ids, double timeout_s);
// The same on a connection already open, from where gpuqd's watch stream stood before the jobs
// went live (`submit --wait`: the submit's reply; epoch 0 for none): their first look comes with
// the first watch.
int cmd_wait(const Options& o, common::Client& client, const std::vector<std::int64_t>& ids, double timeout_s,
             std::int64_t epoch, std::int64_t cursor);

}  // namespace gpuq::cli
