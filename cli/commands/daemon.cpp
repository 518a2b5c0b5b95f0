// gpuqd itself: `gpuq daemon start|stop|status`, and `gpuq config`.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <iostream>
#include <thread>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/paths.hpp"
#include "common/protocol.hpp"

namespace gpuq::cli {

using json = nlohmann::json;
using common::Client;

namespace {

int cmd_config(const Options& o, const common::Settings& s, const std::string& socket_flag) {
  const std::string path = common::config_path();
  json settings = common::settings_json(s);  // every key that is set, from the one table
  if (!socket_flag.empty()) settings["socket"] = {{"value", o.socket}, {"from", socket_flag}};
  if (o.json) {
    print_json({{"file", path}, {"file_found", !s.file.empty()}, {"socket", o.socket}, {"settings", settings}});
    return k_exit_ok;
  }
  std::cout << "configuration file: " << (path.empty() ? "none ($GPUQ_CONFIG is empty)" : path)
            << (path.empty() || !s.file.empty() ? "" : " (not present)") << "\n"
            << "socket: " << o.socket << (settings.contains("socket") ? "" : " (default)") << "\n";
  if (settings.empty()) {
    std::cout << "no settings from the file or the environment; gpuqd uses its built-in defaults\n";
    return k_exit_ok;
  }
  Table t({"SETTING", "VALUE", "FROM"});
  for (const auto& [k, v] : settings.items()) t.add({k, format_value(v["value"]), v["from"].get<std::string>()});
  t.print(std::cout);
  return k_exit_ok;
}

int cmd_daemon_start(const Options& o, const std::string& state_dir, const std::string& gpus) {
  if (auto c = Client::connect(o.socket)) {
    std::cout << "gpuqd is already running on " << o.socket << " (pid " << c->hello().value("pid", 0) << ")\n";
    return k_exit_ok;
  }
  std::string gpuqd = common::self_dir() + "/gpuqd";
  if (::access(gpuqd.c_str(), X_OK) != 0) gpuqd = "gpuqd";  // installed elsewhere: use PATH
  // gpuq takes paths relative to where it runs; gpuqd, a daemon, only absolute ones.
  auto absolute = [](const std::string& p) { return p.empty() || p[0] == '/' ? p : common::current_dir() + "/" + p; };
  std::vector<std::string> args{gpuqd, "--socket", absolute(o.socket)};
  if (!state_dir.empty()) args.insert(args.end(), {"--state-dir", absolute(state_dir)});
  if (!gpus.empty()) args.insert(args.end(), {"--gpus", gpus});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawnp(&pid, gpuqd.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::cerr << "gpuq: cannot run " << gpuqd << "\n";
    return k_exit_unavailable;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);  // gpuqd returns once it listens (or failed, with its message)
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return k_exit_unavailable;
  std::cout << "gpuqd started on " << o.socket << "\n";
  return k_exit_ok;
}

int cmd_daemon_stop(const Options& o) {
  auto c = Client::connect(o.socket);
  if (!c) {
    std::cout << "gpuqd is not running on " << o.socket << "\n";
    return k_exit_ok;
  }
  if (auto r = c->call(common::cmd::shutdown); !r) return report(r.error());
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!Client::connect(o.socket)) {
      std::cout << "gpuqd stopped (running jobs keep running and are re-adopted at the next start)\n";
      return k_exit_ok;
    }
  }
  std::cerr << "gpuq: gpuqd did not stop within 5 s\n";
  return k_exit_unavailable;
}

int cmd_daemon_status(const Options& o) {
  auto c = Client::connect(o.socket);
  if (!c) {
    if (o.json) print_json({{"running", false}, {"socket", o.socket}});
    else std::cout << "gpuqd is not running on " << o.socket << "\n";
    return k_exit_unavailable;
  }
  const auto& h = c->hello();
  if (o.json) {
    print_json({{"running", true}, {"socket", o.socket}, {"pid", h.value("pid", 0)}, {"version", h.value("daemon_version", "")},
                {"state_dir", h.value("state_dir", "")}, {"multi_user", h.value("multi_user", false)},
                {"protocol", std::to_string(h.value("protocol_version", 0)) + "." +
                                 std::to_string(h.value("protocol_minor", 0))}});
  } else {
    std::cout << "gpuqd " << h.value("daemon_version", "?") << " running, pid " << h.value("pid", 0) << "\n  socket:    "
              << o.socket << "\n  state dir: " << h.value("state_dir", "?") << "\n";
  }
  return k_exit_ok;
}

}  // namespace

void add_config(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("config", "Show the settings in effect and where each comes from");
  add_json_flag(sub, ctx);
  sub->callback([&ctx] { ctx.run = [&ctx] { return cmd_config(ctx.opt, ctx.settings, ctx.socket_flag); }; });
}

void add_schema(CLI::App& app, Context& ctx) {
  app.add_subcommand("schema",
                     "Print the JSON Schema of gpuqd's protocol: every command's request and reply "
                     "(docs/protocol.schema.json)")
      ->callback([&ctx] {
        ctx.run = [] {
          std::cout << common::protocol_schema().dump(2) << "\n";
          return k_exit_ok;
        };
      });
}

void add_daemon(CLI::App& app, Context& ctx) {
  struct Args {
    std::string state_dir, gpus;
  };
  auto a = args<Args>();
  auto* daemon = app.add_subcommand("daemon", "Start, stop or check gpuqd");
  daemon->require_subcommand(1);
  auto* start = daemon->add_subcommand("start", "Start gpuqd in the background (no-op if running)");
  start->add_option("--state-dir", a->state_dir, "State directory");
  start->add_option("--gpus", a->gpus, "auto, nvml, none or fake:N[:MiB[:NODES]]");
  start->callback([&ctx, a] { ctx.run = [&ctx, a] { return cmd_daemon_start(ctx.opt, a->state_dir, a->gpus); }; });
  auto* stop = daemon->add_subcommand("stop", "Stop gpuqd (running jobs keep running)");
  stop->callback([&ctx] { ctx.run = [&ctx] { return cmd_daemon_stop(ctx.opt); }; });
  auto* status = daemon->add_subcommand("status", "Is gpuqd running? Exit 3 if not");
  add_json_flag(status, ctx);
  status->callback([&ctx] { ctx.run = [&ctx] { return cmd_daemon_status(ctx.opt); }; });
}

}  // namespace gpuq::cli
