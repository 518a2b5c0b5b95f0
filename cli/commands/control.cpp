// Requests that change jobs: cancel, restart, hold and release, update, clean.

#include <algorithm>
#include <functional>
#include <iostream>

#include "cli/commands/register.hpp"
#include "cli/format.hpp"
#include "cli/rpc.hpp"
#include "common/client.hpp"
#include "common/protocol.hpp"

namespace gpuq::cli {

using json = nlohmann::json;

namespace {

// Commands that act on many jobs print a line per job up to this many, then counts instead.
constexpr std::size_t k_lines_per_job = 20;

int cmd_cancel(const Options& o, const std::vector<std::int64_t>& ids) {
  auto reply = call(o, common::cmd::cancel, common::IdsRequest{ids});
  if (!reply) return report(reply.error());
  const auto& c = *reply;
  if (o.json) {
    print_json(c.jobs);
    return k_exit_ok;
  }
  if (c.jobs.size() > k_lines_per_job) {  // a batch: counts, not a line per job
    int cancelled = 0, stopping = 0, ended = 0;
    for (const auto& j : c.jobs) (!j.changed ? ended : j.state == JobState::running ? stopping : cancelled)++;
    std::cout << cancelled << " queued jobs cancelled, " << stopping << " running jobs stopping (SIGTERM to all their "
              << "processes), " << ended << " had already ended\n";
    return k_exit_ok;
  }
  for (const auto& j : c.jobs) {
    if (!j.changed) std::cout << "job " << j.id << ": already " << j.state << "\n";
    else if (j.state == JobState::running) std::cout << "job " << j.id << ": stopping (SIGTERM to all its processes)\n";
    else std::cout << "job " << j.id << ": cancelled\n";
  }
  return k_exit_ok;
}

// Prints what a hold, release or update did to queued jobs: a line per job ("job 7: <done>", or
// `unchanged` of it), or past k_lines_per_job the counts ("25 jobs <done>, 0 <rest>").
int print_changes(const Options& o, const std::vector<common::CancelOutcome>& jobs, std::int64_t batch,
                  const std::string& done, const std::string& rest,
                  const std::function<std::string(const common::CancelOutcome&)>& unchanged) {
  if (o.json) {
    print_json({{"jobs", jobs}});
    return k_exit_ok;
  }
  if (jobs.empty()) std::cout << "batch " << batch << " has no queued jobs\n";
  if (jobs.size() > k_lines_per_job) {
    const auto n = std::count_if(jobs.begin(), jobs.end(), [](const auto& j) { return j.changed; });
    std::cout << n << " jobs " << done << ", " << jobs.size() - n << " " << rest << "\n";
    return k_exit_ok;
  }
  for (const auto& j : jobs)
    std::cout << "job " << j.id << ": " << (j.changed ? done : unchanged(j)) << "\n";
  return k_exit_ok;
}

int cmd_hold(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, bool hold) {
  auto reply = call(o, hold ? common::cmd::hold : common::cmd::release, common::SelectRequest{ids, batch});
  if (!reply) return report(reply.error());
  return print_changes(o, reply->jobs, batch, hold ? "held" : "released", "left as they were", [&](const auto& j) {
    return j.state != JobState::queued ? name_of(j.state) + ", not held" : hold ? "already held" : "was not held";
  });
}

int cmd_update(const Options& o, const common::UpdateRequest& q) {
  const std::int64_t batch = q.batch;
  auto reply = call(o, common::cmd::update, q);
  if (!reply) return report(reply.error());
  if (o.json) {
    print_json(*reply);
    return k_exit_ok;
  }
  if (reply->batch_limit) {
    const auto& limit = *reply->batch_limit;
    const auto text = [](int n) { return n > 0 ? "at most " + std::to_string(n) + " jobs at once" : std::string("no limit"); };
    std::cout << "batch " << limit.batch << ": " << text(limit.max_running) << " (was " << text(limit.was) << ")\n";
    if (!q.priority && !q.retries && !q.timeout_s) return k_exit_ok;  // only the limit: no job was asked to change
  }
  return print_changes(o, reply->jobs, batch, "updated", "unchanged", [](const auto&) { return "unchanged"; });
}

int cmd_clean(const Options& o, const std::vector<std::int64_t>& ids, std::int64_t batch, double older_than_s,
              bool checkpoints_only, bool forget) {
  common::CleanRequest req;
  req.ids = ids;
  req.batch = batch;
  req.checkpoints_only = checkpoints_only;
  req.forget = forget;
  if (older_than_s >= 0) req.ended_before = std::max(1e-3, now_s() - older_than_s);
  auto reply = call(o, common::cmd::clean, req);
  if (!reply) return report(reply.error());
  const auto& c = *reply;
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
  common::RestartRequest req;
  req.ids = ids;
  req.batch = batch;
  req.fresh = fresh;
  auto reply = call(o, common::cmd::restart, req);
  if (!reply) return report(reply.error());
  const auto& r = *reply;
  if (o.json) {
    print_json({{"jobs", r.jobs}, {"total", r.total}, {"was", r.was}, {"along", r.along}, {"more", r.more}});
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

}  // namespace

namespace {
int usage(const std::string& command, const std::string& what) {
  std::cerr << "gpuq " << command << ": " << what << "\n";
  return k_exit_usage;
}
}  // namespace

void add_cancel(CLI::App& app, Context& ctx) {
  auto a = args<Selection>();
  auto* sub = app.add_subcommand("cancel", "Cancel jobs: queued ones at once, running ones with SIGTERM, then SIGKILL");
  add_selection(sub, *a, "Job ids");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] {
      int code = add_batch_ids(ctx.opt, a->batch, a->ids);
      return code ? code : cmd_cancel(ctx.opt, a->ids);
    };
  });
}

