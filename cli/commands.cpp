// The gpuq subcommands (see commands.hpp): talk to gpuqd, print tables or JSON.
#include "cli/commands.hpp"

#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include "cli/format.hpp"
#include "cli/progress.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/paths.hpp"
#include "common/protocol.hpp"
#include "common/spec.hpp"

extern char** environ;

namespace gpuq::cli {

using json = nlohmann::json;
using common::Client;

int report(const Error& e) {
  std::cerr << "gpuq: " << e.message << "\n";
  return e.code == ErrorCode::unavailable ? k_exit_unavailable : k_exit_refused;
}

void outlive_restarts(const Options& o, Client& client) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  const double window = o.reconnect_s;
  client.reconnect_for(window, [tty, window](const std::string& what) {
    if (!tty) return;
    std::cerr << "gpuq: " << what;
    if (what != "reconnected") std::cerr << " for up to " << window << " s";
    std::cerr << "\n";
  });
}

namespace {
// A connection to gpuqd, or nothing with the error printed and `code` set. `waiting`: for a client
// that waits on gpuqd, a socket that is there but unanswered (a gpuqd killed and not yet back)
// is waited out for o.reconnect_s, as a connection lost later is (outlive_restarts); no socket
// at all is no daemon, said at once.
std::optional<Client> connect(const Options& o, int& code, bool waiting = false) {
  auto client = Client::connect(o.socket);
  const auto unanswered = [&] {
    return waiting && !client && client.error().code == ErrorCode::unavailable && std::filesystem::exists(o.socket);
  };
  if (o.reconnect_s > 0 && unanswered() && ::isatty(STDERR_FILENO) == 1)
    std::cerr << "gpuq: gpuqd does not answer on " << o.socket << "; waiting for up to " << o.reconnect_s << " s\n";
  for (common::Backoff backoff(o.reconnect_s); unanswered() && backoff.wait();) client = Client::connect(o.socket);
  if (!client) {
    code = report(client.error());
    return std::nullopt;
  }
  return std::move(*client);
}
}  // namespace

std::optional<json> request(const Options& o, const json& req, int& code, bool reconnect) {
  auto client = connect(o, code, reconnect);
  if (!client) return std::nullopt;
  if (reconnect) outlive_restarts(o, *client);
  auto reply = client->call(req);
  if (!reply) {
    code = report(reply.error());
    return std::nullopt;
  }
  return *reply;
}

Result<common::JobsReply> all_results(Client& client, json req) {
  common::JobsReply all;
  for (bool more = true; more;) {
    auto r = client.call(req);
    if (!r) return r.error();
    auto page = r->get<common::JobsReply>();
    more = page.more && !page.jobs.empty();
    if (more) req["after"] = page.jobs.back().id;
    std::move(page.jobs.begin(), page.jobs.end(), std::back_inserter(all.jobs));
  }
  return all;
}

std::optional<common::JobsReply> all_results(const Options& o, const json& req, int& code) {
  auto client = connect(o, code);
  if (!client) return std::nullopt;
  auto r = all_results(*client, req);
  if (!r) {
    code = report(r.error());
    return std::nullopt;
  }
  return std::move(*r);
}

void print_json(const json& j) { std::cout << j.dump(2) << "\n"; }

// Commands that act on many jobs print a line per job up to this many, then counts instead.
constexpr std::size_t k_lines_per_job = 20;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

std::string runtime_of(const common::JobInfo& j) {
  if (j.started_at <= 0) return "-";
  return format_duration((j.ended_at > 0 ? j.ended_at : now_s()) - j.started_at);
}

std::string state_of(const common::JobInfo& j) {
  if (j.state == "queued") return display_state(j);
  if (j.state == "failed" || j.state == "succeeded") {
    if (j.exit_signal.is_number()) return j.state + " (sig " + std::to_string(j.exit_signal.get<int>()) + ")";
    if (j.exit_code.is_number() && j.exit_code.get<int>() != 0)
      return j.state + " (" + std::to_string(j.exit_code.get<int>()) + ")";
  }
  return j.state;
}

std::string detail_of(const common::JobInfo& j) {
  if (j.state == "running" && j.progress.is_object()) return format_fields(j.progress, 5);
  if (j.state == "succeeded" && j.result.is_object()) return format_fields(j.result, 5);
  return j.reason;
}

const std::vector<std::string> k_jobs_header{"ID", "NAME", "STATE", "GPUS", "TRY", "RUNTIME", "DETAIL"};

std::vector<std::string> job_row(const common::JobInfo& j) {
  return {std::to_string(j.id), j.name, state_of(j), format_gpus(j.gpus), format_try(j), runtime_of(j), detail_of(j)};
}

void print_jobs_table(const std::vector<common::JobInfo>& jobs) {
  Table t(k_jobs_header);
  for (const auto& j : jobs) t.add(job_row(j));
  t.print(std::cout);
}

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return common::parent_dir(buf);
}

std::string cwd() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof(buf)) ? std::string(buf) : std::string("/");
}

