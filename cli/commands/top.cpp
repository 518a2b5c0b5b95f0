// `gpuq top`: the screen (top_screen) and the terminal loop (cmd_top). See top.hpp.
#include "cli/top.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <ctime>
#include <iostream>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/progress.hpp"
#include "cli/rpc.hpp"

namespace gpuq::cli {

using json = nlohmann::json;

namespace {

std::string fit(std::string s, std::size_t width) {
  if (s.size() <= width) return s + std::string(width - s.size(), ' ');
  return width > 1 ? s.substr(0, width - 1) + "~" : s.substr(0, width);
}

std::string bar(double fraction, int width) {
  const int filled = static_cast<int>(std::lround(std::clamp(fraction, 0.0, 1.0) * width));
  return "[" + std::string(filled, '|') + std::string(width - filled, ' ') + "]";
}

std::string gib(double mib) {
  char buf[32];
  std::snprintf(buf, sizeof buf, mib >= 10240 ? "%.0f" : "%.1f", mib / 1024);
  return buf;
}

int order_of(const common::JobInfo& j) {
  if (j.state == JobState::running) return 0;
  if (j.state == JobState::queued) return 1;
  return 2;
}

// Aligned columns (none but the last over 24 characters), each line exactly `width` wide.
std::vector<std::string> columns(const std::vector<std::vector<std::string>>& rows, std::size_t width) {
  Table t(rows.front());
  for (std::size_t i = 1; i < rows.size(); ++i) t.add(rows[i]);
  std::vector<std::string> out;
  for (auto& l : t.lines(24)) out.push_back(fit(std::move(l), width));
  return out;
}

}  // namespace

std::vector<std::string> top_screen(const TopSnapshot& s, double now, std::size_t width, std::size_t height) {
  std::vector<std::string> lines;
  char clock[16];
  const std::time_t t = static_cast<std::time_t>(now);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  std::strftime(clock, sizeof clock, "%H:%M:%S", &tm);
  lines.push_back(fit(std::string("gpuq top  ") + clock + "  gpuqd " +
                          (s.error.empty() ? s.daemon_version : "?") + " on " + s.socket + "   (q to quit)",
                      width));
  if (!s.error.empty()) {
    lines.push_back(fit("", width));
    lines.push_back(fit(printable(s.error) + " (retrying every second)", width));
  } else {
    int running = 0, queued = 0;
    for (const auto& j : s.jobs.jobs) running += j.state == JobState::running, queued += j.state == JobState::queued;
    lines.push_back(fit(std::to_string(s.gpus.gpus.size()) + " GPU(s) from " + s.gpus.source + "   CPU slots: " +
                            std::to_string(s.gpus.cpu_slots_used) + "/" + std::to_string(s.gpus.cpu_slots) + "   jobs: " +
                            std::to_string(running) + " running, " + std::to_string(queued) + " queued, " +
                            std::to_string(s.jobs.total) + " in history",
                        width));
    lines.push_back(fit("", width));

    // GPUs: memory (NVML's reading, else what gpuq handed out), utilisation, holders
    std::vector<std::vector<std::string>> g{{"GPU", "NAME", "MEMORY", "", "UTIL", "GPUQ", "JOBS"}};
    for (const auto& x : s.gpus.gpus) {
      const bool measured = x.memory_used_mb.is_number();
      const double used = measured ? x.memory_used_mb.get<double>() : static_cast<double>(x.allocated_mb);
      const double total = static_cast<double>(std::max<std::int64_t>(1, x.memory_total_mb));
      std::string holders;
      for (auto id : x.jobs) {
        std::string name;
        for (const auto& j : s.jobs.jobs)
          if (j.id == id) name = j.name;
        holders += (holders.empty() ? "" : ", ") + std::to_string(id) + (name.empty() ? "" : " " + name);
      }
      g.push_back({std::to_string(x.index), x.name, bar(used / total, 20),
                   gib(used) + "/" + gib(total) + " GiB" + (measured ? "" : " held"),
                   x.utilization.is_number() ? x.utilization.dump() + "%" : "-",
                   x.drained ? "drained" : x.jobs.empty() ? "free" : x.exclusive ? "exclusive" : "shared",
                   holders.empty() ? "-" : holders});
    }
    if (s.gpus.gpus.empty()) g.push_back({"-", "no GPUs: jobs run on the CPU", "", "", "", "", ""});
    for (auto& l : columns(g, width)) lines.push_back(std::move(l));
    lines.push_back(fit("", width));

    // Jobs: running first, then queued, then the most recently ended
    auto jobs = s.jobs.jobs;
    std::stable_sort(jobs.begin(), jobs.end(), [](const auto& a, const auto& b) {
      if (order_of(a) != order_of(b)) return order_of(a) < order_of(b);
      return order_of(a) == 2 ? a.ended_at > b.ended_at : a.id < b.id;
    });
    std::vector<std::vector<std::string>> r{{"ID", "NAME", "STATE", "GPU IDS", "TRY", "PROGRESS / RESULT / REASON"}};
    for (const auto& j : jobs) {
      std::string state = display_state(j);
      std::string detail = j.state == JobState::running  ? progress_text(j, now, 16)
                           : j.state == JobState::succeeded && j.result.is_object()
                               ? format_fields(j.result, 4) + "  (" + format_duration(j.ended_at - j.started_at) + ")"
                               : j.reason;
      r.push_back({std::to_string(j.id), j.name, state, format_gpus(j.gpus), format_try(j), detail});
    }
    if (jobs.empty()) r.push_back({"-", "no jobs", "", "", "", ""});
    for (auto& l : columns(r, width)) lines.push_back(std::move(l));
  }
  if (height > 0) lines.resize(height, fit("", width));
  return lines;
}

// ---- the terminal loop --------------------------------------------------------------------------

namespace {

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_resized = 0;
termios g_saved{};
bool g_raw = false;

void restore_terminal() {
  if (g_raw) ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &g_saved), g_raw = false;
  std::cout << "\x1b[?25h\x1b[?1049l" << std::flush;  // cursor back, main screen back
}

TopSnapshot snapshot(const Options& o, std::optional<common::Client>& client) {
  TopSnapshot s;
  s.socket = o.socket;
  for (int tries = 0; tries < 2; ++tries) {
    if (!client) {
      auto c = common::Client::connect(o.socket);
      if (!c) {
        s.error = c.error().message;
        return s;
      }
      client.emplace(std::move(*c));
    }
    auto g = client->call(common::cmd::gpus);
    common::StatusRequest status;
    status.limit = 15;
    auto j = g ? client->call(common::cmd::status, status) : Result<common::JobsReply>(g.error());
    if (g && j) {
      s.error.clear();
      s.daemon_version = client->hello().value("daemon_version", "");
      s.gpus = std::move(*g);
      s.jobs = std::move(*j);
      return s;
    }
    s.error = (g ? j.error() : g.error()).message;
    client.reset();  // the daemon restarted or dropped us: one fresh connection, then report
  }
  return s;
}

}  // namespace

