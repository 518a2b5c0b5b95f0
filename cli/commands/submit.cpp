// `gpuq submit`: spec files in, one batch out (or, with --dry-run, the jobs it would make).
// `gpuq export --slurm`: the same spec files as Slurm batch scripts, for running without gpuqd.
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
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
  if (dry) return dry_run(o, jobs, hold, max_running);
  auto client = connect(o);  // not reconnected: a submit sent again could run its jobs twice
  if (!client) return report(client.error());
  auto reply = client->call(
      common::cmd::submit,
      common::SubmitRequest{std::move(jobs), common::current_dir(), common::current_environment(), hold, max_running});
  if (!reply) return report(reply.error());
  const auto& sub = *reply;
  if (!wait) {
    if (o.json) {
      print_json({{"batch", sub.batch}, {"ids", sub.ids}});
    } else {
      std::cout << "submitted batch " << sub.batch << ": job" << (sub.ids.size() == 1 ? " " : "s ")
                << id_ranges(sub.ids) << (hold ? ", held (`gpuq release --batch " + std::to_string(sub.batch) + "` lets them start)" : "")
                << "\n";
    }
    return k_exit_ok;
  }
  if (!o.json) std::cerr << "submitted batch " << sub.batch << "; waiting...\n";
  return cmd_wait(o, *client, sub.ids, 0, sub.epoch, sub.cursor);  // on the same connection, from the stream's cursor
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
