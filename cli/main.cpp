// gpuq: the command-line client of gpuqd.
#include <CLI/CLI.hpp>
#include <functional>
#include <iostream>
#include <optional>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "common/config.hpp"
#include "common/paths.hpp"

int main(int argc, char** argv) {
  using namespace gpuq::cli;

  // Global options
  CLI::App app{"gpuq: a multi-GPU job queue. Submit jobs, watch them, collect their results.\n"
               "The daemon (gpuqd) is found through --socket, else $GPUQ_SOCKET, else `socket` in the "
               "configuration file (" + gpuq::common::config_path() + "), else " +
               gpuq::common::default_socket_path() + "."};
  app.set_version_flag("--version", GPUQ_VERSION);
  app.require_subcommand(1);
  Options opt;
  std::string socket;
  app.add_option("--socket", socket, "gpuqd's unix socket");
  std::function<int()> run;

  auto json_flag = [&](CLI::App* sub) { sub->add_flag("--json", opt.json, "Print JSON (schema in docs/cli.md)"); };

  // Subcommands
  std::vector<std::string> files;
  bool wait = false, dry_run = false, hold = false;
  auto* submit = app.add_subcommand("submit", "Submit jobs from JSON spec files ('-' reads stdin); one batch");
  submit->add_option("files", files, "Job spec files")->required();
  submit->add_flag("--wait,-w", wait, "Wait for the jobs; exit 1 unless all succeed");
  submit->add_flag("--dry-run,-n", dry_run, "Check the specs and list the jobs they make (matrices expanded); submit nothing")
      ->excludes("--wait");
  submit->add_flag("--hold", hold, "Queue the jobs held: none starts before `gpuq release`");
  int max_running = 0;
  submit->add_option("--max-running,-m", max_running, "Run at most N of the batch's jobs at once (Slurm's %N)")
      ->check(CLI::Range(1, gpuq::common::k_max_running_limit));
  json_flag(submit);
  submit->callback([&] { run = [&] { return cmd_submit(opt, files, wait, dry_run, hold, max_running); }; });

  bool all = false;
  int limit = 20;
  auto* status = app.add_subcommand("status", "Queued and running jobs, and the most recent finished ones");
  status->add_flag("--all,-a", all, "Every job in the history");
  status->add_option("--limit,-n", limit, "Finished jobs to show")->capture_default_str();
  std::int64_t queued = -2;  // not given: 50 in the table, every one with --json
  status->add_option("--queued,-q", queued, "Queued jobs to show, the first in line (default 50; --json: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  gpuq::common::JobFilter filter;
  status->add_option("--batch,-b", filter.batch, "Only the jobs of this batch");
  status->add_option("--state,-s", filter.states,
                     "Only jobs in these states: queued, running, succeeded, failed, cancelled, timed_out "
                     "(comma-separated, or the option again)")
      ->delimiter(',')
      ->check(CLI::IsMember({"queued", "running", "succeeded", "failed", "cancelled", "timed_out"}));
  status->add_option("--name", filter.name, "Only jobs whose names match this shell-style glob ('lr-*')");
  json_flag(status);
  status->callback([&] { run = [&] { return cmd_status(opt, all, limit, queued, filter); }; });

  std::int64_t id = 0;
  auto* show = app.add_subcommand("show", "Everything about one job: state history, failure, logs");
  show->add_option("id", id, "Job id")->required();
  json_flag(show);
  show->callback([&] { run = [&] { return cmd_show(opt, id); }; });

  bool follow = false;
  int rank = -1, attempt = 0;
  auto* logs = app.add_subcommand("logs", "Print a job's output (stdout and stderr)");
  logs->add_option("id", id, "Job id")->required();
  logs->add_flag("--follow,-f", follow, "Keep printing until the job ends, across retries");
  logs->add_option("--rank", rank, "Only this rank (ddp jobs)");
  logs->add_option("--attempt", attempt, "Only this attempt (default: the last; with -f, all)");
  int tail = -1;
  logs->add_option("--tail,-n", tail, "Only the last N lines of each rank's log, then (with -f) what follows")
      ->check(CLI::Range(0, 1 << 30));
  logs->callback([&] { run = [&] { return cmd_logs(opt, id, follow, rank, attempt, tail); }; });

  std::vector<std::int64_t> ids;
  auto* cancel = app.add_subcommand("cancel", "Cancel jobs: queued ones at once, running ones with SIGTERM, then SIGKILL");
  cancel->add_option("ids", ids, "Job ids");
  std::int64_t cancel_batch = 0;
  cancel->add_option("--batch,-b", cancel_batch, "Every job of this batch (besides any ids)");
  json_flag(cancel);
  cancel->callback([&] {
    run = [&] {
      int code = add_batch_ids(opt, cancel_batch, ids);
      return code ? code : cmd_cancel(opt, ids);
    };
  });

  std::int64_t batch = 0;
  bool fresh = false;
  auto* restart = app.add_subcommand(
      "restart", "Queue ended jobs again (same ids; train jobs resume from their checkpoints), with the jobs "
                 "that failed waiting for them");
  restart->add_option("ids", ids, "Job ids (any that ended)");
  restart->add_option("--batch,-b", batch, "The jobs of this batch that failed, were cancelled or timed out");
  restart->add_flag("--fresh", fresh, "Remove their checkpoints first: start over instead of resuming");
  json_flag(restart);
  restart->callback([&] {
    run = [&] {
      if (ids.empty() && batch == 0) {
        std::cerr << "gpuq restart: name job ids or --batch\n";
        return k_exit_usage;
      }
      return cmd_restart(opt, ids, batch, fresh);
    };
  });

  for (const bool holding : {true, false}) {
    auto* sub = holding ? app.add_subcommand("hold", "Keep queued jobs from starting (they wait out of line) until released")
                        : app.add_subcommand("release", "Let held jobs start");
    sub->add_option("ids", ids, "Job ids");
    sub->add_option("--batch,-b", batch, holding ? "Every queued job of this batch" : "Every held job of this batch");
    json_flag(sub);
    sub->callback([&, holding] {
      run = [&, holding] {
        if (ids.empty() && batch == 0) {
          std::cerr << "gpuq " << (holding ? "hold" : "release") << ": name job ids or --batch\n";
          return k_exit_usage;
        }
        return cmd_hold(opt, ids, batch, holding);
      };
    });
  }

  std::optional<int> new_priority, new_retries;
  std::string new_timeout;
  auto* update = app.add_subcommand("update", "Change waiting jobs' priority, retries or timeout (running ones: "
                                              "priority and retries, for their next attempt)");
  update->add_option("ids", ids, "Job ids");
  update->add_option("--batch,-b", batch, "Every queued job of this batch");
  update->add_option("--priority,-p", new_priority, "New priority (higher starts first)");
  update->add_option("--retries", new_retries, "New number of retries");
  update->add_option("--timeout", new_timeout, "New timeout: 90s, 30m, 12h, 2d, or none");
  std::string new_limit;
  update->add_option("--max-running,-m", new_limit, "The batch's new limit on jobs running at once, or none (needs --batch)");
  json_flag(update);
  update->callback([&] {
    run = [&] {
      nlohmann::json set = nlohmann::json::object();
      if (new_priority) set["priority"] = *new_priority;
      if (new_retries) set["retries"] = *new_retries;
      if (new_timeout == "none") {
        set["timeout_s"] = nullptr;
      } else if (!new_timeout.empty()) {
        auto parsed = parse_duration(new_timeout);
        if (!parsed) {
          std::cerr << "gpuq update: --timeout " << new_timeout << " is not a duration like 90s, 30m, 12h or 2d, or none\n";
          return k_exit_usage;
        }
        set["timeout_s"] = *parsed;
      }
      if (new_limit == "none") {
        set["max_running"] = nullptr;
      } else if (!new_limit.empty()) {
        const auto n = parse_int(new_limit, 1, gpuq::common::k_max_running_limit);
        if (!n) {
          std::cerr << "gpuq update: --max-running " << new_limit << " is not a number from 1 to "
                    << gpuq::common::k_max_running_limit << ", or none\n";
          return k_exit_usage;
        }
        if (batch == 0) {
          std::cerr << "gpuq update: --max-running is a batch's limit; name the batch with --batch\n";
          return k_exit_usage;
        }
        set["max_running"] = *n;
      }
      if ((ids.empty() && batch == 0) || set.empty()) {
        std::cerr << "gpuq update: name job ids or --batch, and what to change (--priority, --retries, --timeout, "
                     "--max-running)\n";
        return k_exit_usage;
      }
      return cmd_update(opt, ids, batch, set);
    };
  });

  std::string older_than;
  bool checkpoints_only = false, forget = false;
  auto* clean = app.add_subcommand(
      "clean", "Free the disk ended jobs take: remove their logs and checkpoints (results and history stay, "
               "unless --forget)");
  clean->add_option("ids", ids, "Job ids (ended ones)");
  clean->add_option("--batch,-b", batch, "The ended jobs of this batch");
  clean->add_option("--older-than", older_than, "Only jobs that ended this long ago: 90s, 30m, 12h, 7d, 2w (alone: every such job)");
  auto* ckpt = clean->add_flag("--checkpoints", checkpoints_only, "Remove only the checkpoints, keep the logs");
  clean->add_flag("--forget", forget,
                  "Remove the jobs' records too: status, show, results no longer know them (ids are not reused)")
      ->excludes(ckpt);
  json_flag(clean);
  clean->callback([&] {
    run = [&] {
      double age = -1;
      if (!older_than.empty()) {
        auto parsed = parse_duration(older_than);
        if (!parsed) {
          std::cerr << "gpuq clean: --older-than " << older_than << " is not a duration like 90s, 30m, 12h, 7d or 2w\n";
          return k_exit_usage;
        }
        age = *parsed;
      }
      if (ids.empty() && batch == 0 && age < 0) {
        std::cerr << "gpuq clean: name job ids, --batch or --older-than (--older-than 0 cleans every ended job)\n";
        return k_exit_usage;
      }
      return cmd_clean(opt, ids, batch, age, checkpoints_only, forget);
    };
  });

  double timeout_s = 0;
  auto* waitc = app.add_subcommand("wait", "Wait for jobs to end; exit 0 if all succeeded, 1 if not, 124 on timeout");
  waitc->add_option("ids", ids, "Job ids");
  waitc->add_option("--batch,-b", batch, "Every job of this batch (besides any ids)");
  waitc->add_option("--timeout", timeout_s, "Give up after this many seconds");
  json_flag(waitc);
  waitc->callback([&] {
    run = [&] {
      int code = add_batch_ids(opt, batch, ids);
      return code ? code : cmd_wait(opt, ids, timeout_s);
    };
  });

  auto* result = app.add_subcommand("result", "The final result a job reported");
  result->add_option("id", id, "Job id")->required();
  json_flag(result);
  result->callback([&] { run = [&] { return cmd_result(opt, id); }; });

  auto* results = app.add_subcommand("results", "Results of many jobs in one table");
  results->add_option("ids", ids, "Job ids");
  std::vector<std::string> fields;
  results->add_option("--batch,-b", batch, "Every job of this batch");
  results->add_option("--fields,-f", fields, "Result fields to show, comma-separated (default: all, metrics first)")
      ->delimiter(',');
  json_flag(results);
  results->callback([&] { run = [&] { return cmd_results(opt, ids, batch, fields); }; });

  auto* gpus = app.add_subcommand("gpus", "GPUs, their memory and which jobs hold them");
  json_flag(gpus);
  gpus->callback([&] { run = [&] { return cmd_gpus(opt); }; });

  std::vector<std::string> gpu_names;
  std::string drain_reason;
  for (const bool draining : {true, false}) {
    auto* sub = draining ? app.add_subcommand("drain", "Take GPUs out of service: no job is given them (jobs on them run on)")
                         : app.add_subcommand("undrain", "Put drained GPUs back in service");
    sub->add_option("gpus", gpu_names, "GPU indices as gpuq gpus shows them, or UUIDs (or a prefix: GPU-1a2b)")
        ->required();
    if (draining) sub->add_option("--reason,-r", drain_reason, "Why (shown by gpuq gpus)");
    json_flag(sub);
    sub->callback([&, draining] { run = [&, draining] { return cmd_drain(opt, gpu_names, draining, drain_reason); }; });
  }

  PlotArgs plot;
  auto* plotc = app.add_subcommand("plot", "Draw jobs' training curves (loss, accuracy) into one PNG or SVG chart");
  plotc->add_option("ids", plot.ids, "Job ids");
  plotc->add_option("--batch,-b", batch, "Every job of this batch (besides any ids)");
  plotc->add_option("--output,-o", plot.output, "The picture: FILE.png or FILE.svg")->required();
  plotc->add_option("--x", plot.x, "x axis: auto (epoch, else step, else time), epoch, step or time")->capture_default_str();
  plotc->add_option("--metric,-m", plot.metrics, "A progress field to plot (repeatable; default: the loss and accuracy fields)");
  plotc->add_option("--attempt", plot.attempt, "Plot this attempt (default: each job's latest)");
  plotc->add_option("--title", plot.title, "Chart title (default: the jobs' names)");
  plotc->add_flag("--log-y", plot.log_y, "Log scale for every panel of positive values (losses spanning 3 decades get one anyway)");
  plotc->add_option("--width", plot.width, "Picture width in pixels")->check(CLI::Range(400, 8000))->capture_default_str();
  json_flag(plotc);
  plotc->callback([&] {
    run = [&] {
      int code = add_batch_ids(opt, batch, plot.ids);
      return code ? code : cmd_plot(opt, plot);
    };
  });

  std::string event_type;
  auto* events = app.add_subcommand("events", "A job's progress and result events, as it reported them");
  events->add_option("id", id, "Job id")->required();
  events->add_option("--attempt", attempt, "This attempt (default: the latest)");
  events->add_option("--type", event_type, "Only progress or only result events");
  json_flag(events);
  events->callback([&] { run = [&] { return cmd_events(opt, id, attempt, event_type); }; });

  double interval_s = 1;
  bool once = false;
  auto* top = app.add_subcommand("top", "Live full-screen view of GPUs and jobs (q quits)");
  top->add_option("--interval,-i", interval_s, "Seconds between refreshes")->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  top->add_flag("--once", once, "Print one frame and exit (also when stdout is not a terminal)");
  top->callback([&] { run = [&] { return cmd_top(opt, interval_s, once); }; });

  bool show_config = false;
  auto* config = app.add_subcommand("config", "Show the settings in effect and where each comes from");
  json_flag(config);
  config->callback([&] { show_config = true; });

  std::string state_dir, gpu_spec;
  auto* daemon = app.add_subcommand("daemon", "Start, stop or check gpuqd");
  daemon->require_subcommand(1);
  auto* start = daemon->add_subcommand("start", "Start gpuqd in the background (no-op if running)");
  start->add_option("--state-dir", state_dir, "State directory");
  start->add_option("--gpus", gpu_spec, "auto, nvml, none or fake:N[:MiB[:NODES]]");
  start->callback([&] { run = [&] { return cmd_daemon_start(opt, state_dir, gpu_spec); }; });
  auto* stop = daemon->add_subcommand("stop", "Stop gpuqd (running jobs keep running)");
  stop->callback([&] { run = [&] { return cmd_daemon_stop(opt); }; });
  auto* dstatus = daemon->add_subcommand("status", "Is gpuqd running? Exit 3 if not");
  json_flag(dstatus);
  dstatus->callback([&] { run = [&] { return cmd_daemon_status(opt); }; });

  // Parse, then run the chosen command
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
  opt.socket = !socket.empty() ? socket : settings->socket.value_or(gpuq::common::default_socket_path());
  opt.reconnect_s = settings->reconnect_s.value_or(opt.reconnect_s);
  if (show_config) return cmd_config(opt, *settings, socket.empty() ? "" : "--socket");
  return run ? run() : k_exit_usage;
}