namespace {

// `requeue` and `preempt`: running jobs stopped and put back in line, each saying what was asked.
void add_back_in_line(CLI::App& app, Context& ctx, const common::Cmd<common::IdsRequest, common::CancelReply>& cmd,
                      const std::string& help, const char* asked, const char* not_asked) {
  auto ids = args<std::vector<std::int64_t>>();
  auto* sub = app.add_subcommand(std::string(cmd.name), help);
  sub->add_option("ids", *ids, "Job ids (running)")->required();
  add_json_flag(sub, ctx);
  sub->callback([&ctx, &cmd, ids, asked, not_asked] {
    ctx.run = [&ctx, &cmd, ids, asked, not_asked] {
      auto reply = call(ctx.opt, cmd, common::IdsRequest{*ids});
      if (!reply) return report(reply.error());
      if (ctx.opt.json) {
        print_json(reply->jobs);
        return k_exit_ok;
      }
      for (const auto& j : reply->jobs)
        std::cout << "job " << j.id << (j.changed ? asked : not_asked) << "\n";
      return k_exit_ok;
    };
  });
}

}  // namespace

// `gpuq requeue`: running jobs stopped and put back in line, no retry spent (Slurm's `scontrol
// requeue`): a job that checkpoints into $GPUQ_CHECKPOINT_DIR on SIGTERM resumes from there.
void add_requeue(CLI::App& app, Context& ctx) {
  add_back_in_line(app, ctx, common::cmd::requeue,
                   "Stop running jobs (SIGTERM, then SIGKILL) and put them back in line, no retry spent",
                   ": stopping (SIGTERM to all its processes); it goes back in line once they are gone",
                   ": already going back in line");
}

// `gpuq preempt`: running jobs preempted by hand, as a job of higher priority would: each gets
// $GPUQ_PREEMPT_FILE, its preempt_signal and its preempt_grace_s to checkpoint, then goes back in
// line as preempted, no retry spent.
void add_preempt(CLI::App& app, Context& ctx) {
  add_back_in_line(
      app, ctx, common::cmd::preempt,
      "Preempt running jobs: their preempt signal and grace to checkpoint, then back in line, no retry spent",
      ": preempting (its preempt signal, then SIGKILL after its grace); it goes back in line once its processes "
      "are gone",
      ": named twice; preempted once");
}

void add_restart(CLI::App& app, Context& ctx) {
  struct Args : Selection {
    bool fresh = false;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand(
      "restart", "Queue ended jobs again (same ids; train jobs resume from their checkpoints), with the jobs "
                 "that failed waiting for them");
  add_selection(sub, *a, "Job ids (any that ended)", "The jobs of this batch that failed, were cancelled or timed out");
  sub->add_flag("--fresh", a->fresh, "Remove their checkpoints first: start over instead of resuming");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] {
      if (a->ids.empty() && a->batch == 0) return usage("restart", "name job ids or --batch");
      return cmd_restart(ctx.opt, a->ids, a->batch, a->fresh);
    };
  });
}