bool all_succeeded(const common::JobsReply& r) {
  for (const auto& j : r.jobs)
    if (j.state != "succeeded") return false;
  return true;
}

// Reads one spec file ('-' is stdin) and appends its job(s) to `jobs`.
bool read_spec_file(const std::string& file, json& jobs) {
  std::stringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    if (!in) {
      std::cerr << "gpuq: cannot read " << file << "\n";
      return false;
    }
    text << in.rdbuf();
  }
  auto parsed = common::parse_untrusted(text.str(), file == "-" ? "stdin" : file);
  if (!parsed) {
    std::cerr << "gpuq: " << parsed.error().message << "\n";
    return false;
  }
  json doc = std::move(*parsed);
  if (doc.is_array())
    for (auto& j : doc) jobs.push_back(std::move(j));
  else
    jobs.push_back(std::move(doc));
  return true;
}

}  // namespace

int add_batch_ids(const Options& o, std::int64_t batch, std::vector<std::int64_t>& ids) {
  if (batch != 0) {
    int code = 0;
    auto reply = all_results(o, {{"cmd", "results"}, {"batch", batch}}, code);
    if (!reply) return code;
    for (const auto& j : reply->jobs)
      if (std::find(ids.begin(), ids.end(), j.id) == ids.end()) ids.push_back(j.id);
  }
  if (ids.empty()) {
    std::cerr << "gpuq: give job ids or --batch B\n";
    return k_exit_usage;
  }
  return 0;
}

// `submit --dry-run`: the jobs the batch makes (matrices expanded, defaults filled), checked as
// gpuqd checks them except against the machine (its GPU count), and nothing submitted.
int dry_run(const Options& o, const json& jobs) {
  auto parsed = common::parse_batch(jobs, cwd());
  if (!parsed) return report(parsed.error());
  if (o.json) {
    json out = json::array();
    for (const auto& spec : *parsed) out.push_back(common::to_json(spec));
    print_json({{"jobs", out}});
    return k_exit_ok;
  }
  Table t({"#", "NAME", "GPUS", "MODE", "LABELS", "RUNS"});
  for (std::size_t i = 0; i < parsed->size(); ++i) {
    const auto& spec = (*parsed)[i];
    std::string labels, runs;
    for (const auto& [k, v] : spec.labels) labels += (labels.empty() ? "" : ",") + k + "=" + v;
    if (!spec.train.is_null()) runs = "train " + spec.train.dump();
    else if (!spec.shell.empty()) runs = spec.shell;
    else
      for (const auto& arg : spec.command) runs += (runs.empty() ? "" : " ") + arg;
    t.add({std::to_string(i), spec.name.empty() ? "-" : spec.name, std::to_string(spec.gpus),
           std::string(common::to_string(spec.mode)) + (spec.mode == common::Mode::ddp ? " x" + std::to_string(spec.ranks) : ""),
           labels.empty() ? "-" : labels, runs});
  }
  t.print(std::cout);
  std::cout << parsed->size() << (parsed->size() == 1 ? " job" : " jobs") << "; dry run, nothing submitted\n";
  return k_exit_ok;
}

int cmd_submit(const Options& o, const std::vector<std::string>& files, bool wait, bool dry, bool hold,
               int max_running) {
  json jobs = json::array();
  for (const auto& f : files)
    if (!read_spec_file(f, jobs)) return k_exit_usage;
  if (dry) return dry_run(o, jobs);
  int code = 0;
  json req{{"cmd", "submit"}, {"jobs", jobs}, {"cwd", cwd()}, {"env", common::current_environment()}};
  if (hold) req["hold"] = true;
  if (max_running > 0) req["max_running"] = max_running;
  auto reply = request(o, req, code);
  if (!reply) return code;
  auto sub = reply->get<common::SubmitReply>();
  if (!wait) {
    if (o.json) {
      print_json({{"batch", sub.batch}, {"ids", sub.ids}});
    } else {
      std::cout << "submitted batch " << sub.batch << ": job" << (sub.ids.size() == 1 ? " " : "s ");
      for (std::size_t i = 0; i < sub.ids.size(); ++i) std::cout << (i ? " " : "") << sub.ids[i];
      std::cout << (hold ? ", held (`gpuq release --batch " + std::to_string(sub.batch) + "` lets them start)" : "")
                << "\n";
    }
    return k_exit_ok;
  }
  if (!o.json) std::cerr << "submitted batch " << sub.batch << "; waiting...\n";
  return cmd_wait(o, sub.ids, 0);
}

// The filter's fields in a status request.
json with_filter(json req, const common::JobFilter& f) {
  if (f.batch) req["batch"] = f.batch;
  if (!f.states.empty()) req["states"] = f.states;
  if (!f.name.empty()) req["name"] = f.name;
  return req;
}

