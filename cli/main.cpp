// gpuq: the command-line client of gpuqd. main is the list of commands (cli/commands/*.cpp, each
// owning its options), the global options, and the settings; then the chosen command runs.
//
// gpuq runs once per command, often once per job from a sweep script, so only the command named
// on the command line is registered: building every command's parser on each start was a cost
// every call paid (bench/cli_startup.py). Help, and a command line naming none, get them all.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <iostream>
#include <string_view>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "common/client.hpp"
#include "common/protocol.hpp"
#include "common/config.hpp"
#include "common/paths.hpp"
#include "common/users.hpp"

namespace gpuq::cli {

const std::vector<Command>& command_table() {
  static const std::vector<Command> k_commands{
      {"run", add_run},       {"submit", add_submit},   {"status", add_status},   {"show", add_show},
      {"logs", add_logs},     {"cancel", add_cancel},   {"restart", add_restart}, {"hold", add_hold},
      {"release", add_hold},  {"update", add_update},   {"clean", add_clean},     {"wait", add_wait},
      {"result", add_result}, {"results", add_results}, {"gpus", add_gpus},       {"drain", add_drain},
      {"undrain", add_drain}, {"plot", add_plot},       {"events", add_events},   {"top", add_top},
      {"config", add_config}, {"daemon", add_daemon},   {"export", add_export},   {"usage", add_usage},
      {"why", add_why},       {"schema", add_schema},   {"requeue", add_requeue}, {"preempt", add_preempt},
  };
  return k_commands;
}

namespace {

// The command a command line names: its first word that is not a global option (or an option's
// value). Empty when there is none, or when help is asked for before it.
std::string_view named_command(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--socket") {
      ++i;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "--help-all") return {};
    if (!arg.empty() && arg[0] == '-') continue;
    return arg;
  }
  return {};
}

}  // namespace

}  // namespace gpuq::cli

int main(int argc, char** argv) {
  using namespace gpuq::cli;

  CLI::App app{"gpuq: a multi-GPU job queue. Submit jobs, watch them, collect their results.\n"
               "The daemon (gpuqd) is found through --socket, else $GPUQ_SOCKET, else `socket` in the "
               "configuration file (" + gpuq::common::config_path() + "), else " +
               gpuq::common::default_socket_path() + "."};
  app.set_version_flag("--version", GPUQ_VERSION);
  app.require_subcommand(1);
  std::string socket;
  app.add_option("--socket", socket, "gpuqd's unix socket");

  Context ctx;
  const std::string_view named = named_command(argc, argv);
  const auto& table = gpuq::cli::command_table();
  const bool known = std::any_of(table.begin(), table.end(), [&](const Command& c) { return c.name == named; });
  const bool version_only = named.empty() && argc == 2 && std::strcmp(argv[1], "--version") == 0;
  Registration registered = nullptr;  // hold and release (drain and undrain) share one, listed together
  for (const auto& c : table) {
    // A word that names no command gets every command, so that the error lists them.
    if ((known && c.name != named) || version_only || c.add == registered) continue;
    c.add(app, ctx);
    registered = c.add;
  }

  // `gpuq run [options] -- PROGRAM ARGS...`: what follows the first -- is the command, untouched
  // (CLI11 would take a -- after a repeatable option for that option's end).
  if (named == "run")
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], "--") == 0) {
        ctx.command_given = true;
        ctx.command.assign(argv + i + 1, argv + argc);
        argc = i;
        break;
      }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? k_exit_ok : k_exit_usage;
  }
  // Settings: the command line, else $GPUQ_SOCKET, else the configuration file, else the default
  auto settings = gpuq::common::load_settings();
  if (!settings) {
    std::cerr << "gpuq: " << settings.error().message << "\n";
    return k_exit_usage;
  }
  ctx.opt.socket = !socket.empty()                ? socket
                    : !settings->socket_path.empty() ? settings->socket_path
                                                    : gpuq::common::default_socket_path();
  // A user who runs no gpuqd of their own, on a machine whose lab gpuqd serves everyone: that one.
  if (socket.empty() && settings->socket_path.empty() && !gpuq::common::path_exists(ctx.opt.socket) &&
      gpuq::common::path_exists(gpuq::common::k_lab_socket))
    ctx.opt.socket = gpuq::common::k_lab_socket;
  ctx.opt.reconnect_s = settings->reconnect_s;
  gpuq::common::Client::set_reply_timeout(settings->reply_timeout_s);
  ctx.settings = std::move(*settings);
  ctx.socket_flag = socket.empty() ? "" : "--socket";
  if (!ctx.run) return k_exit_usage;
  try {
    return ctx.run();
  } catch (const gpuq::common::ReplyFieldError& e) {
    // A reply this gpuq cannot read (a gpuqd of another version, or not gpuqd): said, never an abort
    std::cerr << "gpuq: gpuqd's reply is not one this gpuq (" GPUQ_VERSION ") understands: "
              << gpuq::cli::printable(e.what()) << "\n";
    return k_exit_refused;
  } catch (const nlohmann::json::exception& e) {  // a reply read field by field, or text that is not UTF-8
    std::cerr << "gpuq: cannot use gpuqd's reply or encode the request: "
              << gpuq::cli::printable(gpuq::common::detail::plain_message(e)) << "\n";
    return k_exit_refused;
  }
}
