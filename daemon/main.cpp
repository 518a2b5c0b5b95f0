// gpuqd: the gpuq daemon. Keeps the durable queue, knows the GPUs, schedules and supervises jobs.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "common/config.hpp"
#include "common/paths.hpp"
#include "common/users.hpp"
#include "daemon/cgroups.hpp"
#include "daemon/daemon.hpp"
#include "daemon/heap_trim.hpp"
#include "daemon/launcher.hpp"
#include "daemon/metrics_http.hpp"
#include "daemon/options.hpp"
#include "daemon/server.hpp"

namespace {

using gpuq::daemon::Config;

// Background mode: the parent returns only once the child listens (exit 0) or failed (exit 1,
// with the child's message), so `gpuqd && gpuq status` never races the socket.
int g_ready_fd = -1;

void report_ready(const std::string& error) {
  if (g_ready_fd < 0) {
    if (!error.empty()) std::cerr << "gpuqd: " << error << "\n";
    return;
  }
  std::string msg = error.empty() ? "ok" : error;
  [[maybe_unused]] auto n = ::write(g_ready_fd, msg.data(), msg.size());
  ::close(g_ready_fd);
  g_ready_fd = -1;
  if (!error.empty()) std::cerr << "gpuqd: " << error << "\n";
}

int daemonize(const std::string& log_path) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid > 0) {
    ::close(fds[1]);
    std::string msg;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) msg.append(buf, static_cast<std::size_t>(n));
    if (msg == "ok") std::_Exit(0);
    std::cerr << "gpuqd: " << (msg.empty() ? "exited during start-up; see " + log_path : msg) << "\n";
    std::_Exit(1);
  }
  ::close(fds[0]);
  g_ready_fd = fds[1];
  ::setsid();
  int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null >= 0) ::dup2(null, 0);
  int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log >= 0) ::dup2(log, 1), ::dup2(log, 2);
  return 0;
}

}  // namespace

namespace {
// Where gpuqd's defaults come from, with every key and variable (common/config.cpp's table).
std::string settings_footer() {
  std::string keys, variables;
  for (const auto& k : gpuq::common::setting_keys()) {
    keys += (keys.empty() ? "" : ", ") + k.key;
    if (!k.variable.empty()) variables += (variables.empty() ? "$" : ", $") + k.variable;
  }
  const std::string path = gpuq::common::config_path();
  return "Defaults come from " + (path.empty() ? std::string("no file ($GPUQ_CONFIG is empty)") : path) +
         " (JSON keys: " + keys + "; docs/cli.md says what each sets), then the environment (" + variables +
         "); options given here win.";
}

// What gpuqd starts with: the settings (defaults < file < environment < command line) and what
// only the command line says.
struct Start {
  Config config;
  bool foreground = false;
  bool forget_unknown_jobs = false;
  std::optional<gid_t> socket_gid;  // lab mode: the socket's group, resolved once
};

// Each step of the start either goes on (nullopt) or ends gpuqd with the status it returns, having
// said why. Until the process is in the background, errors go to the terminal.
using Step = std::optional<int>;

Step load_settings_and_options(int argc, char** argv, Start& s) {
  Config& config = s.config;
  auto settings = gpuq::common::load_settings();
  if (settings) static_cast<gpuq::common::Settings&>(config) = std::move(*settings);
  CLI::App app{"gpuqd: the gpuq daemon (multi-GPU job queue). Usually started by `gpuq daemon start`."};
  app.set_version_flag("--version", GPUQ_VERSION);
  app.footer(settings_footer());
  app.add_flag("--foreground,-f", s.foreground, "Stay in the foreground and log to stderr");
  gpuq::daemon::add_setting_options(app, config);
  for (auto [option, fallback, lab] :
       {std::tuple{"--socket", gpuq::common::default_socket_path(), gpuq::common::k_lab_socket},
        std::tuple{"--state-dir", gpuq::common::default_state_dir(), gpuq::common::k_lab_state_dir}})
    if (auto* o = app.get_option_no_throw(option))
      o->description(o->get_description() + " (default: " + fallback + "; in lab mode " + lab + ")");
  app.add_option("--slurm-partition", config.slurm.partition, "sbatch --partition for every job (Slurm executor)");
  app.add_option("--slurm-account", config.slurm.account, "sbatch --account for every job (Slurm executor)");
  app.add_option("--slurm-qos", config.slurm.qos, "sbatch --qos for every job (Slurm executor)");
  app.add_option("--slurm-arg", config.slurm.extra_args, "Another sbatch option for every job, as written (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--slurm-poll", config.slurm_poll_s, "Seconds between squeue calls (one for all jobs)")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  app.add_flag("--forget-unknown-jobs", s.forget_unknown_jobs,
               "Start although the store does not know some job directories (gpuq.db lost or restored from an "
               "older copy): record their ids as forgotten, so no new job takes one, and leave them as they are");
  app.add_option("--shim", config.shim_path, "Path of gpuq-shim (default: next to gpuqd)");
  app.add_option("--worker", config.worker_path, "Path of gpuq-worker, for train jobs (default: next to gpuqd)");
  // Tests describe a CPU and PCI topology with a tree of their own.
  app.add_option("--sysfs-root", config.sysfs_root, "Where sysfs is mounted")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);  // --help and --version too: the file's error does not stop them
  }
  if (!settings) {
    std::cerr << "gpuqd: " << settings.error().message << "\n";
    return 2;
  }
  return std::nullopt;
}