// `status --all`: pages through the history over one connection and prints as it goes, so
// neither gpuqd nor gpuq holds the whole history (100,000+ jobs) at once. --json writes the same
// document as without --all, one job object at a time.
int status_all(const Options& o, const common::JobFilter& f) {
  auto client = Client::connect(o.socket);
  if (!client) return report(client.error());
  std::vector<std::vector<std::string>> rows;  // table mode: short strings only
  std::int64_t after = 0, total = 0, shown = 0;
  if (o.json) std::cout << "{\n  \"jobs\": [";
  for (bool more = true; more;) {
    auto r = client->call(with_filter({{"cmd", "status"}, {"all", true}, {"after", after}, {"page", 1000}}, f));
    if (!r) {
      if (o.json) std::cout << "\n";
      return report(r.error());
    }
    auto page = r->get<common::JobsReply>();
    more = page.more && !page.jobs.empty();
    total = page.total;
    for (std::size_t i = 0; i < page.jobs.size(); ++i) {
      const auto& j = page.jobs[i];
      if (o.json) {
        std::string text = (*r)["jobs"][i].dump(2);
        for (std::size_t p = 0; (p = text.find('\n', p)) != std::string::npos; p += 5) text.replace(p, 1, "\n    ");
        std::cout << (shown ? ",\n    " : "\n    ") << text;
      } else {
        rows.push_back(job_row(j));
      }
      ++shown;
    }
    if (!page.jobs.empty()) after = page.jobs.back().id;
  }
  if (o.json) {
    std::cout << (shown ? "\n  ],\n" : "],\n") << "  \"total\": " << total << "\n}\n";
    return k_exit_ok;
  }
  if (rows.empty()) {
    std::cout << "no jobs\n";
    return k_exit_ok;
  }
  Table t(k_jobs_header);
  for (auto& row : rows) t.add(std::move(row));
  t.print(std::cout);
  return k_exit_ok;
}

int cmd_status(const Options& o, bool all, int limit, std::int64_t queued, const common::JobFilter& filter) {
  if (all) return status_all(o, filter);
  if (queued == -2) queued = o.json ? -1 : 50;
  int code = 0;
  auto reply = request(o, with_filter({{"cmd", "status"}, {"limit", limit}, {"queued", queued}}, filter), code);
  if (!reply) return code;
  auto st = reply->get<common::JobsReply>();
  if (o.json) {
    print_json({{"jobs", (*reply)["jobs"]}, {"total", st.total}, {"queued_total", st.queued_total}, {"more", st.more}});
    return k_exit_ok;
  }
  if (st.jobs.empty()) {
    std::cout << (filter.empty() ? "no jobs\n" : "no jobs match\n");
    return k_exit_ok;
  }
  print_jobs_table(st.jobs);
  std::int64_t queued_shown = 0;
  for (const auto& j : st.jobs) queued_shown += j.state == "queued";
  if (st.queued_total > queued_shown)
    std::cout << "(" << queued_shown << " of " << st.queued_total
              << " queued jobs shown, the first in line; --queued N for more)\n";
  if (st.total > static_cast<std::int64_t>(st.jobs.size()))
    std::cout << "(" << st.jobs.size() << " of " << st.total << " jobs shown; --all for every job)\n";
  return k_exit_ok;
}

int cmd_show(const Options& o, std::int64_t id) {
  int code = 0;
  auto reply = request(o, {{"cmd", "show"}, {"id", id}}, code);
  if (!reply) return code;
  if (o.json) {
    reply->erase("ok");
    print_json(*reply);
    return k_exit_ok;
  }
  auto s = reply->get<common::ShowReply>();
  const auto& j = s.job;
  std::cout << "job " << j.id << " (" << j.name << "), batch " << j.batch
            << (s.batch_max_running > 0 ? " (at most " + std::to_string(s.batch_max_running) + " of it run at once)"
                                        : std::string())
            << "\n"
            << "  state:     " << state_of(j) << (j.reason.empty() ? "" : " - " + j.reason) << "\n"
            << "  mode:      " << j.mode << ", " << j.ranks << " rank(s), gpus requested " << j.gpus_requested
            << ", assigned " << format_gpus(j.gpus) << "\n";
  if (j.cpus_requested > 0)
    std::cout << "  cpus:      " << j.cpus_requested << " per rank"
              << (j.cpus.empty() ? std::string() : ", pinned to " + common::format_cpu_list(j.cpus)) << "\n";
  if (j.mem_bind != "none") {
    const std::string verb = j.mem_bind == "local" ? "bound to " : "prefers ";
    std::cout << "  memory:    " << j.mem_bind << ": "
              << (j.cpus.empty()        ? verb + "its cores' NUMA nodes"
                  : j.mem_nodes.empty() ? std::string("not bound, its cores' NUMA nodes are unknown")
                                        : verb + (j.mem_nodes.size() == 1 ? "NUMA node " : "NUMA nodes ") +
                                              common::format_cpu_list(j.mem_nodes))
              << "\n";
  }
  std::cout << "  attempt:   " << j.attempt - j.attempt_base << " of " << j.retries + 1
            << (j.restarts ? " since restart " + std::to_string(j.restarts) + " (attempt " + std::to_string(j.attempt) +
                                 " in all)"
                           : std::string())
            << "\n"
            << "  submitted: " << format_time(j.submitted_at) << "\n"
            << "  started:   " << format_time(j.started_at) << "\n"
            << "  ended:     " << format_time(j.ended_at) << "   runtime " << runtime_of(j) << "\n";
  if (s.first_failure.is_object()) std::cout << "  first failure: " << s.first_failure.dump() << "\n";
  if (j.progress.is_object()) std::cout << "  progress:  " << format_fields(j.progress, 12) << "\n";
  if (j.result.is_object()) std::cout << "  result:    " << format_fields(j.result, 24) << "\n";
  if (j.bad_event_lines) std::cout << "  skipped event lines: " << j.bad_event_lines << "\n";
  std::cout << "  directory: " << j.job_dir << "\n";
  if (s.spec.contains("shell") && s.spec["shell"].is_string())
    std::cout << "  shell:     " << s.spec["shell"].get<std::string>() << "\n";
  else if (s.spec.contains("train") && s.spec["train"].is_object())
    std::cout << "  train:     " << s.spec["train"].dump() << "\n";
  else
    std::cout << "  command:   " << s.spec.value("command", json()).dump() << "\n";
  std::cout << "  history:\n";
  for (const auto& t : s.history)
    std::cout << "    " << format_time(t.at) << "  " << t.state << (t.attempt ? " (attempt " + std::to_string(t.attempt) + ")" : "")
              << (t.reason.empty() ? "" : " - " + t.reason) << "\n";
  if (!s.logs.empty()) {
    std::cout << "  logs:\n";
    for (const auto& l : s.logs) std::cout << "    attempt " << l.attempt << " rank " << l.rank << ": " << l.path << "\n";
  }
  return k_exit_ok;
}

