// The read-only requests (hello, status, show, why, events, results, usage) and the answer to a `wait`: functions
// of what they read (reads.hpp) and the request, no more.
#include "daemon/reads.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "common/paths.hpp"
#include "daemon/config.hpp"
#include "daemon/launcher.hpp"
#include "daemon/lifecycle.hpp"
#include "daemon/pass_inputs.hpp"
#include "daemon/preemption.hpp"

namespace gpuq::daemon {
namespace queries {

common::JobsReply status(const Reads& reads, const Caller& caller, const common::StatusRequest& q) {
  common::JobsReply out;
  const auto& f = q.filter;
  out.total = reads.store.count_jobs(f);
  std::size_t bytes = 0;
  const auto details = [&](uid_t owner) { return may_read_details(caller, owner); };
  if (q.all) {
    // One page more than asked tells whether another page follows.
    auto rows = reads.store.page_after(q.after, q.page + 1, f, details);
    out.more = rows.size() > static_cast<std::size_t>(q.page);
    if (out.more) rows.pop_back();
    for (const auto& r : rows)
      if (!reads.add_to_reply(out, r, bytes, caller)) break;
    return out;
  }
  const auto keep = [&](const JobRecord& r) {
    return f.empty() || common::matches(f, r.batch, r.state, r.spec.name);
  };
  // Without all, the lists are cut to the reply's bound (`more`), never paged: running jobs first,
  // then the queue's head, then the most recent ended jobs.
  for (std::int64_t id : reads.jobs.running_ids())
    if (keep(reads.jobs.at(id).rec) && !reads.add_to_reply(out, reads.jobs.at(id).rec, bytes, caller)) break;
  // Queued jobs in line order, as many as asked: a deep queue need not travel whole, unless a
  // filter has its jobs counted. Held jobs are not in line: they come after it.
  std::int64_t shown = 0, kept = 0;
  const auto visit = [&](std::int64_t id) {  // false: the rest of the line need not be looked at
    const JobRecord& r = reads.jobs.at(id).rec;
    if (!keep(r)) return true;
    ++kept;
    if ((q.queued >= 0 && shown >= q.queued) || out.more) return !f.empty();
    if (reads.add_to_reply(out, r, bytes, caller)) ++shown;
    return true;
  };
  if (f.states.empty() || std::find(f.states.begin(), f.states.end(), JobState::queued) != f.states.end()) {
    bool more = true;
    for (auto it = reads.jobs.queue().begin(); more && it != reads.jobs.queue().end(); ++it) more = visit(it->second.job.id);
    for (auto it = reads.jobs.held().begin(); more && it != reads.jobs.held().end(); ++it) more = visit(*it);
  }
  out.queued_total = f.empty() ? static_cast<std::int64_t>(reads.jobs.queue().size() + reads.jobs.held().size()) : kept;
  for (auto& r : reads.store.recent_finished(q.limit, f, details))
    if (!reads.add_to_reply(out, r, bytes, caller)) break;
  std::sort(out.jobs.begin(), out.jobs.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  return out;
}

common::ShowReply show(const Reads& reads, const Caller& caller, const common::IdRequest& q) {
  const JobRecord rec = reads.existing_job(q.id);
  reads.authorize(caller, rec, "read the details of");  // its environment, result and files
  common::ShowReply out;
  out.job = reads.info_of(rec, caller);
  if (const auto limit = reads.jobs.batch_limit(rec.batch)) out.batch_max_running = *limit;
  out.spec = common::to_json(rec.spec);
  if (caller.protocol_minor < 3 && out.spec.contains("labels"))  // as info_of sends them: text
    for (auto& [_, v] : out.spec["labels"].items())
      if (!v.is_string()) v = v.dump();
  out.history = reads.store.history(q.id);
  for (int a = 1; a <= rec.attempt; ++a)
    for (int r = 0; r < rec.spec.ranks; ++r) {
      std::string p = rank_log_path(attempt_dir(reads.config.state_dir, q.id, a), r);
      if (common::path_exists(p)) out.logs.push_back({a, r, p});
    }
  out.first_failure = rec.run.first_failure;
  out.spec_error = rec.spec_error;
  return out;
}

// `why`: a queued job's wait in full. Its reason as status gives it; then, a sentence each, what
// it waits for: being held, its dependencies' states, a retry's backoff, its batch's or its user's
// limit, drained GPUs or a machine it can never fit, the jobs ahead of it and the reservation one
// of them holds; the running jobs on the GPUs, and from their timeouts the earliest it can start
// (null when one it must wait for has none). Everyone may ask, as everyone sees the queue.
common::WhyReply why(const Reads& reads, const Caller& caller, const common::IdRequest& q) {
  const JobRecord rec = reads.existing_job(q.id);
  common::WhyReply out;
  out.job = reads.info_of(rec, caller);
  auto& d = out.details;
  if (rec.state != JobState::queued) {
    // Its state is the header's (`job 7 (x): succeeded`): said once, with where to look next.
    d.push_back(rec.state == JobState::running
                    ? "it is running"
                    : "it waits for nothing: it has ended (gpuq show " + std::to_string(rec.id) + " says how)");
    if (const auto note = reads.events.hangs().note(rec, wall_now()); !note.empty() && may_read_details(caller, rec))
      d.push_back("it has made " + note);
    return out;
  }
  const double now = wall_now();
  // Preempted, and back in line: by whom, how long ago (its next attempt resumes from its checkpoint).
  if (!rec.run.preempted_by.empty() && rec.run.preempted_at > 0)
    d.push_back("it was preempted by " + rec.run.preempted_by + " " +
                std::to_string(static_cast<long long>(std::max(0.0, now - rec.run.preempted_at))) +
                " s ago (no retry spent); it runs again as attempt " + std::to_string(rec.attempt + 1) +
                ", from its checkpoint if it saved one");
  if (rec.held) d.push_back("it is held: `gpuq release " + std::to_string(rec.id) + "` puts it back in line");
  for (std::int64_t dep : rec.after) {
    const auto st = reads.dependency_state(dep);
    if (!st) d.push_back("it waits for " + reads.missing_job(dep));
    else if (*st != JobState::succeeded)
      d.push_back("it waits for job " + std::to_string(dep) + " to succeed, which is " + std::string(to_string(*st)));
  }
  if (rec.not_before > now) {
    d.push_back("it is retried after a backoff, in " + std::to_string(static_cast<long long>(std::ceil(rec.not_before - now))) + " s");
    out.estimated_start = rec.not_before;
  }
  if (const auto* l = reads.last_pass.batch_at_limit(rec.batch)) d.push_back(batch_limit_reason(rec.batch, *l));
  if (const auto* u = reads.last_pass.user_at_limit(rec.uid); u && user_at_limit(*u, rec.spec.gpus))
    d.push_back(user_limit_reason(reads.users.name_of(rec.uid), *u, rec.spec.gpus));

  // The GPUs: how many it could ever have here, which are free, who holds the others.
  int usable = 0, free = 0;
  std::set<int> held_gpus;
  for (std::int64_t id : reads.jobs.running_ids())
    for (int g : reads.jobs.at(id).rec.run.gpus) held_gpus.insert(g);
  for (const auto& g : reads.inventory.gpus())
    if (!reads.health.drained(g.uuid)) {
      ++usable;
      free += !held_gpus.count(g.index);
    }
  if (rec.spec.gpus > static_cast<int>(reads.inventory.gpus().size()))
    d.push_back("it can never start on this machine: it asks for " + std::to_string(rec.spec.gpus) + " GPUs, and there are " +
                std::to_string(reads.inventory.gpus().size()));
  else if (rec.spec.gpus > usable)
    d.push_back("it asks for " + std::to_string(rec.spec.gpus) + " GPUs, and only " + std::to_string(usable) +
                " are in service (`gpuq undrain` puts the others back)");
  for (const auto& [key, queued] : reads.jobs.queue()) {  // in line order (priority, then id)
    if (queued.job.id == rec.id) break;
    ++out.ahead;
  }
  if (out.ahead > 0) d.push_back(std::to_string(out.ahead) + " job(s) are ahead of it in line");
  for (const auto& [id, gpus] : reads.last_pass.reservations()) {
    if (id == rec.id || gpus.empty()) continue;
    std::string list;
    for (int g : gpus) list += (list.empty() ? "" : ", ") + std::to_string(g);
    const Active* it = reads.jobs.find(id);
    d.push_back("GPU(s) " + list + " are reserved for job " + std::to_string(id) +
                (it ? " (" + reads.users.name_of(it->rec.uid) + "'s " + it->rec.spec.name + ")" : "") +
                ", ahead of it");
  }
  // The jobs being preempted for it: their GPUs come to it once their grace is over.
  const std::string label = job_label(rec);
  for (const Active& running : reads.jobs.running()) {
    const JobRecord& r = running.rec;
    if (!r.run.preempt_requested || r.run.preempted_by != label) continue;
    const double ends =
        ends_by(r, reads.config.grace_s, reads.config.preempt_grace_s, reads.config.preempt_grace_max_s);
    d.push_back(job_label(r) + " (" + reads.users.name_of(r.uid) + "'s) is being preempted for it" +
                (ends == k_never
                     ? std::string()
                     : ": its GPUs are free within " +
                           std::to_string(static_cast<long long>(std::ceil(std::max(0.0, ends - now)))) + " s"));
  }
  const auto label_of = [&](std::int64_t id) {  // a running job, as the refusals below name it
    const Active* a = reads.jobs.find(id);
    return a ? job_label(a->rec) : "job " + std::to_string(id);
  };
  if (rec.spec.gpus == 0) {
    // Waiting for CPU slots: why the preemptible jobs on slots are not frozen for it (a suspension
    // would have started it; preemption.hpp's rules, in its words).
    bool any = false;
    const std::vector<Runner> on_slots =
        runners(reads, any,
                reads.executor.can_suspend() ? [](std::int64_t) { return true; } : std::function<bool(std::int64_t)>());
    const PendingJob me = pending_of(rec);
    const PreemptRules rules = preempt_rules(reads, {me});
    std::string may_not;
    for (const Runner& r : on_slots) {
      if (r.cpu_slots.empty() || !r.preemptible) continue;
      if (const std::string no = preempt_refusal(r, me, now, rules, true); !no.empty())
        may_not += (may_not.empty() ? "" : "; ") + label_of(r.id) + ": " + no;
    }
    if (!may_not.empty()) d.push_back("not to be frozen for it: " + may_not);
    return out;
  }
  for (const Active& running : reads.jobs.running()) {
    const JobRecord& r = running.rec;
    if (r.run.gpus.empty()) continue;
    const double ends =
        ends_by(r, reads.config.grace_s, reads.config.preempt_grace_s, reads.config.preempt_grace_max_s);
    out.holders.push_back({r.id, r.spec.name, reads.users.name_of(r.uid), r.run.gpus, ends == k_never ? 0 : ends});
  }
  const auto ends_of = [](const common::Holder& h) { return h.ends_by > 0 ? h.ends_by : k_never; };  // 0: none
  std::stable_sort(out.holders.begin(), out.holders.end(),
                   [&](const auto& a, const auto& b) { return ends_of(a) < ends_of(b); });
  int lacking = rec.spec.gpus - free;
  // Where preemptible jobs hold GPUs it lacks: which of them it may preempt, and why not the others
  // (preemption.hpp's rules, in its words); nothing where no job is preemptible.
  bool any_preemptible = false;
  const std::vector<Runner> running = runners(reads, any_preemptible);
  if (lacking > 0 && any_preemptible) {
    const PendingJob me = pending_of(rec);
    const PreemptRules rules = preempt_rules(reads, {me});
    std::string may, may_not;
    for (const Runner& r : running) {
      if (r.gpus.empty() || r.stopping) continue;
      const std::string name = label_of(r.id);
      if (const std::string no = preempt_refusal(r, me, now, rules); no.empty())
        may += (may.empty() ? "" : ", ") + name;
      else if (r.preemptible)
        may_not += (may_not.empty() ? "" : "; ") + name + ": " + no;
    }
    if (!may.empty())
      d.push_back(may + (may.find(',') == std::string::npos ? " may" : " may each") + " be preempted for it");
    if (!may_not.empty()) d.push_back("not to be preempted for it: " + may_not);
  }
  // The earliest start: once the holders ending first have freed what it lacks (a lower bound:
  // the jobs ahead of it may take those first).
  if (lacking > 0 && rec.spec.gpus <= usable && out.estimated_start.is_null()) {
    std::set<int> freed;
    for (const auto& h : out.holders) {
      if (h.ends_by == 0) break;  // no timeout: no knowing when
      freed.insert(h.gpus.begin(), h.gpus.end());
      if (static_cast<int>(freed.size()) >= lacking) {
        out.estimated_start = h.ends_by;
        break;
      }
    }
  }
  return out;
}

common::EventsReply events(const Reads& reads, const Caller& caller, const common::EventsRequest& q) {
  const JobRecord rec = reads.existing_job(q.id);
  reads.authorize(caller, rec, "read the events of");
  const int attempts = rec.attempt;
  if (q.attempt > attempts)
    throw RequestError(ErrorCode::not_found, "job " + std::to_string(q.id) + " has " + std::to_string(attempts) +
                                                 " attempt(s); there is no attempt " + std::to_string(q.attempt));
  common::EventsReply out;
  out.id = q.id;
  out.attempt = q.attempt ? q.attempt : attempts;
  // One row more than asked tells whether another page follows.
  auto rows = reads.store.events(q.id, out.attempt, q.after, q.page + 1, q.type);
  out.more = rows.size() > static_cast<std::size_t>(q.page);
  if (out.more) rows.pop_back();
  std::size_t bytes = 0;
  for (auto& e : rows) {
    if (bytes >= common::k_max_reply_bytes) {  // each event is under 1 MiB: the reply stays bounded
      out.more = true;
      break;
    }
    bytes += 64 + e.data.dump().size();
    out.events.push_back({e.seq, e.rank, e.type, e.at, std::move(e.data)});
  }
  return out;
}

common::JobsReply results(const Reads& reads, const Caller& caller, const common::ResultsRequest& q) {
  if (q.ids.empty() && q.batch == 0) throw RequestError(ErrorCode::bad_request, "give job ids or a batch");
  // Every id named must exist (checked on the first page, with one index probe each: a client
  // polling many ids pages through them); then one page of them, in id order.
  std::vector<std::int64_t> ids = q.ids;  // ascending, each once
  if (q.after == 0)
    for (auto id : ids) reads.require_job(id);
  // Of the batch, only the page's worth after `after`: the union's first page lies within it.
  std::vector<JobRecord> batch_rows;
  if (q.batch) {
    if (reads.store.batch_page(q.batch, 0, 1).empty()) reads.jobs_of_batch(q.batch);  // not_found, saying why
    batch_rows = reads.store.batch_page(q.batch, q.after, q.page + 1);
  }
  for (const auto& r : batch_rows) ids.push_back(r.id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  common::JobsReply out;
  std::size_t bytes = 0;
  int shown = 0;
  for (auto it = std::upper_bound(ids.begin(), ids.end(), q.after); it != ids.end(); ++it) {
    if (shown == q.page) {
      out.more = true;
      break;
    }
    auto row = std::lower_bound(batch_rows.begin(), batch_rows.end(), *it,
                                [](const JobRecord& r, std::int64_t id) { return r.id < id; });
    const bool in_batch = row != batch_rows.end() && row->id == *it;
    const JobRecord rec = in_batch ? *row : reads.existing_job(*it);
    reads.authorize(caller, rec, "read the result of");
    if (!reads.add_to_reply(out, rec, bytes, caller)) break;
    ++shown;
  }
  return out;
}

common::JobsReply wait_answer(const Reads& reads, const Caller& caller, const std::set<std::int64_t>& ids, bool timed_out) {
  common::JobsReply out;
  std::size_t bytes = 0;
  for (auto id : ids)
    if (auto rec = reads.lookup(id); rec && !reads.add_to_reply(out, *rec, bytes, caller)) break;
  out.timed_out = timed_out;
  return out;
}

std::size_t watch_answer(const Reads& reads, const Caller& caller, const std::vector<std::int64_t>& ids,
                         common::WatchReply& out) {
  common::JobsReply jobs;
  std::size_t bytes = 0, took = 0;
  for (auto id : ids) {
    if (auto rec = reads.lookup(id); rec && !reads.add_to_reply(jobs, *rec, bytes, caller)) break;
    ++took;
  }
  out.jobs = std::move(jobs.jobs);
  return took;
}

// `hello`: the protocol's version, refused only across a major (common/protocol.hpp), and who the
// caller is.
common::HelloReply hello(const Reads& reads, const Caller& caller, const common::HelloRequest& q) {
  if (q.protocol_version != common::k_protocol_version)
    throw RequestError(ErrorCode::version_mismatch,
                       "client speaks protocol " + std::to_string(q.protocol_version) + ", gpuqd " GPUQ_VERSION
                       " speaks " + std::to_string(common::k_protocol_version) + "; use matching gpuq and gpuqd");
  // Any minor of this major: what the client adds, this gpuqd ignores.
  return common::HelloReply{common::k_protocol_version, common::k_protocol_minor, GPUQ_VERSION, static_cast<int>(::getpid()),
                            reads.config.state_dir, reads.config.multi_user, reads.users.name_of(caller.uid), caller.admin};
}

// `usage`: lab mode's users, their limits, fair share's memory of their GPU use and what they hold
// now. The rules themselves are users.hpp's; the order users' jobs start in is scheduler.hpp's
// fair_order.
common::UsageReply usage(const Reads& reads, const Caller&, const common::NoFields&) {
  const double now = wall_now();
  std::map<uid_t, common::UserUsage> users;
  const auto row = [&](uid_t uid) -> common::UserUsage& {
    auto [it, fresh] = users.try_emplace(uid);
    if (fresh) {
      it->second.uid = uid;
      it->second.user = reads.users.name_of(uid);
      if (const auto* l = reads.users.limits_of(uid)) {
        it->second.max_running = l->max_running;
        it->second.max_gpus = l->max_gpus;
        it->second.max_queued = l->max_queued;
      }
    }
    return it->second;
  };
  for (const auto& [uid, used] : reads.users.recent_uses(now)) row(uid).gpu_hours = used / 3600;
  for (const auto& [id, a] : reads.jobs.all()) {
    auto& u = row(a.rec.uid);
    if (a.rec.state == JobState::running) {
      ++u.running;
      u.gpus += static_cast<int>(a.rec.run.gpus.size());
      u.gpu_hours += static_cast<double>(a.rec.run.gpus.size()) * std::max(0.0, now - a.rec.run.started_at) / 3600;
    } else {
      ++u.queued;
    }
  }
  common::UsageReply out{reads.config.multi_user, reads.config.usage_half_life_s, {}};
  for (auto& [_, u] : users) out.users.push_back(std::move(u));
  std::stable_sort(out.users.begin(), out.users.end(),
                   [](const auto& a, const auto& b) { return a.gpu_hours < b.gpu_hours; });
  return out;
}

common::GpusReply gpus(const Reads& r, const Caller&, const common::NoFields&) {
  common::GpusReply out;
  out.source = r.inventory.source();
  out.scheduling_passes = r.last_pass.number();
  out.health_checks = r.health.checks();
  out.events_reads = r.events.reads().reads;
  out.events_read_max_bytes = r.events.reads().max_bytes;
  out.containment = r.executor.containment();
  auto readings = r.inventory.read();
  const auto processes = r.gpu_processes.list();
  const auto holdings = gpu_holdings(r);
  for (std::size_t i = 0; i < r.inventory.gpus().size(); ++i) {
    const auto& g = r.inventory.gpus()[i];
    common::GpuInfo info;
    info.index = g.index;
    info.uuid = g.uuid;
    info.name = g.name;
    info.memory_total_mb = g.memory_total_mb;
    if (g.numa_node >= 0) info.numa_node = g.numa_node;
    if (auto d = r.health.drained().find(g.uuid); d != r.health.drained().end()) {
      info.drained = true;
      info.drain_reason = d->second;
    }
    if (readings[i].memory_used_mb) info.memory_used_mb = *readings[i].memory_used_mb;
    if (readings[i].utilization) info.utilization = *readings[i].utilization;
    if (processes[i]) {
      info.processes = json::array();
      for (const auto& p : *processes[i]) {
        common::GpuProcessInfo pi;
        pi.pid = p.pid;
        if (p.used_mb) pi.used_mb = *p.used_mb;
        if (p.job) pi.job = p.job;
        else info.foreign_mb += p.used_mb.value_or(0);
        if (const auto owner = common::process_owner(p.pid)) pi.user = r.users.name_of(*owner);
        std::ifstream comm("/proc/" + std::to_string(p.pid) + "/comm");  // at most 16 bytes: the kernel's
        std::getline(comm, pi.command);
        for (char& c : pi.command)  // any process names itself: nothing for a terminal to act on
          if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
        info.processes.push_back(pi);
      }
    }
    if (const auto h = holdings.find(g.index); h != holdings.end()) {
      info.jobs = h->second.jobs;
      info.allocated_mb = h->second.allocated_mb;
      info.exclusive = h->second.exclusive;
    }
    out.gpus.push_back(std::move(info));
  }
  const CpuSlots cpu = r.cpu_pool();
  out.cpu_slots = cpu.total;
  for (int slot : cpu.taken) out.cpu_slots_used += slot < cpu.total;
  out.cores = common::format_cpu_list(r.cores.cores);
  return out;
}

}  // namespace queries
}  // namespace gpuq::daemon