// Lab mode is root's, on the local executor, with its groups resolved once; its settings are
// refused outside it.
Step check_lab_mode(Start& s) {
  Config& config = s.config;
  if (!config.multi_user) {
    if (config.admin_group.empty() && config.socket_group.empty() && !config.has("user_limits") &&
        !config.has("usage_half_life_s") && !config.has("max_priority"))
      return std::nullopt;
    std::cerr << "gpuqd: admin_group, socket_group, user_limits, usage_half_life_s and max_priority (and their "
                 "options) are for lab mode (--multi-user)\n";
    return 2;
  }
  if (::geteuid() != 0) {
    std::cerr << "gpuqd: --multi-user runs jobs as their owners, which only root can; start it as root "
                 "(systemctl enable --now gpuqd-lab, docs/lab.md)\n";
    return 2;
  }
  if (config.executor != "local") {
    std::cerr << "gpuqd: --multi-user runs jobs on this machine (--executor local); under Slurm, Slurm runs each "
                 "job as its owner already\n";
    return 2;
  }
  for (auto [name, gid] : {std::pair{&config.admin_group, &config.admin_gid}, std::pair{&config.socket_group, &s.socket_gid}}) {
    if (name->empty()) continue;
    auto found = gpuq::common::group_id(*name);
    if (!found) {
      std::cerr << "gpuqd: " << found.error().message << "\n";
      return 2;
    }
    *gid = *found;
  }
  return std::nullopt;
}

// The socket, the state directory and the programs gpuqd starts, where the settings left them.
Step resolve_paths(Config& config) {
  if (config.socket_path.empty())
    config.socket_path = config.multi_user ? gpuq::common::k_lab_socket : gpuq::common::default_socket_path();
  if (config.state_dir.empty())
    config.state_dir = config.multi_user ? gpuq::common::k_lab_state_dir : gpuq::common::default_state_dir();
  if (config.shim_path.empty()) config.shim_path = gpuq::common::self_dir() + "/gpuq-shim";
  if (config.worker_path.empty() && ::access((gpuq::common::self_dir() + "/gpuq-worker").c_str(), X_OK) == 0)
    config.worker_path = gpuq::common::self_dir() + "/gpuq-worker";
  if (::access(config.shim_path.c_str(), X_OK) != 0) {
    std::cerr << "gpuqd: job supervisor " << config.shim_path << " is missing or not executable\n";
    return 1;
  }
  if (!config.cgroup_parent.empty()) {
    auto parent = gpuq::daemon::check_cgroup_parent(config.cgroup_parent);
    if (!parent) {
      std::cerr << "gpuqd: " << parent.error().message << "\n";
      return 1;
    }
    config.cgroup_parent = *parent;  // every link resolved: compared with what /proc/PID/cgroup says
  }
  return std::nullopt;
}