// Where the last `n` complete lines of a file start (0 when it has fewer); `lines`: how many of
// them it has, up to n. Read backwards, so a long log costs only its tail.
std::streamoff tail_start(const std::string& path, int n, int& lines) {
  lines = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  in.seekg(0, std::ios::end);
  std::streamoff pos = in.tellg();
  std::vector<char> buf(64 << 10);
  bool seen_last = false;  // the newline that ends the last complete line
  while (pos > 0) {
    const std::streamoff len = std::min<std::streamoff>(pos, static_cast<std::streamoff>(buf.size()));
    pos -= len;
    in.seekg(pos);
    in.read(buf.data(), len);
    for (std::streamoff i = len - 1; i >= 0; --i) {
      if (buf[static_cast<std::size_t>(i)] != '\n') continue;
      if (!seen_last) {
        seen_last = true;
        if (n == 0) return pos + i + 1;
      } else if (++lines == n) {
        return pos + i + 1;  // just after the newline that ends the line before the last n
      }
    }
  }
  lines += seen_last ? 1 : 0;
  return 0;
}

int cmd_logs(const Options& o, std::int64_t id, bool follow, int rank, int attempt, int tail) {
  int code = 0;
  auto client = connect(o, code, follow);
  if (!client) return code;
  if (follow) outlive_restarts(o, *client);
  auto show = [&]() -> std::optional<common::ShowReply> {
    auto r = client->call({{"cmd", "show"}, {"id", id}});
    if (!r) {
      report(r.error());
      return std::nullopt;
    }
    return r->get<common::ShowReply>();
  };
  auto s = show();
  if (!s) return k_exit_refused;
  if (rank >= s->job.ranks) {
    std::cerr << "gpuq: job " << id << " has " << s->job.ranks << " rank(s); --rank " << rank << " does not exist\n";
    return k_exit_usage;
  }
  if (s->logs.empty() && s->job.attempt > 0)
    std::cerr << "gpuq: job " << id << " has no log files left (`gpuq clean` removed them)\n";
  const bool prefix = s->job.ranks > 1 && rank < 0;
  // Follow state: per (attempt, rank) file offsets. A capped log rotates to <log>.1 (gpuqd
  // --log-limit-mb): its older part is printed first, and a log that shrank has rotated.
  std::map<std::pair<int, int>, std::streamoff> offsets;
  auto print_from = [&](const std::string& path, std::streamoff& off, int r, bool whole) {
    std::ifstream in(path, std::ios::binary);
    in.seekg(off);
    std::string line;
    while (std::getline(in, line)) {
      const bool complete = !in.eof();
      if (!complete && !whole) break;  // partial line: print when complete
      std::cout << (prefix ? "[rank " + std::to_string(r) + "] " : "") << line << "\n";
      off += static_cast<std::streamoff>(line.size()) + (complete ? 1 : 0);
    }
  };
  bool initial = true;
  // An unfinished last line waits for its end while the job may still write it (-f); a plain
  // `logs`, like cat, and the last pump after the job ended print it as it is.
  auto pump = [&](const common::ShowReply& sr) {
    const bool whole = !follow || (sr.job.state != "queued" && sr.job.state != "running");
    for (const auto& l : sr.logs) {
      if (rank >= 0 && l.rank != rank) continue;
      if (attempt > 0 && l.attempt != attempt) continue;
      if (attempt == 0 && !follow && l.attempt != sr.job.attempt) continue;  // last attempt only
      const bool first = !offsets.count({l.attempt, l.rank});
      auto& off = offsets[{l.attempt, l.rank}];
      std::error_code ec;
      const auto size = std::filesystem::file_size(l.path, ec);
      if (first && initial && tail >= 0) {  // as tail -n: the chosen attempt's last lines only
        if (l.attempt != (attempt > 0 ? attempt : sr.job.attempt)) {
          off = ec ? 0 : static_cast<std::streamoff>(size);
          continue;
        }
        int have = 0;
        off = tail_start(l.path, tail, have);
        if (have < tail && std::filesystem::exists(l.path + ".1")) {
          int older_lines = 0;
          std::streamoff older = tail_start(l.path + ".1", tail - have, older_lines);
          print_from(l.path + ".1", older, l.rank, true);
        }
        print_from(l.path, off, l.rank, whole);
        continue;
      }
      if (first || (!ec && static_cast<std::streamoff>(size) < off)) {
        std::streamoff older = first ? 0 : off;
        if (std::filesystem::exists(l.path + ".1")) print_from(l.path + ".1", older, l.rank, true);
        off = 0;
      }
      print_from(l.path, off, l.rank, whole);
    }
    std::cout.flush();
  };
  pump(*s);
  initial = false;
  while (follow && (s->job.state == "queued" || s->job.state == "running")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    s = show();
    if (!s) return k_exit_refused;
    pump(*s);
  }
  if (follow) pump(*s);
  return k_exit_ok;
}