void add_hold(CLI::App& app, Context& ctx) {
  for (const bool holding : {true, false}) {
    auto a = args<Selection>();
    auto* sub = holding ? app.add_subcommand("hold", "Keep queued jobs from starting (they wait out of line) until released")
                        : app.add_subcommand("release", "Let held jobs start");
    add_selection(sub, *a, "Job ids", holding ? "Every queued job of this batch" : "Every held job of this batch");
    add_json_flag(sub, ctx);
    sub->callback([&ctx, a, holding] {
      ctx.run = [&ctx, a, holding] {
        if (a->ids.empty() && a->batch == 0) return usage(holding ? "hold" : "release", "name job ids or --batch");
        return cmd_hold(ctx.opt, a->ids, a->batch, holding);
      };
    });
  }
}

void add_update(CLI::App& app, Context& ctx) {
  struct Args : Selection {
    std::optional<int> priority, retries;
    std::string timeout, limit;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand("update", "Change waiting jobs' priority, retries or timeout (running ones: "
                                           "priority and retries, for their next attempt)");
  add_selection(sub, *a, "Job ids", "Every queued job of this batch");
  sub->add_option("--priority,-p", a->priority, "New priority (higher starts first)");
  sub->add_option("--retries", a->retries, "New number of retries");
  sub->add_option("--timeout", a->timeout, "New timeout: 90s, 30m, 12h, 2d, or none");
  sub->add_option("--max-running,-m", a->limit, "The batch's new limit on jobs running at once, or none (needs --batch)");
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] {
      common::UpdateRequest q;
      q.ids = a->ids;
      q.batch = a->batch;
      q.priority = a->priority;
      q.retries = a->retries;
      if (a->timeout == "none") {
        q.timeout_s = 0;
      } else if (!a->timeout.empty()) {
        auto parsed = parse_duration(a->timeout);
        if (!parsed)
          return usage("update", "--timeout " + a->timeout + " is not a duration like 90s, 30m, 12h or 2d, or none");
        q.timeout_s = *parsed;
      }
      if (a->limit == "none") {
        q.max_running = 0;
      } else if (!a->limit.empty()) {
        const auto n = parse_int(a->limit, 1, common::k_max_running_limit);
        if (!n)
          return usage("update", "--max-running " + a->limit + " is not a number from 1 to " +
                                     std::to_string(common::k_max_running_limit) + ", or none");
        if (a->batch == 0) return usage("update", "--max-running is a batch's limit; name the batch with --batch");
        q.max_running = *n;
      }
      if ((a->ids.empty() && a->batch == 0) || (!q.priority && !q.retries && !q.timeout_s && !q.max_running))
        return usage("update", "name job ids or --batch, and what to change (--priority, --retries, --timeout, "
                               "--max-running)");
      return cmd_update(ctx.opt, q);
    };
  });
}

void add_clean(CLI::App& app, Context& ctx) {
  struct Args : Selection {
    std::string older_than;
    bool checkpoints_only = false, forget = false;
  };
  auto a = args<Args>();
  auto* sub = app.add_subcommand(
      "clean", "Free the disk ended jobs take: remove their logs and checkpoints (results and history stay, "
               "unless --forget)");
  add_selection(sub, *a, "Job ids (ended ones)", "The ended jobs of this batch");
  sub->add_option("--older-than", a->older_than, "Only jobs that ended this long ago: 90s, 30m, 12h, 7d, 2w (alone: every such job)");
  auto* ckpt = sub->add_flag("--checkpoints", a->checkpoints_only, "Remove only the checkpoints, keep the logs");
  sub->add_flag("--forget", a->forget,
                "Remove the jobs' records too: status, show, results no longer know them (ids are not reused)")
      ->excludes(ckpt);
  add_json_flag(sub, ctx);
  sub->callback([&ctx, a] {
    ctx.run = [&ctx, a] {
      double age = -1;
      if (!a->older_than.empty()) {
        auto parsed = parse_duration(a->older_than);
        if (!parsed)
          return usage("clean", "--older-than " + a->older_than + " is not a duration like 90s, 30m, 12h, 7d or 2w");
        age = *parsed;
      }
      if (a->ids.empty() && a->batch == 0 && age < 0)
        return usage("clean", "name job ids, --batch or --older-than (--older-than 0 cleans every ended job)");
      return cmd_clean(ctx.opt, a->ids, a->batch, age, a->checkpoints_only, a->forget);
    };
  });
}

}  // namespace gpuq::cli