// The state directory, private; in lab mode users pass through it to their jobs' directories
// (and see nothing else there).
Step make_state_dir_private(const Config& config) {
  if (auto dir = gpuq::common::ensure_private_dir(config.state_dir); !dir) {
    std::cerr << "gpuqd: state dir: " << dir.error().message << "\n";
    return 1;
  }
  if (config.multi_user && ::chmod(config.state_dir.c_str(), 0711) != 0) {
    std::cerr << "gpuqd: state dir: cannot set its mode to 0711: " << std::strerror(errno) << "\n";
    return 1;
  }
  return std::nullopt;
}

// One daemon per state directory. A predecessor killed while spawning a job leaves a child that
// holds the lock until it execs, so a busy lock is tried again for a moment before it counts as
// another daemon's. The lock is held until gpuqd exits.
Step lock_state_dir(const Config& config) {
  int lock = ::open((config.state_dir + "/gpuqd.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  bool locked = lock >= 0 && ::flock(lock, LOCK_EX | LOCK_NB) == 0;
  for (int tries = 0; lock >= 0 && !locked && errno == EWOULDBLOCK && tries < 40; ++tries) {
    ::usleep(50'000);
    locked = ::flock(lock, LOCK_EX | LOCK_NB) == 0;
  }
  if (locked) return std::nullopt;
  report_ready("another gpuqd is using the state dir " + config.state_dir);
  return 1;
}

// The store, which must know every job directory (or, when told, forget those it does not).
gpuq::Result<std::unique_ptr<gpuq::daemon::Store>> open_store(const Start& s) {
  auto store = gpuq::daemon::Store::open(s.config.state_dir + "/gpuq.db");
  if (!store) return store.error();
  auto known = gpuq::daemon::account_for_job_dirs(s.config.state_dir, **store, s.forget_unknown_jobs);
  if (!known) return known.error();
  if (!known->empty()) std::cerr << *known << "\n";
  return std::move(*store);
}

// Prometheus metrics over HTTP and to a file, when asked for.
struct Metrics {
  std::optional<gpuq::daemon::MetricsServer> server;
  std::optional<gpuq::daemon::MetricsTextfile> textfile;
};
Step start_metrics(boost::asio::io_context& io, const Config& config, gpuq::daemon::Daemon& daemon, Metrics& m) {
  auto render = [&daemon] { return daemon.metrics_text(); };
  if (!config.metrics_listen.empty()) {
    auto at = gpuq::daemon::parse_http_endpoint(config.metrics_listen);
    if (at) {
      m.server.emplace(io, render);
      if (auto l = m.server->listen(*at); !l) at = l.error();
    }
    if (!at) {
      report_ready(at.error().message);
      return 1;
    }
    if (!boost::asio::ip::make_address(at->host).is_loopback())
      std::cerr << "gpuqd: metrics at " << config.metrics_listen << " are open to whoever reaches that address: job "
                << "counts by user, GPUs, request counts; no secrets, but bind 127.0.0.1 unless a firewall guards it\n";
    std::cerr << "gpuqd: metrics at http://" << config.metrics_listen.substr(0, config.metrics_listen.rfind(':')) << ":"
              << m.server->port() << "/metrics\n";
  }
  if (!config.metrics_textfile.empty()) m.textfile.emplace(io, config.metrics_textfile, render);
  return std::nullopt;
}

// Listens, re-adopts running jobs, and serves until SIGTERM, SIGINT or a shutdown request; running
// jobs keep running and are re-adopted at the next start.
int serve(Start& s, std::unique_ptr<gpuq::daemon::Store> store, gpuq::daemon::Inventory inventory) {
  const Config& config = s.config;
  boost::asio::io_context io;
  ::signal(SIGPIPE, SIG_IGN);
  gpuq::daemon::Daemon daemon(io, config, std::move(store), std::move(inventory));
  // Freed memory given back to the kernel, every 10 s, the store's unused cache with it.
  gpuq::daemon::HeapTrim heap(
      io, [&daemon] { daemon.release_memory(); }, [&daemon] { return daemon.idle(); });
  gpuq::daemon::Server server(io, daemon, config.socket_path, config.idle_timeout_s,
                              {config.multi_user, s.socket_gid, config.connections_per_user});
  if (auto listening = server.listen(); !listening) {
    report_ready(listening.error().message);
    return 1;
  }
  Metrics metrics;
  if (auto end = start_metrics(io, config, daemon, metrics)) return *end;

  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  auto stop = [&] {
    std::cerr << "gpuqd: shutting down; running jobs keep running and are re-adopted at the next start\n";
    server.close();
    if (metrics.server) metrics.server->close();
    io.stop();
  };
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (!ec) stop();
  });
  ::signal(SIGHUP, SIG_IGN);
  daemon.on_shutdown = stop;

  daemon.recover();
  if (metrics.textfile) metrics.textfile->start();
  std::cerr << "gpuqd: listening on " << config.socket_path << "\n";
  report_ready("");
  // A handler that throws is a bug, but it must not take the queue down with it: log and go on.
  for (;;) {
    try {
      io.run();
      break;
    } catch (const std::exception& e) {
      std::cerr << "gpuqd: internal error (continuing): " << e.what() << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gpuq::daemon::use_one_arena();
  Start s;
  if (auto end = load_settings_and_options(argc, argv, s)) return *end;
  if (auto end = check_lab_mode(s)) return *end;
  if (auto end = resolve_paths(s.config)) return *end;
  if (auto end = make_state_dir_private(s.config)) return *end;
  // Into the background once the basics are known to be right: from here on errors go to the
  // start's waiting parent (report_ready) and the log.
  if (!s.foreground && daemonize(s.config.state_dir + "/gpuqd.log") != 0) {
    std::cerr << "gpuqd: cannot daemonize: " << std::strerror(errno) << "\n";
    return 1;
  }
  if (auto end = lock_state_dir(s.config)) return *end;
  // No start where the admin named where jobs' cgroups go and none can be made there, nor where
  // attempts still run in a cgroup that is no longer where gpuqd would look for them. Elsewhere a
  // host without cgroups is no error: gpuqd tracks jobs by process tree, and says so.
  // Opened once: the daemon's executor takes them as they are. Only the local executor's attempts
  // run on this machine (under Slurm, containment is Slurm's: docs/slurm.md), and only it removes
  // what opening made.
  if (s.config.executor != "slurm") {
    const auto& cgroups = s.config.cgroups = gpuq::daemon::Cgroups::open(s.config.state_dir, s.config.cgroup_parent);
    if (!*cgroups && (!s.config.cgroup_parent.empty() || cgroups->error().code == gpuq::ErrorCode::wrong_state)) {
      report_ready(cgroups->error().message);
      return 1;
    }
  } else if (!s.config.cgroup_parent.empty()) {
    std::cerr << "gpuqd: cgroup_parent " << s.config.cgroup_parent
              << " is not used: under the Slurm executor, jobs' cgroups are Slurm's\n";
  }
  auto store = open_store(s);
  if (!store) {
    report_ready(store.error().message);
    return 1;
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  auto inventory = gpuq::daemon::Inventory::create(
      s.config.gpus, visible ? std::optional<std::string>(visible) : std::nullopt, s.config.sysfs_root);
  if (!inventory) {
    report_ready(inventory.error().message);
    return 1;
  }
  if (const std::string raised = gpuq::daemon::raise_descriptor_limit(); !raised.empty())
    std::cerr << "gpuqd: " << raised << "\n";
  std::cerr << "gpuqd " GPUQ_VERSION ": " << inventory->gpus().size() << " GPU(s) from " << inventory->source()
            << ", state in " << s.config.state_dir << "\n";
  return serve(s, std::move(*store), std::move(*inventory));
}