int cmd_cancel(const Options& o, const std::vector<std::int64_t>& ids) {
  int code = 0;
  auto reply = request(o, {{"cmd", "cancel"}, {"ids", ids}}, code);
  if (!reply) return code;
  auto c = reply->get<common::CancelReply>();
  if (o.json) {
    print_json((*reply)["jobs"]);
    return k_exit_ok;
  }
  if (c.jobs.size() > k_lines_per_job) {  // a batch: counts, not a line per job
    int cancelled = 0, stopping = 0, ended = 0;
    for (const auto& j : c.jobs) (!j.changed ? ended : j.state == "running" ? stopping : cancelled)++;
    std::cout << cancelled << " queued jobs cancelled, " << stopping << " running jobs stopping (SIGTERM to all their "
              << "processes), " << ended << " had already ended\n";
    return k_exit_ok;
  }
  for (const auto& j : c.jobs) {
    if (!j.changed) std::cout << "job " << j.id << ": already " << j.state << "\n";
    else if (j.state == "running") std::cout << "job " << j.id << ": stopping (SIGTERM to all its processes)\n";
    else std::cout << "job " << j.id << ": cancelled\n";
  }
  return k_exit_ok;
}

// Sends `req` naming jobs by `ids` and by `batch` (hold, release, update, restart, clean).
std::optional<json> select_request(const Options& o, json req, const std::vector<std::int64_t>& ids,
                                   std::int64_t batch, int& code) {
  req["ids"] = ids;
  if (batch != 0) req["batch"] = batch;
  return request(o, req, code);
}

// Prints what a hold, release or update did to queued jobs: a line per job ("job 7: <done>", or
// `unchanged` of it), or past k_lines_per_job the counts ("25 jobs <done>, 0 <rest>").
int print_changes(const Options& o, const json& reply, std::int64_t batch, const std::string& done,
                  const std::string& rest, const std::function<std::string(const common::CancelOutcome&)>& unchanged) {
  auto c = reply.get<common::CancelReply>();
  if (o.json) {
    print_json({{"jobs", reply["jobs"]}});
    return k_exit_ok;
  }
  if (c.jobs.empty()) std::cout << "batch " << batch << " has no queued jobs\n";
  if (c.jobs.size() > k_lines_per_job) {
    const auto n = std::count_if(c.jobs.begin(), c.jobs.end(), [](const auto& j) { return j.changed; });
    std::cout << n << " jobs " << done << ", " << c.jobs.size() - n << " " << rest << "\n";
    return k_exit_ok;
  }
  for (const auto& j : c.jobs) std::cout << "job " << j.id << ": " << (j.changed ? done : unchanged(j)) << "\n";
  return k_exit_ok;
}

int cmd_hold(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, bool hold) {
  int code = 0;
  auto reply = select_request(o, {{"cmd", hold ? "hold" : "release"}}, ids, batch, code);
  if (!reply) return code;
  return print_changes(o, *reply, batch, hold ? "held" : "released", "left as they were", [&](const auto& j) {
    return j.state != "queued" ? j.state + ", not held" : hold ? "already held" : "was not held";
  });
}

int cmd_update(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, const json& set) {
  int code = 0;
  auto reply = select_request(o, {{"cmd", "update"}, {"set", set}}, ids, batch, code);
  if (!reply) return code;
  if (o.json) {
    reply->erase("ok");
    print_json(*reply);
    return k_exit_ok;
  }
  if (auto it = reply->find("batch_limit"); it != reply->end()) {
    auto limit = it->get<common::BatchLimitChange>();
    const auto text = [](int n) { return n > 0 ? "at most " + std::to_string(n) + " jobs at once" : std::string("no limit"); };
    std::cout << "batch " << limit.batch << ": " << text(limit.max_running) << " (was " << text(limit.was) << ")\n";
    if (set.size() == 1) return k_exit_ok;  // only the limit: no job was asked to change
  }
  return print_changes(o, *reply, batch, "updated", "unchanged", [](const auto&) { return "unchanged"; });
}

