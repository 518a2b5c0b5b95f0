// `gpuq submit`: spec files in, one batch out (or, with --dry-run, the jobs it would make).
// `gpuq export --slurm`: the same spec files as Slurm batch scripts, for running without gpuqd.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/config.hpp"
#include "common/paths.hpp"
#include "common/protocol.hpp"
#include "common/slurm_script.hpp"
#include "common/spec.hpp"

namespace gpuq::cli {

using json = nlohmann::json;

namespace {

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

// `submit --dry-run`: the jobs the batch makes (matrices expanded, defaults filled), checked as
// gpuqd checks them except against the machine (its GPUs, directories and executables), and
// nothing submitted: the request's size, the specs, the dependencies, exec's size limit.
int dry_run(const Options& o, const json& jobs, bool hold, int max_running) {
  const auto env = common::current_environment();
  const std::size_t request_bytes =
      common::encode(common::cmd::submit, common::SubmitRequest{jobs, common::current_dir(), env, hold, max_running})
          .dump()
          .size() +
      1;
  if (request_bytes > common::k_max_request_bytes)
    return report(Error{ErrorCode::too_large, "the batch's request is " + std::to_string(request_bytes) +
                                                  " bytes; gpuqd takes at most " +
                                                  std::to_string(common::k_max_request_bytes) +
                                                  " in one (split the batch into several submits)"});
  auto parsed = common::parse_batch(jobs, common::current_dir());
  if (!parsed) return report(parsed.error());
  if (auto deps = common::resolve_batch_dependencies(*parsed); !deps) return report(deps.error());
  std::vector<std::string> problems;
  const std::size_t base_bytes = common::exec_bytes(env);
  for (std::size_t i = 0; i < parsed->size(); ++i)
    if (auto too_big = common::exec_size_problem((*parsed)[i], base_bytes); !too_big.empty())
      problems.push_back("job[" + std::to_string(i) + "]" +
                         ((*parsed)[i].name.empty() ? "" : " (" + (*parsed)[i].name + ")") + ": " + too_big);
  if (!problems.empty()) {
    std::string msg = "cannot run this batch here (" + std::to_string(problems.size()) + " problem" +
                      (problems.size() == 1 ? "" : "s") + "):";
    for (std::size_t i = 0; i < problems.size() && i < 50; ++i) msg += "\n  " + problems[i];
    return report(Error{ErrorCode::invalid_spec, msg});
  }
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
    for (const auto& [k, v] : spec.labels)
      labels += (labels.empty() ? "" : ",") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
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

// How a submit's client stays with its jobs: not at all, until they end (`--wait`), or printing
// the one job's output as it comes until it ends (`run --follow`).
enum class Attach { no, wait, follow };

// Ctrl-C while attached leaves the jobs running, and says so (what to type to come back or stop
// them): the message is made before the handler may run, which only writes it.
std::string g_detached;
extern "C" void on_detach(int) {
  if (::write(STDERR_FILENO, g_detached.data(), g_detached.size()) < 0) {
  }
  ::_exit(130);
}
void detach_on_interrupt(const std::vector<std::int64_t>& ids) {
  const std::string which = id_ranges(ids);
  g_detached = "\ngpuq: detached; job" + std::string(ids.size() == 1 ? " " : "s ") + which +
               (ids.size() == 1 ? " goes" : " go") + " on (`gpuq wait " + which + "` to wait again, `gpuq cancel " +
               which + "` to stop " + (ids.size() == 1 ? "it" : "them") + ")\n";
  struct sigaction sa {};
  sa.sa_handler = on_detach;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
}

int submit_jobs(const Options& o, json jobs, Attach attach, bool hold, int max_running) {
  auto client = connect(o);  // not reconnected: a submit sent again could run its jobs twice
  if (!client) return report(client.error());
  auto reply = client->call(
      common::cmd::submit,
      common::SubmitRequest{std::move(jobs), common::current_dir(), common::current_environment(), hold, max_running});
  if (!reply) return report(reply.error());
  const auto& sub = *reply;
  if (attach != Attach::no && !o.json) detach_on_interrupt(sub.ids);
  if (attach == Attach::follow) {
    if (!o.json) std::cerr << "submitted job " << sub.ids.front() << "; its output follows (Ctrl-C detaches)\n";
    if (const int rc = cmd_logs(o, sub.ids.front(), true, -1, 0, -1); rc != k_exit_ok) return rc;
    return cmd_wait(o, *client, sub.ids, 0, sub.epoch, sub.cursor);
  }
  if (attach == Attach::no) {
    if (o.json) {
      print_json({{"batch", sub.batch}, {"ids", sub.ids}});
    } else {
      std::cout << "submitted batch " << sub.batch << ": job" << (sub.ids.size() == 1 ? " " : "s ")
                << id_ranges(sub.ids) << (hold ? ", held (`gpuq release --batch " + std::to_string(sub.batch) + "` lets them start)" : "")
                << "\n";
    }
    return k_exit_ok;
  }
  if (!o.json) std::cerr << "submitted batch " << sub.batch << "; waiting (Ctrl-C detaches)...\n";
  return cmd_wait(o, *client, sub.ids, 0, sub.epoch, sub.cursor);  // on the same connection, from the stream's cursor
}

int cmd_submit(const Options& o, const std::vector<std::string>& files, bool wait, bool dry, bool hold,
               int max_running) {
  json jobs = json::array();
  for (const auto& f : files)
    if (!read_spec_file(f, jobs)) return k_exit_usage;
  if (dry) return dry_run(o, jobs, hold, max_running);
  return submit_jobs(o, std::move(jobs), wait ? Attach::wait : Attach::no, hold, max_running);
}

// `gpuq run`'s options: a spec's common fields, and the command.
struct RunArgs {
  std::vector<std::string> argv;  // the program and its arguments, as given
  std::string name, mode, cwd, memory, gpu_memory, timeout, placement;
  int gpus = -1, ranks = -1, cpus = -1, priority = 0, retries = 0, max_running = 0;
  bool shell = false, shared = false, hold = false, wait = false, follow = false, dry_run = false;
  std::vector<std::string> after, env, labels, matrix;
  std::vector<std::string> progress_patterns, result_patterns;  // the spec's `report`
  std::string results_file;
  int report_rank = -1;
};

// "K=V" split at its first '='; nothing when there is none or K is empty.
std::optional<std::pair<std::string, std::string>> key_value(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return std::nullopt;
  return std::make_pair(text.substr(0, eq), text.substr(eq + 1));
}

// A size in MiB: "4096", "512M", "4G", "1.5G", "1T" (binary units; a number alone is MiB), rounded
// up to a whole MiB as Slurm's --mem is (1025K is 2). Digits and one '.', nothing else: no sign,
// exponent, hex or "inf", which strtod would take.
std::optional<std::int64_t> mebibytes(const std::string& text) {
  std::size_t used = 0;
  bool dot = false;
  for (; used < text.size(); ++used) {
    if (text[used] == '.' && !dot)
      dot = true;
    else if (!std::isdigit(static_cast<unsigned char>(text[used])))
      break;
  }
  if (used == 0 || !std::isdigit(static_cast<unsigned char>(text[0])) || used > 24) return std::nullopt;
  const double n = std::strtod(text.substr(0, used).c_str(), nullptr);
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();  // "4GB", "4GiB" read as "4G"
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  double scale = 0;
  if (unit.empty() || unit == "M" || unit == "m")
    scale = 1;
  else if (unit == "K" || unit == "k")
    scale = 1.0 / 1024;
  else if (unit == "G" || unit == "g")
    scale = 1024;
  else if (unit == "T" || unit == "t")
    scale = 1024.0 * 1024;
  const double mib = std::ceil(n * scale);
  if (scale == 0 || !(mib >= 1) || mib > 1e12) return std::nullopt;
  return static_cast<std::int64_t>(mib);
}

// A matrix value as typed on the command line: a number that reads back as typed (0.1, 64, -3)
// or true/false stays one, anything else is a string, so {KEY} puts back what was typed
// (1e-4 and 1.10 stay text: as numbers they would come back 0.0001 and 1.1).
json typed_value(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  const json number = json::parse(text, nullptr, false);
  if (number.is_number() && number.dump() == text) return number;
  return text;
}

// The job spec `gpuq run`'s options make, or why they make none.
Result<json> run_spec(const RunArgs& a) {
  if (a.argv.empty()) return Error{ErrorCode::bad_request, "no command: gpuq run [options] -- PROGRAM [ARGS...]"};
  // Every option's problem is said at once, as a spec's are.
  std::vector<std::string> problems;
  const auto bad = [&](const std::string& why) { problems.push_back(why); };
  json spec = json::object();
  if (a.shell) {
    std::string text;
    for (const auto& arg : a.argv)
      text += (text.empty() ? "" : " ") + arg;
    spec["shell"] = text;
  } else {
    spec["command"] = a.argv;
  }
  std::string name = a.name;
  if (name.empty()) {  // the program's file name, made a valid job name (g++ -> g--, 7z -> job-7z)
    const std::string program = a.shell ? std::string("sh") : a.argv.front();
    for (char c : program.substr(program.rfind('/') == std::string::npos ? 0 : program.rfind('/') + 1).substr(0, 64))
      name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '-';
    if (name.empty()) name = "job";
    else if (name.find_first_not_of("0123456789") == std::string::npos)
      name = "job-" + name;
  }
  spec["name"] = name;
  if (a.gpus >= 0) spec["gpus"] = a.gpus;
  if (!a.mode.empty()) spec["mode"] = a.mode;
  if (a.ranks >= 0) spec["ranks"] = a.ranks;
  if (a.cpus >= 0) spec["cpus"] = a.cpus;
  if (a.shared) spec["shared"] = true;
  if (!a.placement.empty()) spec["placement"] = a.placement;
  if (a.priority != 0) spec["priority"] = a.priority;
  if (a.retries != 0) spec["retries"] = a.retries;
  if (!a.cwd.empty()) spec["cwd"] = a.cwd;
  if (!a.memory.empty()) {
    const auto mib = mebibytes(a.memory);
    if (!mib)
      bad("--memory " + a.memory + " is not a size (4096, 512M, 16G: MiB unless a unit is given)");
    else
      spec["memory_mb"] = *mib;
  }
  if (!a.gpu_memory.empty()) {
    const auto mib = mebibytes(a.gpu_memory);
    if (!mib)
      bad("--gpu-memory " + a.gpu_memory + " is not a size (4096, 512M, 16G: MiB unless a unit is given)");
    else
      spec["gpu_memory_mb"] = *mib;
  }
  if (!a.timeout.empty()) {
    const auto s = common::parse_duration(a.timeout);
    if (!s || *s <= 0)
      bad("--timeout " + a.timeout + " is not a duration (90, 90s, 30m, 12h, 7d)");
    else
      spec["timeout_s"] = *s;
  }
  if (!a.after.empty()) {
    json after = json::array();
    for (const auto& dep : a.after) {
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(dep.c_str(), &end, 10);
      // An id is digits alone ("+5" and " 5" are names, which gpuqd looks for in the batch).
      if (!dep.empty() && std::isdigit(static_cast<unsigned char>(dep[0])) && *end == '\0' && errno == 0 && id > 0)
        after.push_back(id);
      else
        after.push_back(dep);  // a name: gpuqd says if it is not one of the batch's
    }
    spec["after"] = after;
  }
  for (const auto& [what, list] : {std::pair{"env", &a.env}, std::pair{"labels", &a.labels}}) {
    for (const auto& item : *list) {
      const auto kv = key_value(item);
      if (!kv) {
        bad(std::string("--") + (what == std::string("env") ? "env" : "label") + " " + item + " is not KEY=VALUE");
        continue;
      }
      // A label is typed as a matrix value is (lr=0.3 a number, lr=0.30 text); env is text.
      spec[what][kv->first] = what == std::string("labels") ? typed_value(kv->second) : json(kv->second);
    }
  }
  if (!a.progress_patterns.empty() || !a.result_patterns.empty() || !a.results_file.empty()) {
    json report = json::object();
    if (!a.progress_patterns.empty()) report["progress"] = a.progress_patterns;
    if (!a.result_patterns.empty()) report["result"] = a.result_patterns;
    if (!a.results_file.empty()) report["file"] = a.results_file;
    if (a.report_rank >= 0) report["rank"] = a.report_rank;
    spec["report"] = report;
  } else if (a.report_rank >= 0) {
    bad("--report-rank says whose output the patterns read: give --progress or --result patterns");
  }
  for (const auto& item : a.matrix) {
    const auto kv = key_value(item);
    if (!kv || kv->second.empty()) {
      bad("--matrix " + item + " is not KEY=V1,V2,...");
      continue;
    }
    if (spec.contains("matrix") && spec["matrix"].contains(kv->first)) {
      bad("--matrix " + kv->first + " is given twice");
      continue;
    }
    json values = json::array();
    std::size_t from = 0;
    for (;;) {
      const auto comma = kv->second.find(',', from);
      values.push_back(
          typed_value(kv->second.substr(from, comma == std::string::npos ? std::string::npos : comma - from)));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
    spec["matrix"][kv->first] = values;
  }
  if (problems.size() == 1) return Error{ErrorCode::bad_request, problems.front()};
  if (!problems.empty()) {
    std::string all = std::to_string(problems.size()) + " problems with its options:";
    for (const auto& p : problems)
      all += "\n  " + p;
    return Error{ErrorCode::bad_request, all};
  }
  return spec;
}

int cmd_run(const Options& o, const RunArgs& a) {
  auto spec = run_spec(a);
  if (!spec) {
    std::cerr << "gpuq: " << spec.error().message << "\n";
    return k_exit_usage;
  }
  json jobs = json::array({std::move(*spec)});
  if (a.dry_run) return dry_run(o, jobs, a.hold, a.max_running);
  if (a.follow) {  // one job's output: a matrix makes several
    std::size_t values = 1;  // the jobs a matrix makes: the product of its keys' value counts
    for (const auto& item : a.matrix)
      values *= 1 + static_cast<std::size_t>(std::count(item.begin(), item.end(), ','));
    if (values > 1) {
      std::cerr << "gpuq: --follow prints one job's output, and this run makes several (a matrix): use --wait, "
                   "then `gpuq logs ID`\n";
      return k_exit_usage;
    }
  }
  return submit_jobs(o, std::move(jobs),
                     a.follow ? Attach::follow
                     : a.wait ? Attach::wait
                              : Attach::no,
                     a.hold, a.max_running);
}

struct ExportArgs {
  std::vector<std::string> files;
  bool slurm = false;
  std::string out_dir;
  common::SlurmOptions slurm_options;
};

// A file name for job i of the batch: its position (submission order) and a tame form of its name.
std::string script_name(std::size_t i, const std::string& name) {
  std::string tame;
  for (char c : name.substr(0, 64)) tame += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  char num[16];
  std::snprintf(num, sizeof num, "%03zu", i);
  return std::string(num) + "-" + tame + ".sbatch";
}

int cmd_export(const ExportArgs& a) {
  json jobs = json::array();
  for (const auto& f : a.files)
    if (!read_spec_file(f, jobs)) return k_exit_usage;
  auto parsed = common::parse_batch(jobs, common::current_dir());
  if (!parsed) return report(parsed.error());
  auto deps = common::resolve_batch_dependencies(*parsed);
  if (!deps) return report(deps.error());
  auto& batch = *parsed;
  for (auto& spec : batch)
    if (spec.name.empty()) spec.name = "job";
  if (a.out_dir.empty()) {
    if (batch.size() != 1) {
      std::cerr << "gpuq: these specs make " << batch.size() << " jobs; give -o DIR to write a script for each and a "
                << "submit.sh that submits them with their dependencies\n";
      return k_exit_usage;
    }
    auto script = common::sbatch_script(batch[0], a.slurm_options);
    if (!script) return report(script.error());
    std::cout << *script;
    return k_exit_ok;
  }
  if (::mkdir(a.out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::cerr << "gpuq: cannot make " << a.out_dir << ": " << std::strerror(errno) << "\n";
    return k_exit_refused;
  }
  // Dependencies first: resolve_batch_dependencies refused cycles, so this order exists.
  std::vector<std::size_t> order;
  std::vector<int> state(batch.size(), 0);  // 0 new, 1 placed
  while (order.size() < batch.size())
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (state[i]) continue;
      bool ready = true;
      for (auto d : (*deps)[i]) ready = ready && state[d];
      if (ready) state[i] = 1, order.push_back(i);
    }
  std::ostringstream submit;
  submit << "#!/bin/bash\n# Submits the scripts beside this one to Slurm, each after the jobs it waits for\n"
         << "# (written by `gpuq export --slurm`).\nset -e\ncd \"$(dirname \"$0\")\"\n";
  for (auto i : order) {
    const std::string file = script_name(i, batch[i].name);
    auto script = common::sbatch_script(batch[i], a.slurm_options);
    if (!script) return report(script.error());
    std::ofstream out(a.out_dir + "/" + file, std::ios::trunc);
    out << *script;
    out.close();
    if (!out) {
      std::cerr << "gpuq: cannot write " << a.out_dir << "/" << file << "\n";
      return k_exit_refused;
    }
    std::string after;
    for (auto d : (*deps)[i]) after += ":$job" + std::to_string(d);
    submit << "job" << i << "=$(sbatch --parsable" << (after.empty() ? "" : " --dependency=afterok" + after) << " "
           << common::shell_quote(file) << ")\necho \"" << file << ": Slurm job $job" << i << "\"\n";
  }
  std::ofstream out(a.out_dir + "/submit.sh", std::ios::trunc);
  out << submit.str();
  out.close();
  if (!out || ::chmod((a.out_dir + "/submit.sh").c_str(), 0755) != 0) {
    std::cerr << "gpuq: cannot write " << a.out_dir << "/submit.sh\n";
    return k_exit_refused;
  }
  std::cout << "wrote " << batch.size() << " script" << (batch.size() == 1 ? "" : "s") << " and submit.sh to "
            << a.out_dir << "\n";
  return k_exit_ok;
}

}  // namespace

void add_export(CLI::App& app, Context& ctx) {
  auto a = args<ExportArgs>();
  auto* sub = app.add_subcommand("export", "Print the Slurm batch script a job spec becomes, to run it without gpuqd");
  sub->add_option("files", a->files, "Job spec files ('-' reads stdin)")->required();
  sub->add_flag("--slurm", a->slurm, "As sbatch scripts (the one format so far)")->required();
  sub->add_option("--output-dir,-o", a->out_dir, "Write one script per job and a submit.sh into this folder");
  sub->add_option("--partition", a->slurm_options.partition, "sbatch --partition");
  sub->add_option("--account", a->slurm_options.account, "sbatch --account");
  sub->add_option("--qos", a->slurm_options.qos, "sbatch --qos");
  sub->add_option("--sbatch-arg", a->slurm_options.extra_args, "Another sbatch option, as written (repeatable)")
      ->allow_extra_args(false);
  sub->callback([&ctx, a] { ctx.run = [a] { return cmd_export(*a); }; });
}

void add_run(CLI::App& app, Context& ctx) {
  auto a = args<RunArgs>();
  auto* sub = app.add_subcommand(
      "run", "Submit one command as a job, without a spec file: gpuq run [options] -- PROGRAM [ARGS...]");
  // Options end at the program's name (or at --): what follows is the command's own, `-c` included.
  sub->prefix_command();
  sub->add_option("--name,-N", a->name, "The job's name (default: the program's file name)");
  sub->add_option("--gpus,-g", a->gpus, "GPUs (ddp: one rank each)")->check(CLI::Range(0, 4096));
  sub->add_option("--mode", a->mode, "independent (one process) or ddp (a rank per GPU)")
      ->check(CLI::IsMember({"independent", "ddp"}));
  sub->add_option("--ranks", a->ranks, "Ranks of a ddp job without GPUs (on CPU, Gloo)")->check(CLI::Range(1, 4096));
  sub->add_option("--cpus,-c", a->cpus, "Cores per rank, pinned")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--memory", a->memory, "Host memory per rank, a limit the kernel holds it to (MiB, or 512M, 16G)");
  sub->add_option("--gpu-memory", a->gpu_memory, "GPU memory it needs per GPU, for packing (MiB, or 16G)");
  sub->add_flag("--shared", a->shared, "May share a GPU with other shared jobs where memory allows");
  sub->add_option("--placement", a->placement, "A shared job's GPU: pack (best fit) or spread (the fewest jobs first)")
      ->check(CLI::IsMember({"pack", "spread"}));
  sub->add_option("--after,-a", a->after, "Start after this job succeeds (an id; repeatable)")->allow_extra_args(false);
  sub->add_option("--priority,-p", a->priority, "Higher starts first");
  sub->add_option("--retries,-r", a->retries, "Attempts after a failure")->check(CLI::Range(0, 1000));
  sub->add_option("--timeout,-t", a->timeout, "End it after this long (90, 90s, 30m, 12h, 7d)");
  sub->add_option("--env,-e", a->env, "KEY=VALUE in its environment (repeatable; it gets yours too)")
      ->allow_extra_args(false);
  sub->add_option("--label,-l", a->labels, "KEY=VALUE label (repeatable)")->allow_extra_args(false);
  sub->add_option("--cwd", a->cwd, "Its working directory (default: this one)");
  sub->add_option("--matrix", a->matrix,
                  "KEY=V1,V2,...: one job per value, {KEY} in the arguments replaced (repeatable: every combination)")
      ->allow_extra_args(false);
  sub->add_option("--progress", a->progress_patterns,
                  "A pattern (RE2) over its output lines whose named groups, (?P<loss>[0-9.]+), make a progress "
                  "event at each line it matches (repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--result", a->result_patterns,
                  "A pattern whose named groups, at each line it matches, go into its result (the last match wins; "
                  "repeatable)")
      ->allow_extra_args(false);
  sub->add_option("--results-file", a->results_file,
                  "A JSON object it leaves (relative to its cwd), read as its result when it ends");
  sub->add_option("--report-rank", a->report_rank, "Whose output the patterns read (default: rank 0)")
      ->check(CLI::Range(0, 4095));
  sub->add_flag("--shell", a->shell, "Run the arguments, joined by spaces, as a /bin/sh command line");
  sub->add_flag("--hold", a->hold, "Queue it held: it starts after `gpuq release`");
  sub->add_option("--max-running,-m", a->max_running, "Run at most N of a matrix's jobs at once")
      ->check(CLI::Range(1, common::k_max_running_limit));
  sub->add_flag("--wait,-w", a->wait, "Wait for the jobs; exit 1 unless all succeed (Ctrl-C detaches)");
  sub->add_flag("--follow,-f", a->follow, "Print the job's output as it comes until it ends (Ctrl-C detaches)");
  sub->add_flag("--dry-run,-n", a->dry_run, "List the jobs it makes; submit nothing");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a, sub] {
    // Parsing stopped at the first word that is not run's (prefix_command): from there on, up to
    // a --, the command; then what followed the -- (main.cpp kept it from CLI11), as given.
    a->argv = sub->remaining();
    const std::string unknown =
        !a->argv.empty() && a->argv.front().size() > 1 && a->argv.front()[0] == '-' ? a->argv.front() : "";
    if (ctx.command_given) {
      if (!a->argv.empty()) a->argv.push_back("--");  // gpuq run PROGRAM ARGS -- MORE: the program's own --
      a->argv.insert(a->argv.end(), ctx.command.begin(), ctx.command.end());
    }
    ctx.run = [&ctx, a, unknown] {
      if (!unknown.empty()) {
        std::cerr << "gpuq: run has no option " << unknown
                  << " (gpuq run --help); a command that starts with - goes after --: gpuq run [options] -- PROGRAM "
                     "ARGS...\n";
        return k_exit_usage;
      }
      return cmd_run(ctx.opt, *a);
    };
  });
}

void add_submit(CLI::App& app, Context& ctx) {
  struct Args {
    std::vector<std::string> files;
    bool wait = false, dry_run = false, hold = false;
    int max_running = 0;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("submit", "Submit jobs from JSON spec files ('-' reads stdin); one batch");
  sub->add_option("files", a->files, "Job spec files")->required();
  sub->add_flag("--wait,-w", a->wait, "Wait for the jobs; exit 1 unless all succeed");
  sub->add_flag("--dry-run,-n", a->dry_run, "Check the specs and list the jobs they make (matrices expanded); submit nothing")
      ->excludes("--wait");
  sub->add_flag("--hold", a->hold, "Queue the jobs held: none starts before `gpuq release`");
  sub->add_option("--max-running,-m", a->max_running, "Run at most N of the batch's jobs at once (Slurm's %N)")
      ->check(CLI::Range(1, common::k_max_running_limit));
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] { return cmd_submit(ctx.opt, a->files, a->wait, a->dry_run, a->hold, a->max_running); };
  });
}

}  // namespace gpuq::cli