int cmd_top(const Options& o, double interval_s, bool once) {
  std::optional<common::Client> client;
  auto size = [] {
    winsize ws{};
    if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0)
      return std::pair<std::size_t, std::size_t>{ws.ws_col, ws.ws_row};
    return std::pair<std::size_t, std::size_t>{120, 40};
  };
  if (once || ::isatty(STDOUT_FILENO) != 1) {  // one frame, for pipes and scripts
    auto s = snapshot(o, client);
    for (const auto& l : top_screen(s, now_s(), size().first, 0)) {
      std::string t = l;
      t.erase(t.find_last_not_of(' ') + 1);
      std::cout << t << "\n";
    }
    return s.error.empty() ? k_exit_ok : k_exit_unavailable;
  }

  // Raw keys (no echo, no line buffering; Ctrl-C still signals), alternate screen, no cursor
  if (::isatty(STDIN_FILENO) == 1 && ::tcgetattr(STDIN_FILENO, &g_saved) == 0) {
    termios raw = g_saved;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    g_raw = ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) == 0;
  }
  struct sigaction sa{};
  sa.sa_handler = [](int sig) { (sig == SIGWINCH ? g_resized : g_stop) = 1; };
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGWINCH}) ::sigaction(sig, &sa, nullptr);
  std::cout << "\x1b[?1049h\x1b[?25l";

  // A frame is drawn at each refresh, and at once when a job changes: between frames a watch
  // (gpuqd's answer when one does, or at the refresh; protocol minor 2) is waited on beside the
  // keys. Frames that news brings come at most four a second (each reads gpus and status). Against an older gpuqd, the
  // refresh only.
  std::int64_t epoch = 0, cursor = 0;
  TopSnapshot shown;
  bool fetch = true;
  while (!g_stop) {
    const double drawn_at = now_s();
    if (fetch) {
      // The watch's cursor before the snapshot: a change in between is told again, never lost.
      if (!client)
        if (auto c = common::Client::connect(o.socket)) client.emplace(std::move(*c));  // else the snapshot says why
      if (client && epoch == 0)
        if (auto r = stream_position(*client)) epoch = r->epoch, cursor = r->cursor;
      shown = snapshot(o, client);
    }
    auto [w, h] = size();
    auto lines = top_screen(shown, now_s(), w, h);
    std::string frame = "\x1b[H";
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const bool header = i == 0 || lines[i].rfind("GPU  ", 0) == 0 || lines[i].rfind("ID  ", 0) == 0;
      frame += (header ? "\x1b[7m" + lines[i] + "\x1b[0m" : lines[i]) + (i + 1 < lines.size() ? "\r\n" : "");
    }
    std::cout << frame << std::flush;
    // Until the next frame: the refresh, a key, a resize (the same snapshot, redrawn), or news.
    const double until = drawn_at + interval_s;
    std::optional<common::WatchRequest> asked;
    bool answered = false;
    g_resized = 0;
    fetch = true;
    while (!g_stop && !g_resized) {
      double left = until - now_s();
      if (left <= 0 && !asked) break;
      if (!asked && client && epoch != 0 && now_s() - drawn_at >= 0.25) {  // four frames a second at most
        asked.emplace();
        asked->epoch = epoch, asked->after = cursor, asked->timeout_s = std::clamp(left, 0.0, 300.0);  // gpuqd's most
        if (!client->send(common::encode(common::cmd::watch, *asked))) client.reset(), epoch = 0, asked.reset();
      }
      if (!asked) left = std::min(left, 0.25 - (now_s() - drawn_at));
      pollfd p[2] = {{STDIN_FILENO, POLLIN, 0}, {asked ? client->fd() : -1, POLLIN, 0}};
      // gpuqd answers a watch at its timeout, the refresh: waited for (a second more at most).
      const double wait_s = asked ? std::max(left, 0.0) + 1 : std::max(left, 0.0);
      if (::poll(p, 2, static_cast<int>(wait_s * 1000) + 1) <= 0) {
        if (!asked) continue;       // the refresh, or the time to ask, has come
        client.reset(), epoch = 0;  // no answer: a fresh connection next frame
        break;
      }
      if (p[0].revents) {
        char key = 0;
        if (::read(STDIN_FILENO, &key, 1) == 1 && (key == 'q' || key == 'Q' || key == 27 || key == 3)) g_stop = 1;
        if (p[0].revents & (POLLHUP | POLLERR)) g_stop = 1;  // the terminal went away
      }
      if (asked && p[1].revents) {
        auto r = client->receive(common::encode(common::cmd::watch, *asked));
        if (!r) {
          client.reset(), epoch = 0;
          break;
        }
        auto news = common::read_reply<common::WatchReply>(*r);
        if (!news) {
          client.reset(), epoch = 0;
          break;
        }
        epoch = news->epoch, cursor = news->cursor;
        if (news->jobs.empty() && !news->reset && until - now_s() > 0) {  // a watch shorter than the refresh
          asked.reset();
          continue;
        }
        answered = true;
        break;  // news, a reset (read afresh) or the refresh: the next frame
      }
    }
    if (g_resized && !asked) fetch = false;  // only the size changed
    // Left with a watch unanswered (a key, a resize): its answer would be read as the next
    // request's, so that connection goes, and the next frame connects afresh.
    if (asked && !answered && client) client.reset(), epoch = 0;
  }
  restore_terminal();
  return k_exit_ok;
}

void add_top(CLI::App& app, Context& ctx) {
  struct Args {
    double interval_s = 1;
    bool once = false;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("top", "Live full-screen view of GPUs and jobs (q quits)");
  sub->add_option("--interval,-i", a->interval_s, "Seconds between refreshes")->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  sub->add_flag("--once", a->once, "Print one frame and exit (also when stdout is not a terminal)");
  sub->callback([&ctx, a] { ctx.run = [&ctx, a] { return cmd_top(ctx.opt, a->interval_s, a->once); }; });
}

}  // namespace gpuq::cli