int cmd_clean(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, double older_than_s,
              bool checkpoints_only, bool forget) {
  int code = 0;
  json req{{"cmd", "clean"}, {"checkpoints_only", checkpoints_only}, {"forget", forget}};
  if (older_than_s >= 0) req["ended_before"] = std::max(1e-3, now_s() - older_than_s);
  auto reply = select_request(o, req, ids, batch, code);
  if (!reply) return code;
  auto c = reply->get<common::CleanReply>();
  if (o.json) {
    print_json(*reply);
    return k_exit_ok;
  }
  const auto jobs = [](std::size_t n) { return std::to_string(n) + (n == 1 ? " job" : " jobs"); };
  if (forget) {
    if (c.forgotten.empty()) std::cout << "nothing to forget\n";
    else
      std::cout << "forgot " << jobs(c.forgotten.size()) << ": removed their records and files ("
                << format_bytes(c.bytes_freed) << ")\n";
    for (const auto& k : c.kept) std::cout << "kept job " << k.id << ": " << k.reason << "\n";
    return k_exit_ok;
  }
  if (c.cleaned.empty()) {
    std::cout << "nothing to remove\n";
    return k_exit_ok;
  }
  std::cout << "removed the " << (checkpoints_only ? "checkpoints" : "files") << " of " << jobs(c.cleaned.size())
            << " (" << format_bytes(c.bytes_freed) << "); their results and history stay\n";
  return k_exit_ok;
}

int cmd_restart(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, bool fresh) {
  int code = 0;
  auto reply = select_request(o, {{"cmd", "restart"}, {"fresh", fresh}}, ids, batch, code);
  if (!reply) return code;
  auto r = reply->get<common::RestartReply>();
  if (o.json) {
    print_json({{"jobs", (*reply)["jobs"]}, {"total", r.total}, {"was", r.was}, {"along", r.along}, {"more", r.more}});
    return k_exit_ok;
  }
  if (r.total == 0) std::cout << "nothing to restart: every job of batch " << batch << " succeeded\n";
  if (r.total > static_cast<std::int64_t>(k_lines_per_job) || r.more) {
    std::cout << r.total << " jobs queued again (";
    for (auto it = r.was.begin(); it != r.was.end(); ++it)
      std::cout << (it == r.was.begin() ? "" : ", ") << it->second << " had " << (it->first == "timed_out" ? "timed out" : "ended " + it->first);
    std::cout << ")" << (r.along ? ", " + std::to_string(r.along) + " of them with a job they wait for" : "")
              << (fresh ? ", checkpoints removed" : "") << "\n";
    return k_exit_ok;
  }
  for (const auto& j : r.jobs)
    std::cout << "job " << j.id << ": queued again (it had " << (j.was == "timed_out" ? "timed out" : "ended " + j.was)
              << ")" << (j.with ? ", with job " + std::to_string(j.with) + " that it waits for" : "")
              << (fresh ? ", checkpoints removed" : "") << "\n";
  return k_exit_ok;
}

