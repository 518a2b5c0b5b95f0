// `gpuq submit`: spec files in, one batch out (or, with --dry-run, the jobs it would make).
#include <unistd.h>

#include <climits>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/paths.hpp"
#include "common/protocol.hpp"
#include "common/spec.hpp"

namespace gpuq::cli {

using json = nlohmann::json;

namespace {

std::string cwd() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof(buf)) ? std::string(buf) : std::string("/");
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
  auto reply = request(o, common::encode(common::SubmitRequest{std::move(jobs), cwd(), common::current_environment(), hold, max_running}), code);
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

}  // namespace

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
