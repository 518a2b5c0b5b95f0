// What gpuq says of jobs: status, show, wait, result, results, why (`logs` is logs.cpp).
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/progress.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/json_input.hpp"
#include "common/paths.hpp"
#include "common/protocol.hpp"
#include "common/slurm_script.hpp"
#include "common/spec.hpp"

namespace gpuq::cli {

using json = nlohmann::json;
using common::Client;

namespace {

// "requeued 1 time", "preempted 2 times", or both: the attempts a job lost that were not tries.
std::string stopped_words(const common::JobInfo& j) {
  const int preempted = std::min(j.preemptions, j.attempt_base), requeued = j.attempt_base - preempted;
  const auto times = [](int n) { return std::to_string(n) + (n == 1 ? " time" : " times"); };
  std::string out;
  if (requeued > 0) out = "requeued " + times(requeued);
  if (preempted > 0) out += (out.empty() ? "" : ", ") + std::string("preempted ") + times(preempted);
  return out;
}

std::string runtime_of(const common::JobInfo& j) {
  if (j.started_at <= 0) return "-";
  return format_duration((j.ended_at > 0 ? j.ended_at : now_s()) - j.started_at);
}

// Running, and its GPU memory budget raised during this attempt: it held more than it said.
bool budget_raised_now(const common::JobInfo& j) {
  return j.state == JobState::running && j.started_at > 0 && j.gpu_budget_at >= j.started_at;
}

std::string state_of(const common::JobInfo& j) {
  if (j.state == JobState::queued) return display_state(j);
  if (j.state == JobState::running && j.hung) return "running (hung?)";
  if (budget_raised_now(j) && !j.preempting && j.suspended_for.empty()) return "running (over budget)";
  if (j.state == JobState::running && (j.preempting || !j.suspended_for.empty())) return display_state(j);
  if (j.state == JobState::failed || j.state == JobState::succeeded || j.state == JobState::out_of_memory) {
    if (j.exit_signal.is_number()) return name_of(j.state) + " (sig " + std::to_string(j.exit_signal.get<int>()) + ")";
    if (j.exit_code.is_number() && j.exit_code.get<int>() != 0)
      return name_of(j.state) + " (" + std::to_string(j.exit_code.get<int>()) + ")";
  }
  return name_of(j.state);
}

std::string detail_of(const common::JobInfo& j) {
  if (j.details_hidden && j.reason.empty() && j.state != JobState::queued)
    return "(details: " + j.user + "'s to read)";
  if (j.state == JobState::running && j.hung) return j.reason;
  if (j.state == JobState::running && j.preempting) return "for " + j.preempted_by;
  if (j.state == JobState::running && !j.suspended_for.empty()) return "frozen for " + j.suspended_for;
  if (budget_raised_now(j)) return "GPU memory budget now " + std::to_string(j.gpu_budget_mb) + " MiB";
  if (j.state == JobState::running && j.progress.is_object()) return format_fields(j.progress, 5);
  if (j.state == JobState::succeeded && j.result.is_object()) return format_fields(j.result, 5);
  return j.reason;
}

// The jobs table. Its USER column (a row's second cell) is left out unless some job is another
// user's than the caller's: a lab's shared gpuqd (docs/lab.md).
// GPU IDS: the GPUs' indices (as `gpus` lists them), not a count.
const std::vector<std::string> k_jobs_header{"ID", "USER", "NAME", "STATE", "GPU IDS", "TRY", "RUNTIME", "DETAIL"};

std::vector<std::string> job_row(const common::JobInfo& j) {
  return {std::to_string(j.id), j.user, j.name, state_of(j), format_gpus(j.gpus), format_try(j), runtime_of(j),
          detail_of(j)};
}

void print_rows(std::vector<std::vector<std::string>> rows, bool others) {
  // A state's suffix, said once under the table when one is there.
  bool code = false, sig = false;
  for (const auto& row : rows) {
    sig = sig || row[3].find(" (sig ") != std::string::npos;
    code = code || (row[3].find(" (") != std::string::npos && row[3].find(" (sig ") == std::string::npos &&
                    row[3].find(" (hung?)") == std::string::npos && row[3].back() == ')' &&
                    std::isdigit(static_cast<unsigned char>(row[3][row[3].rfind('(') + 1])));
  }
  auto header = k_jobs_header;
  if (!others) {
    header.erase(header.begin() + 1);
    for (auto& row : rows) row.erase(row.begin() + 1);
  }
  Table t(header);
  for (auto& row : rows) t.add(std::move(row));
  t.print(std::cout);
  if (code || sig)
    std::cout << "(" << (code ? "N): the exit code of the rank that failed first" : "") << (code && sig ? "; (" : "")
              << (sig ? "sig N): the signal that killed it" : "") << "\n";
}

bool someone_elses(const common::JobInfo& j) { return j.uid != static_cast<std::int64_t>(::getuid()); }

// Under the table: the jobs some of whose event lines (or results file) gpuqd could not take, with
// the first such line and why; a job is not failed by it, so this is where its owner learns it.
void print_bad_events(const std::vector<common::JobInfo>& jobs) {
  constexpr int k_shown = 3;
  int n = 0;
  for (const auto& j : jobs) {
    if (j.bad_event_lines <= 0) continue;
    if (n++ < k_shown)
      std::cout << "job " << j.id << ": " << j.bad_event_lines << " event line" << (j.bad_event_lines == 1 ? "" : "s")
                << " not taken" << (j.first_bad_event.empty() ? "" : "; the first, " + printable(j.first_bad_event))
                << "\n";
  }
  if (n > k_shown) std::cout << "(and " << n - k_shown << " more jobs with event lines not taken: gpuq show ID)\n";
}

void print_jobs_table(const std::vector<common::JobInfo>& jobs) {
  std::vector<std::vector<std::string>> rows;
  bool others = false;
  for (const auto& j : jobs) {
    rows.push_back(job_row(j));
    others = others || someone_elses(j);
  }
  print_rows(std::move(rows), others);
  print_bad_events(jobs);
}

bool all_succeeded(const common::JobsReply& r) {
  for (const auto& j : r.jobs)
    if (j.state != JobState::succeeded) return false;
  return true;
}

// `status --all`: pages through the history over one connection and prints as it goes, so
// neither gpuqd nor gpuq holds the whole history (100,000+ jobs) at once. --json writes the same
// document as without --all, one job object at a time.
int status_all(const Options& o, const common::JobFilter& f) {
  auto client = Client::connect(o.socket);
  if (!client) return report(client.error());
  std::vector<std::vector<std::string>> rows;  // table mode: short strings only
  std::int64_t after = 0, total = 0, shown = 0;
  bool others = false;
  if (o.json) std::cout << "{\n  \"jobs\": [";
  for (bool more = true; more;) {
    common::StatusRequest req;
    req.all = true;
    req.after = after;
    req.page = 1000;
    req.filter = f;
    auto r = client->call(common::cmd::status, req);
    if (!r) {
      if (o.json) std::cout << "\n";
      return report(r.error());
    }
    const auto& page = *r;
    more = page.more && !page.jobs.empty();
    total = page.total;
    for (std::size_t i = 0; i < page.jobs.size(); ++i) {
      const auto& j = page.jobs[i];
      if (o.json) {
        std::string text = json(j).dump(2);
        for (std::size_t p = 0; (p = text.find('\n', p)) != std::string::npos; p += 5) text.replace(p, 1, "\n    ");
        std::cout << (shown ? ",\n    " : "\n    ") << text;
      } else {
        rows.push_back(job_row(j));
        others = others || someone_elses(j);
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
  print_rows(std::move(rows), others);
  return k_exit_ok;
}

int cmd_status(const Options& o, bool all, int limit, std::int64_t queued, const common::JobFilter& filter) {
  if (all) return status_all(o, filter);
  // The table shows 50 queued jobs, --json a first page of 200: 2,000 took ~160 ms with 100,000
  // queued (bench/status_depth.py); more by -q, or every one by --all --state queued, paged.
  if (queued == -2) queued = o.json ? 200 : 50;
  common::StatusRequest req;
  req.limit = limit;
  req.queued = queued;
  req.filter = filter;
  auto reply = call(o, common::cmd::status, req);
  if (!reply) return report(reply.error());
  const auto& st = *reply;
  if (o.json) {
    print_json({{"jobs", st.jobs}, {"total", st.total}, {"queued_total", st.queued_total}, {"more", st.more}});
    return k_exit_ok;
  }
  if (st.jobs.empty()) {
    std::cout << (filter.empty() ? "no jobs\n" : "no jobs match\n");
    return k_exit_ok;
  }
  print_jobs_table(st.jobs);
  std::int64_t queued_shown = 0;
  for (const auto& j : st.jobs) queued_shown += j.state == JobState::queued;
  if (st.queued_total > queued_shown)
    std::cout << "(" << queued_shown << " of " << st.queued_total
              << " queued jobs shown, the first in line; --queued N for more)\n";
  if (st.total > static_cast<std::int64_t>(st.jobs.size()))
    std::cout << "(" << st.jobs.size() << " of " << st.total << " jobs shown; --all for every job)\n";
  return k_exit_ok;
}

int cmd_show(const Options& o, std::int64_t id) {
  auto reply = call(o, common::cmd::show, common::IdRequest{id});
  if (!reply) return report(reply.error());
  if (o.json) {
    print_json(*reply);
    return k_exit_ok;
  }
  const auto& s = *reply;
  const auto& j = s.job;
  std::cout << "job " << j.id << " (" << printable(j.name) << "), batch " << j.batch
            << (s.batch_max_running > 0 ? " (at most " + std::to_string(s.batch_max_running) + " of it run at once)"
                                        : std::string())
            << (someone_elses(j) ? ", of " + printable(j.user) : std::string()) << "\n"
            << "  state:     " << state_of(j) << (j.reason.empty() ? "" : " - " + printable(j.reason)) << "\n"
            << (s.spec_error.empty() ? "" : "  spec:      unreadable - " + printable(s.spec_error) + "\n")
            << "  mode:      " << j.mode << ", " << j.ranks << " rank(s), gpus requested " << j.gpus_requested
            << ", assigned " << format_gpus(j.gpus)
            << (j.gpu_memory_peak_mb.is_number() ? ", peak " + j.gpu_memory_peak_mb.dump() + " MiB on a GPU" +
                                                       (j.state == JobState::running ? " so far" : "")
                                                 : std::string())
            << "\n";
  if (j.gpu_budget_mb > 0)
    std::cout << printable("  budget:    " + std::to_string(j.gpu_budget_mb) + " MiB of GPU memory a GPU" +
                           (j.gpu_budget_why.empty() ? std::string(", as declared (gpu_memory_mb)")
                                                     : ", " + j.gpu_budget_why + " at " + format_time(j.gpu_budget_at)))
              << "\n";
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
                : j.attempt_base > 0  // requeued or preempted: attempts it lost that were not tries
                    ? " (attempt " + std::to_string(j.attempt) + " in all; " + stopped_words(j) + ")"
                    : std::string())
            << "\n"
            << "  submitted: " << format_time(j.submitted_at) << "\n";
  if (j.preemptible || j.preemptions > 0 || !j.preempted_by.empty() || j.suspensions > 0) {
    std::string words = j.preemptible ? "preemptible" : "not preemptible";
    if (j.preemptions > 0)
      words += "; preempted " + std::to_string(j.preemptions) + (j.preemptions == 1 ? " time" : " times");
    if (j.suspensions > 0)
      words += "; suspended " + std::to_string(j.suspensions) + (j.suspensions == 1 ? " time" : " times");
    if (!j.suspended_for.empty())
      words += "; frozen now for " + j.suspended_for + " since " + format_time(j.suspended_at) +
               " (thawed once it has ended)";
    if (!j.preempted_by.empty())
      words += std::string(j.preempting ? "; being preempted by " : "; last by ") + j.preempted_by + " at " +
               format_time(j.preempted_at);
    std::cout << printable("  preempt:   " + words) << "\n";
  }
  std::cout << "  started:   " << format_time(j.started_at) << "\n"
            << "  ended:     " << format_time(j.ended_at) << "   runtime " << runtime_of(j) << "\n";
  if (!j.external_id.empty())  // "slurm:42": ran (or runs) as Slurm job 42, for sacct and scontrol
    std::cout << printable(j.external_id.rfind("slurm:", 0) == 0 ? "  Slurm job: " + j.external_id.substr(6)
                                                                  : "  external:  " + j.external_id)
              << "\n";
  if (const auto& f = s.first_failure; f.is_object()) {  // as words: what ended first, when, its last words
    std::string what = f.contains("rank") ? "rank " + f["rank"].dump() : std::string("a rank");
    if (f.value("signal", json()).is_number())
      what += " was killed by signal " + f["signal"].dump();
    else if (f.value("exit_code", json()).is_number())
      what += " exited with code " + f["exit_code"].dump();
    else
      what += " ended";
    if (f.value("at", json()).is_number()) what += " at " + format_time(f["at"].get<double>());
    if (f.value("message", json()).is_string()) what += ": " + f["message"].get<std::string>();
    std::cout << "  first failure: " << printable(what) << "\n";
    if (f.value("class", json()).is_string())
      std::cout << "                 looks like " << printable(f["class"].get<std::string>())
                << (f.value("class_line", json()).is_string()
                        ? " (" + printable(f["class_line"].get<std::string>()) + ")"
                        : "")
                << "\n";
  }
  if (j.progress.is_object()) std::cout << "  progress:  " << format_fields(j.progress, 12) << "\n";
  if (j.result.is_object()) std::cout << "  result:    " << format_fields(j.result, 24) << "\n";
  if (j.bad_event_lines) {
    std::cout << "  event lines not taken: " << j.bad_event_lines << "\n";
    if (!j.first_bad_event.empty()) std::cout << "    the first: " << printable(j.first_bad_event) << "\n";
  }
  std::cout << "  directory: " << printable(j.job_dir) << "\n";
  if (s.spec.contains("shell") && s.spec["shell"].is_string())
    std::cout << "  shell:     " << printable(s.spec["shell"].get<std::string>()) << "\n";
  else if (s.spec.contains("train") && s.spec["train"].is_object())
    std::cout << "  train:     " << printable(s.spec["train"].dump()) << "\n";
  else if (const json cmd = s.spec.value("command", json()); cmd.is_array()) {  // as a shell would take it back
    std::string line;
    for (const auto& arg : cmd) {
      const std::string word = arg.is_string() ? arg.get<std::string>() : arg.dump();
      const bool plain = !word.empty() && word.find_first_not_of(
                                              "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_@%+=:,./-") == std::string::npos;
      line += (line.empty() ? "" : " ") + (plain ? word : common::shell_quote(word));
    }
    std::cout << "  command:   " << printable(line) << "\n";
  }
  std::cout << "  history:\n";
  for (const auto& t : s.history)
    std::cout << "    " << format_time(t.at) << "  " << t.state << (t.attempt ? " (attempt " + std::to_string(t.attempt) + ")" : "")
              << (t.reason.empty() ? "" : " - " + printable(t.reason)) << "\n";
  if (!s.logs.empty()) {
    std::cout << "  logs:\n";
    for (const auto& l : s.logs) std::cout << "    attempt " << l.attempt << " rank " << l.rank << ": " << printable(l.path) << "\n";
  }
  return k_exit_ok;
}

int cmd_result(const Options& o, std::int64_t id) {
  common::ResultsRequest req;
  req.ids = {id};
  auto reply = call(o, common::cmd::results, req);
  if (!reply) return report(reply.error());
  if (reply->jobs.empty())
    return report(Error{ErrorCode::internal, "gpuqd's reply lists no job " + std::to_string(id)});
  const auto& j = reply->jobs.front();
  if (o.json) {
    print_json({{"id", j.id}, {"name", j.name}, {"state", j.state}, {"result", j.result}});
    return k_exit_ok;
  }
  std::cout << "job " << j.id << " (" << printable(j.name) << "): " << state_of(j) << "\n";
  if (!j.result.is_object()) {
    std::cout << "  no result reported\n";
    return k_exit_ok;
  }
  for (const auto& [k, v] : j.result.items()) std::cout << "  " << printable(k) << ": " << format_value(v) << "\n";
  return k_exit_ok;
}

// A results column's value for a job: its result's field, else its label of that name.
const json* column_value(const common::JobInfo& j, const std::string& key) {
  if (j.result.is_object())
    if (auto it = j.result.find(key); it != j.result.end()) return &*it;
  if (auto it = j.labels.find(key); it != j.labels.end()) return &it->second;
  return nullptr;
}

// --sort: numbers in numeric order (a label from before labels were typed, "0.3", counts as the
// number it reads as), then text, then jobs without the field; ties keep the id order.
void sort_rows(std::vector<common::JobInfo>& jobs, const std::string& key, bool reverse) {
  auto rank = [&](const common::JobInfo& j) -> std::pair<int, json> {
    const json* v = column_value(j, key);
    if (!v || v->is_null()) return {2, nullptr};
    if (v->is_number()) return {0, *v};
    if (v->is_boolean()) return {0, v->get<bool>() ? 1 : 0};
    if (v->is_string()) {
      const auto& s = v->get_ref<const std::string&>();
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) &&
          !std::isspace(static_cast<unsigned char>(s[0])))
        return {0, d};
      return {1, s};
    }
    return {1, v->dump()};
  };
  std::stable_sort(jobs.begin(), jobs.end(), [&](const common::JobInfo& a, const common::JobInfo& b) {
    auto ra = rank(a), rb = rank(b);
    if (ra.first != rb.first) return ra.first < rb.first;  // missing last either way
    if (ra.first == 2) return false;
    const bool less = ra.first == 0 ? ra.second.get<double>() < rb.second.get<double>() : ra.second < rb.second;
    const bool more = ra.first == 0 ? rb.second.get<double>() < ra.second.get<double>() : rb.second < ra.second;
    return reverse ? more : less;
  });
}

int cmd_results(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch,
                const std::vector<std::string>& fields, const std::string& sort_key, bool reverse) {
  common::ResultsRequest req;
  req.ids = ids;
  if (ids.empty() && batch == 0) {  // the 20 jobs that ended last, as `status` lists them
    common::StatusRequest recent;
    recent.limit = 20;
    recent.queued = 0;
    auto listed = call(o, common::cmd::status, recent);
    if (!listed) return report(listed.error());
    for (const auto& j : listed->jobs)
      if (is_terminal(j.state)) req.ids.push_back(j.id);
    std::sort(req.ids.begin(), req.ids.end());
    if (req.ids.empty()) {
      if (o.json)
        print_json({{"jobs", json::array()}});
      else
        std::cout << "no job has ended yet\n";
      return k_exit_ok;
    }
  }
  req.batch = batch;
  auto reply = all_results(o, req);
  if (!reply) return report(reply.error());
  auto& r = *reply;
  if (!sort_key.empty()) sort_rows(r.jobs, sort_key, reverse);
  if (o.json) {
    json out = json::array();
    for (const auto& j : r.jobs)
      out.push_back({{"id", j.id}, {"name", j.name}, {"batch", j.batch}, {"state", j.state}, {"result", j.result}, {"labels", j.labels}});
    print_json({{"jobs", out}});
    return k_exit_ok;
  }
  // Columns: the asked-for fields, else every plain field of the results, metrics first
  // (field_rank), then the labels (a sweep's lr and seed) not among them.
  std::vector<std::string> keys = fields;
  if (keys.empty()) {
    std::vector<std::pair<int, std::string>> seen;
    auto known = [&](const std::string& k) {
      return std::find_if(seen.begin(), seen.end(), [&](const auto& s) { return s.second == k; }) != seen.end();
    };
    for (const auto& j : r.jobs)
      if (j.result.is_object())
        for (const auto& [k, v] : j.result.items())
          if (!v.is_object() && !v.is_array() && !known(k)) seen.push_back({field_rank(k, v), k});
    std::stable_sort(seen.begin(), seen.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const std::size_t results = seen.size();
    for (const auto& j : r.jobs)
      for (const auto& [k, _] : j.labels)
        if (!known(k)) seen.push_back({0, k});
    std::sort(seen.begin() + static_cast<std::ptrdiff_t>(results), seen.end());
    for (auto& [_, k] : seen) keys.push_back(k);
  }
  auto table = [&](std::size_t n) {
    std::vector<std::string> header{"ID", "NAME", "STATE"};
    header.insert(header.end(), keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n));
    Table t(header);
    for (const auto& j : r.jobs) {
      std::vector<std::string> row{std::to_string(j.id), j.name, state_of(j)};
      for (std::size_t i = 0; i < n; ++i) {
        const json* v = column_value(j, keys[i]);
        row.push_back(v ? format_value(*v) : "-");
      }
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
    std::cout << "(" << keys.size() - n << " more field(s): " << printable(rest) << "; --fields or --json)\n";
  }
  return k_exit_ok;
}

// Waits by following the jobs on gpuqd's watch stream and showing their progress: on a terminal
// the wait_screen redrawn in place (a line per job, or a summary when they do not fit), elsewhere
// a plain line when a job's state changes or, at most every 10 s, its progress. gpuqd answers a
// watch as soon as one of the jobs changes, so an end shows at once; on a terminal the screen is
// also redrawn twice a second (the times in it move on). Ends with the same table and exit code as
// a plain wait. Against a gpuqd older than the watch (protocol minor 2), a wait on the jobs still
// active twice a second, which also answers at once when the last ends.
constexpr std::size_t k_wait_ids_per_tick = 1000;

int watch(const Options& o, Client& client, const std::vector<std::int64_t>& ids, double timeout_s, std::int64_t epoch,
          std::int64_t cursor) {
  outlive_restarts(o, client);
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
  const std::set<std::int64_t> wanted(ids.begin(), ids.end());
  std::size_t drawn = 0;
  common::JobsReply w;
  std::optional<common::JobsReply> waited;  // news of some of the jobs, to take in before drawing
  common::WatchRequest follow;              // where the stream stands: its epoch and cursor
  follow.page = common::k_max_reply_jobs;
  const auto some = [&](const std::vector<std::int64_t>& active) {  // the ids a watch names: none for all
    return active.size() <= static_cast<std::size_t>(common::k_max_reply_jobs) ? active : std::vector<std::int64_t>{};
  };
  bool look = true;  // read the jobs afresh: at first, and when the stream cannot be resumed
  if (epoch != 0) {  // from before the jobs went live: the stream tells of each of them at once
    follow.epoch = epoch, follow.after = cursor, follow.ids = some(ids), follow.timeout_s = 0;
    auto r = client.call(common::cmd::watch, follow);
    if (!r) return report(r.error());
    follow.epoch = r->epoch, follow.after = r->cursor;
    if (!r->reset) {
      for (auto& j : r->jobs)
        if (wanted.count(j.id)) latest[j.id] = std::move(j);
      look = latest.size() < wanted.size();  // (cut short, or already forgotten: a look says)
    }
  }
  for (;;) {
    if (look || (waited && waited->more)) {
      // The stream's cursor first, then the jobs: a change in between is sent again, never lost.
      if (look) {
        auto r = stream_position(client);
        if (!r) return report(r.error());
        follow.epoch = r->epoch, follow.after = r->cursor;
      }
      look = false;
      common::ResultsRequest req;
      req.ids = pending;
      auto r = all_results(client, req);
      if (!r) return report(r.error());
      waited = std::move(*r);
    }
    if (waited)
      for (auto& j : waited->jobs)
        if (wanted.count(j.id)) latest[j.id] = std::move(j);  // an unfiltered watch tells of others' too
    waited.reset();
    w.jobs.clear();
    pending.clear();
    for (const auto& [id, j] : latest) {
      w.jobs.push_back(j);
      if (j.state == JobState::queued || j.state == JobState::running) pending.push_back(id);
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
        const std::string key = name_of(j.state) + "|" + (j.progress.is_object() ? j.progress.value("epoch", json()).dump() : "");
        if (key != last_key || (j.state == JobState::running && now - at >= 10)) {
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
    // Until the next drawing: on a terminal half a second, else as long as nothing changes.
    const double most = tty ? 0.5 : 30;
    const double tick = deadline > 0 ? std::clamp(deadline - now, 0.01, most) : most;
    if (follow.epoch != 0) {
      // The jobs still active, or (more than a request names) every job, those of others dropped.
      follow.ids = some(pending);
      follow.timeout_s = tick;
      auto r = client.call(common::cmd::watch, follow);
      if (!r) return report(r.error());
      follow.epoch = r->epoch, follow.after = r->cursor;
      if (r->reset) {  // another gpuqd (a restart), or too far behind: read the jobs afresh
        look = true;
        continue;
      }
      waited.emplace();  // (cut short, `more`: the rest comes with the next, at once)
      waited->jobs = std::move(r->jobs);
    } else if (pending.size() <= k_wait_ids_per_tick) {
      // An older gpuqd: a wait on what is still active, which it answers as soon as all of it has
      // ended; its answer is the next look.
      auto answer = client.call(common::cmd::wait, common::IdsRequest{pending, tick});
      if (!answer) return report(answer.error());
      waited = std::move(*answer);
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(tick));
      look = true;
    }
  }
  std::cout << "\n";
  print_jobs_table(w.jobs);
  if (w.timed_out) return k_exit_timeout;
  return all_succeeded(w) ? k_exit_ok : k_exit_job_failed;
}

}  // namespace

int cmd_wait(const Options& o, const std::vector<std::int64_t>& ids, double timeout_s) {
  auto client = connect(o, true);
  if (!client) return report(client.error());
  return cmd_wait(o, *client, ids, timeout_s, 0, 0);
}

int cmd_wait(const Options& o, Client& client, const std::vector<std::int64_t>& ids, double timeout_s,
             std::int64_t epoch, std::int64_t cursor) {
  if (!o.json) return watch(o, client, ids, timeout_s, epoch, cursor);
  outlive_restarts(o, client);
  auto reply = client.call(common::cmd::wait, common::IdsRequest{ids, timeout_s});
  if (!reply) return report(reply.error());
  auto& w = *reply;
  if (w.more && !w.jobs.empty()) {  // a reply holds so many jobs: the rest, as they are now
    common::ResultsRequest req;
    req.ids = ids;
    req.after = w.jobs.back().id;
    auto rest = all_results(client, req);
    if (!rest) return report(rest.error());
    std::move(rest->jobs.begin(), rest->jobs.end(), std::back_inserter(w.jobs));
  }
  print_json({{"jobs", w.jobs}, {"timed_out", w.timed_out}});
  if (w.timed_out) return k_exit_timeout;
  return all_succeeded(w) ? k_exit_ok : k_exit_job_failed;
}

void add_status(CLI::App& app, Context& ctx) {
  struct Args {
    bool all = false;
    int limit = 20;
    std::int64_t queued = -2;  // not given: 50 in the table, 200 with --json
    common::JobFilter filter;
    std::vector<std::string> states;  // names, checked below: filter.states once parsed
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("status", "Queued and running jobs, and the most recent finished ones");
  sub->add_flag("--all,-a", a->all, "Every job in the history");
  sub->add_option("--limit,-n", a->limit, "Finished jobs to show")->capture_default_str();
  sub->add_option("--queued,-q", a->queued, "Queued jobs to show, the first in line (default 50; --json: 200)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  sub->add_option("--batch,-b", a->filter.batch, "Only the jobs of this batch");
  sub->add_option("--state,-s", a->states,
                  "Only jobs in these states: queued, running, succeeded, failed, cancelled, timed_out, out_of_memory "
                  "(comma-separated, or the option again)")
      ->delimiter(',')
      ->check(CLI::IsMember({"queued", "running", "succeeded", "failed", "cancelled", "timed_out", "out_of_memory"}));
  sub->add_option("--name", a->filter.name, "Only jobs whose names match this shell-style glob ('lr-*')");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    for (const auto& name : a->states) a->filter.states.push_back(*job_state_from_string(name));
    ctx.run = [&ctx, a] { return cmd_status(ctx.opt, a->all, a->limit, a->queued, a->filter); };
  });
}

namespace {

int cmd_why(const Options& o, std::int64_t id) {
  auto reply = call(o, common::cmd::why, common::IdRequest{id});
  if (!reply) return report(reply.error());
  if (o.json) {
    print_json(*reply);
    return k_exit_ok;
  }
  const auto& w = *reply;
  const auto& j = w.job;
  std::cout << "job " << j.id << " (" << printable(j.name) << ")" << (someone_elses(j) ? " of " + printable(j.user) : std::string())
            << ": " << state_of(j) << (j.reason.empty() ? "" : " - " + printable(j.reason)) << "\n";
  for (const auto& line : w.details) std::cout << "  - " << printable(line) << "\n";
  if (j.state != JobState::queued) return k_exit_ok;
  if (!w.holders.empty()) {
    std::cout << "  GPUs held by:\n";
    for (const auto& h : w.holders)
      std::cout << "    job " << h.id << " (" << printable(h.user) << "'s " << printable(h.name) << ") on GPU " << format_gpus(h.gpus) << ", "
                << (h.ends_by > 0 ? "over by " + format_time(h.ends_by) + " (its timeout)" : std::string("no timeout"))
                << "\n";
  }
  if (w.estimated_start.is_number())
    std::cout << "  estimated start: " << format_time(w.estimated_start.get<double>())
              << " at the earliest (from the running jobs' timeouts; jobs ahead of it may go first)\n";
  else if (j.gpus_requested > 0 && !w.holders.empty())
    std::cout << "  estimated start: unknown (a job it waits for has no timeout)\n";
  return k_exit_ok;
}

}  // namespace

void add_why(CLI::App& app, Context& ctx) {
  auto id = args<std::int64_t>();
  auto* sub = app.add_subcommand("why", "Why a queued job waits: what for, who holds the GPUs, when it can start");
  sub->add_option("id", *id, "Job id")->required();
  add_json_flag(sub, ctx);
  sub->callback([&ctx, id] { ctx.run = [&ctx, id] { return cmd_why(ctx.opt, *id); }; });
}

void add_show(CLI::App& app, Context& ctx) {
  auto id = args<std::int64_t>();
  auto* sub = app.add_subcommand("show", "Everything about one job: state history, failure, logs");
  sub->add_option("id", *id, "Job id")->required();
  add_json_flag(sub, ctx);
  sub->callback([&ctx, id] { ctx.run = [&ctx, id] { return cmd_show(ctx.opt, *id); }; });
}

void add_wait(CLI::App& app, Context& ctx) {
  struct Args : Selection {
    double timeout_s = 0;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("wait", "Wait for jobs to end; exit 0 if all succeeded, 1 if not, 124 on timeout");
  add_selection(sub, *a, "Job ids");
  sub->add_option("--timeout", a->timeout_s, "Give up after this many seconds");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] {
      int code = add_batch_ids(ctx.opt, a->batch, a->ids);
      return code ? code : cmd_wait(ctx.opt, a->ids, a->timeout_s);
    };
  });
}

void add_result(CLI::App& app, Context& ctx) {
  auto id = args<std::int64_t>();
  auto* sub = app.add_subcommand("result", "The final result a job reported");
  sub->add_option("id", *id, "Job id")->required();
  add_json_flag(sub, ctx);
  sub->callback([&ctx, id] { ctx.run = [&ctx, id] { return cmd_result(ctx.opt, *id); }; });
}

void add_results(CLI::App& app, Context& ctx) {
  struct Args : Selection {
    std::vector<std::string> fields;
    std::string sort;
    bool reverse = false;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("results", "Results of many jobs in one table");
  add_selection(sub, *a, "Job ids", "Every job of this batch");
  sub->add_option("--fields,-f", a->fields,
                  "Result fields or labels to show, comma-separated (default: every result field, metrics first, then "
                  "the labels)")
      ->delimiter(',');
  sub->add_option("--sort,-s", a->sort,
                  "Order the jobs by this result field or label (numbers as numbers; jobs without it last)");
  sub->add_flag("--reverse,-r", a->reverse, "With --sort: largest first");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] { return cmd_results(ctx.opt, a->ids, a->batch, a->fields, a->sort, a->reverse); };
  });
}

}  // namespace gpuq::cli