// Waits by polling the jobs twice a second and showing their progress: on a terminal the
// wait_screen redrawn in place (a line per job, or a summary when they do not fit), elsewhere a
// plain line when a job's state changes or, at most every 10 s, its progress. Ended jobs do not
// change again, so each poll asks only for the others. Ends with the same table and exit code as
// a plain wait.
int watch(const Options& o, const std::vector<std::int64_t>& ids, double timeout_s) {
  int code = 0;
  auto client = connect(o, code, true);
  if (!client) return code;
  outlive_restarts(o, *client);
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  std::size_t width = 120, rows = 24;
  if (winsize ws{}; tty && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) {
    width = ws.ws_col - 1;
    if (ws.ws_row > 4) rows = ws.ws_row - 2;
  }
  const double since = now_s();
  const double deadline = timeout_s > 0 ? since + timeout_s : 0;
  std::map<std::int64_t, std::pair<std::string, double>> printed;  // plain mode: last state|epoch, when
  std::map<std::int64_t, common::JobInfo> latest;
  std::vector<std::int64_t> pending = ids;
  std::size_t drawn = 0;
  common::JobsReply w;
  for (;;) {
    auto r = all_results(*client, {{"cmd", "results"}, {"ids", pending}});
    if (!r) return report(r.error());
    for (auto& j : r->jobs) latest[j.id] = std::move(j);
    w.jobs.clear();
    pending.clear();
    for (const auto& [id, j] : latest) {
      w.jobs.push_back(j);
      if (j.state == "queued" || j.state == "running") pending.push_back(id);
    }
    const double now = now_s();
    const bool done = pending.empty();
    if (tty) {
      if (drawn) std::cout << "\x1b[" << drawn << "F";  // back to the first line drawn
      const auto lines = wait_screen(w.jobs, now, since, width, rows);
      for (const auto& line : lines) std::cout << "\x1b[2K" << line << "\n";
      for (std::size_t k = lines.size(); k < drawn; ++k) std::cout << "\x1b[2K\n";  // a shorter screen
      drawn = std::max(drawn, lines.size());
    } else {
      for (const auto& j : w.jobs) {
        auto& [last_key, at] = printed[j.id];
        // A new state or epoch prints at once; finer progress at most every 10 s.
        const std::string key = j.state + "|" + (j.progress.is_object() ? j.progress.value("epoch", json()).dump() : "");
        if (key != last_key || (j.state == "running" && now - at >= 10)) {
          std::cout << progress_line(j, now, 1 << 12) << "\n";
          last_key = key, at = now;
        }
      }
    }
    std::cout.flush();
    if (done) break;
    if (deadline > 0 && now >= deadline) {
      w.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  std::cout << "\n";
  print_jobs_table(w.jobs);
  if (w.timed_out) return k_exit_timeout;
  return all_succeeded(w) ? k_exit_ok : k_exit_job_failed;
}

int cmd_wait(const Options& o, const std::vector<std::int64_t>& ids, double timeout_s) {
  if (!o.json) return watch(o, ids, timeout_s);
  int code = 0;
  auto reply = request(o, {{"cmd", "wait"}, {"ids", ids}, {"timeout_s", timeout_s}}, code, true);
  if (!reply) return code;
  auto w = reply->get<common::JobsReply>();
  if (w.more) {  // a reply holds so many jobs: the rest, as they are now
    auto rest = all_results(o, {{"cmd", "results"}, {"ids", ids}, {"after", w.jobs.back().id}}, code);
    if (!rest) return code;
    std::move(rest->jobs.begin(), rest->jobs.end(), std::back_inserter(w.jobs));
  }
  print_json({{"jobs", w.jobs}, {"timed_out", w.timed_out}});
  if (w.timed_out) return k_exit_timeout;
  return all_succeeded(w) ? k_exit_ok : k_exit_job_failed;
}

int cmd_result(const Options& o, std::int64_t id) {
  int code = 0;
  auto reply = request(o, {{"cmd", "results"}, {"ids", {id}}}, code);
  if (!reply) return code;
  auto r = reply->get<common::JobsReply>();
  const auto& j = r.jobs.at(0);
  if (o.json) {
    print_json({{"id", j.id}, {"name", j.name}, {"state", j.state}, {"result", j.result}});
    return k_exit_ok;
  }
  std::cout << "job " << j.id << " (" << j.name << "): " << state_of(j) << "\n";
  if (!j.result.is_object()) {
    std::cout << "  no result reported\n";
    return k_exit_ok;
  }
  for (const auto& [k, v] : j.result.items()) std::cout << "  " << k << ": " << format_value(v) << "\n";
  return k_exit_ok;
}

int cmd_results(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch,
                const std::vector<std::string>& fields) {
  if (ids.empty() && batch == 0) {
    std::cerr << "gpuq: results needs job ids or --batch B\n";
    return k_exit_usage;
  }
  int code = 0;
  json req = {{"cmd", "results"}, {"ids", ids}};
  if (batch) req["batch"] = batch;
  auto reply = all_results(o, req, code);
  if (!reply) return code;
  const auto& r = *reply;
  if (o.json) {
    json out = json::array();
    for (const auto& j : r.jobs)
      out.push_back({{"id", j.id}, {"name", j.name}, {"batch", j.batch}, {"state", j.state}, {"result", j.result}, {"labels", j.labels}});
    print_json({{"jobs", out}});
    return k_exit_ok;
  }
  // Columns: the asked-for fields, else every plain field, metrics first (field_rank).
  std::vector<std::string> keys = fields;
  if (keys.empty()) {
    std::vector<std::pair<int, std::string>> seen;
    for (const auto& j : r.jobs)
      if (j.result.is_object())
        for (const auto& [k, v] : j.result.items())
          if (!v.is_object() && !v.is_array() &&
              std::find_if(seen.begin(), seen.end(), [&](const auto& s) { return s.second == k; }) == seen.end())
            seen.push_back({field_rank(k, v), k});
    std::stable_sort(seen.begin(), seen.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [_, k] : seen) keys.push_back(k);
  }
  auto table = [&](std::size_t n) {
    std::vector<std::string> header{"ID", "NAME", "STATE"};
    header.insert(header.end(), keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n));
    Table t(header);
    for (const auto& j : r.jobs) {
      std::vector<std::string> row{std::to_string(j.id), j.name, state_of(j)};
      for (std::size_t i = 0; i < n; ++i)
        row.push_back(j.result.is_object() && j.result.contains(keys[i]) ? format_value(j.result[keys[i]]) : "-");
      t.add(row);
    }
    return t;
  };
  // On a terminal the table keeps to its width: the last (least telling) columns go first.
  std::size_t n = keys.size();
  winsize ws{};
  if (fields.empty() && ::isatty(STDOUT_FILENO) == 1 && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    while (n > 1 && table(n).width() > ws.ws_col) --n;
  table(n).print(std::cout);
  if (n < keys.size()) {
    std::string rest;
    for (std::size_t i = n; i < keys.size(); ++i) rest += (i > n ? ", " : "") + keys[i];
    std::cout << "(" << keys.size() - n << " more field(s): " << rest << "; --fields or --json)\n";
  }
  return k_exit_ok;
}

int cmd_gpus(const Options& o) { return gpus_request(o, {{"cmd", "gpus"}}); }

int cmd_drain(const Options& o, const std::vector<std::string>& names, bool drain, const std::string& reason) {
  json gpus = json::array();
  for (const auto& name : names) {
    if (const auto index = parse_int(name, 0, INT_MAX)) gpus.push_back(*index);
    else if (name.rfind("GPU-", 0) == 0 || name.rfind("MIG-", 0) == 0) gpus.push_back(name);
    else {
      std::cerr << "gpuq " << (drain ? "drain" : "undrain") << ": " << name
                << " is neither a GPU index nor a UUID (GPU-…)\n";
      return k_exit_usage;
    }
  }
  json req{{"cmd", drain ? "drain" : "undrain"}, {"gpus", gpus}};
  if (!reason.empty()) req["reason"] = reason;
  return gpus_request(o, req);
}

// Sends a request answered with the GPUs (gpus, drain, undrain) and prints them.
int gpus_request(const Options& o, const json& req) {
  int code = 0;
  auto reply = request(o, req, code);
  if (!reply) return code;
  if (o.json) {
    reply->erase("ok");
    print_json(*reply);
    return k_exit_ok;
  }
  auto g = reply->get<common::GpusReply>();
  std::cout << g.gpus.size() << " GPU(s) from " << g.source << "; CPU slots " << g.cpu_slots_used << " of "
            << g.cpu_slots << " in use (cores " << g.cores << ")\n";
  if (g.gpus.empty()) return k_exit_ok;
  // The NUMA column only where some GPU's node is known (machines with several sockets).
  const bool numa = std::any_of(g.gpus.begin(), g.gpus.end(), [](const auto& x) { return x.numa_node.is_number(); });
  std::vector<std::string> header{"GPU", "NAME", "MEMORY", "USED", "UTIL", "GPUQ", "JOBS"};
  if (numa) header.insert(header.begin() + 2, "NUMA");
  Table t(header);
  for (const auto& x : g.gpus) {
    std::string jobs;
    for (auto id : x.jobs) jobs += (jobs.empty() ? "" : ",") + std::to_string(id);
    std::string held = x.jobs.empty() ? "free" : x.exclusive ? "exclusive" : std::to_string(x.allocated_mb) + " MiB shared";
    if (x.drained) held = "drained" + (x.jobs.empty() ? std::string() : ", " + held) + ": " + x.drain_reason;
    std::vector<std::string> row{std::to_string(x.index), x.name, std::to_string(x.memory_total_mb) + " MiB",
                                 x.memory_used_mb.is_number() ? x.memory_used_mb.dump() + " MiB" : "-",
                                 x.utilization.is_number() ? x.utilization.dump() + "%" : "-", held,
                                 jobs.empty() ? "-" : jobs};
    if (numa) row.insert(row.begin() + 2, x.numa_node.is_number() ? x.numa_node.dump() : "-");
    t.add(row);
  }
  t.print(std::cout);
  return k_exit_ok;
}

int cmd_config(const Options& o, const common::Settings& s, const std::string& socket_flag) {
  const std::string path = common::config_path();
  json settings = json::object();
  auto add = [&](const char* key, const auto& value) {
    if (value) settings[key] = {{"value", *value}, {"from", s.source.at(key)}};
  };
  add("socket", s.socket);
  add("state_dir", s.state_dir);
  add("gpus", s.gpus);
  add("log_limit_mb", s.log_limit_mb);
  add("retries", s.retries);
  add("grace_s", s.grace_s);
  add("retry_backoff_s", s.retry_backoff_s);
  add("idle_timeout_s", s.idle_timeout_s);
  add("cpu_slots", s.cpu_slots);
  add("health_interval_s", s.health_interval_s);
  add("forget_after_s", s.forget_after_s);
  add("reconnect_s", s.reconnect_s);
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
  std::string gpuqd = self_dir() + "/gpuqd";
  if (::access(gpuqd.c_str(), X_OK) != 0) gpuqd = "gpuqd";  // installed elsewhere: use PATH
  std::vector<std::string> args{gpuqd, "--socket", o.socket};
  if (!state_dir.empty()) args.insert(args.end(), {"--state-dir", state_dir});
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
  if (auto r = c->call({{"cmd", "shutdown"}}); !r) return report(r.error());
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
                {"state_dir", h.value("state_dir", "")}});
  } else {
    std::cout << "gpuqd " << h.value("daemon_version", "?") << " running, pid " << h.value("pid", 0) << "\n  socket:    "
              << o.socket << "\n  state dir: " << h.value("state_dir", "?") << "\n";
  }
  return k_exit_ok;
}

}  // namespace gpuq::cli
