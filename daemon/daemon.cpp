// gpuqd's core (see daemon.hpp).
#include "daemon/daemon.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/json_input.hpp"
#include "common/paths.hpp"
#include "common/spec.hpp"
#include "daemon/cpu_topology.hpp"
#include "daemon/events.hpp"
#include "daemon/lifecycle.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/submit_check.hpp"

namespace gpuq::daemon {

namespace {

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

constexpr std::size_t k_max_exit_record = 4 << 20;  // ~4,000 bytes a rank would be 1,000 ranks
constexpr std::size_t k_doomed_part = 512;  // jobs failed for a dependency in one pass (~10 ms)

// The shim's exit record (see supervisor.cpp's write_outcome). It lies in the job's directory,
// which the job can write, so it is read as untrusted input: bounded, and each field kept only
// with the type finish_attempt expects.
json read_outcome(const std::string& path) {
  auto raw = common::read_untrusted_file(path, k_max_exit_record, "exit record");
  if (!raw || !raw->is_object()) return json{{"error", "the job's supervisor ended without recording an outcome"}};
  const auto is_int = [](const json& v) { return v.is_number_integer(); };
  const auto is_num = [](const json& v) { return v.is_number(); };
  const auto is_bool = [](const json& v) { return v.is_boolean(); };
  const auto keep = [&](const json& from, json& to, const char* key, auto type_ok) {
    if (auto it = from.find(key); it != from.end() && type_ok(*it)) to[key] = *it;
  };
  json out = json::object();
  keep(*raw, out, "ended_at", is_num);
  keep(*raw, out, "cancelled", is_bool);
  keep(*raw, out, "timed_out", is_bool);
  if (auto it = raw->find("error"); it != raw->end() && it->is_string()) out["error"] = it->get<std::string>().substr(0, 1000);
  if (auto it = raw->find("ranks"); it != raw->end() && it->is_array()) {
    out["ranks"] = json::array();
    for (const auto& r : *it) {
      json rank = json::object();
      if (r.is_object()) keep(r, rank, "exit_code", is_int);
      out["ranks"].push_back(std::move(rank));
    }
  }
  if (auto it = raw->find("first_failure"); it != raw->end() && it->is_object()) {
    json f = json::object();
    keep(*it, f, "rank", is_int);
    keep(*it, f, "exit_code", is_int);
    keep(*it, f, "signal", is_int);
    keep(*it, f, "oom_kill", is_bool);
    keep(*it, f, "at", is_num);
    out["first_failure"] = std::move(f);
  }
  return out;
}

std::string describe_exit(const json& failure) {
  if (!failure.is_object()) return "failed";
  std::string who = "rank " + std::to_string(failure.value("rank", 0));
  if (failure.contains("signal") && failure["signal"].is_number_integer()) {
    int sig = failure["signal"].get<int>();
    if (failure.value("oom_kill", false))
      return who + " was killed by the kernel's out-of-memory killer (signal 9, SIGKILL)";
    const char* name = sigabbrev_np(sig);
    return who + " was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  if (failure.contains("exit_code") && failure["exit_code"].is_number_integer())
    return who + " exited with code " + std::to_string(failure["exit_code"].get<int>());
  return who + " failed";
}

int pidfd_open(int pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// What the scheduler needs to know of a queued job.
PendingJob pending_of(const JobRecord& r) {
  const auto& s = r.spec;
  return {r.id, s.priority, s.gpus, s.shared, s.gpu_memory_mb, s.timeout_s, s.ranks, s.cpus, r.batch};
}

}  // namespace

Daemon::Daemon(asio::io_context& io, Config config, std::unique_ptr<Store> store, Inventory inventory)
    : m_io(io),
      m_config(std::move(config)),
      m_store(std::move(store)),
      m_inventory(std::move(inventory)),
      m_ingest_timer(io),
      m_backoff_timer(io),
      m_health_timer(io),
      m_forget_timer(io) {
  auto slot_cores = sysfs_slot_cores(m_config.sysfs_root, usable_cores());
  m_cores = std::move(slot_cores.cores);
  m_core_nodes = std::move(slot_cores.nodes);
  if (m_config.cpu_slots <= 0) m_config.cpu_slots = static_cast<int>(m_cores.size());
  m_drained = m_store->drained_gpus();
  m_batch_limits = m_store->batch_limits();
}

Daemon::~Daemon() = default;

// ---- recovery -----------------------------------------------------------------------------------

// A running job's slots map to the cores it was pinned to only under the affinity mask of the
// gpuqd that launched it. Under another mask (say a restart under a new taskset or systemd
// CPUAffinity) it holds instead the slots of its real cores in this mapping, and none for cores
// outside this gpuqd's mask, so no other job is pinned onto them.
void Daemon::rederive_slots(JobRecord& rec) {
  if (rec.cores.empty() || job_cores(rec, m_cores) == rec.cores) return;
  rec.cpu_slots = slots_on_cores(rec.cores, m_cores, m_config.cpu_slots);
  std::cerr << "gpuqd: job " << rec.id << " runs on cores " << common::format_cpu_list(rec.cores)
            << ", launched under another CPU mask; it holds CPU slots " << json(rec.cpu_slots).dump()
            << " of this gpuqd's pool (cores " << common::format_cpu_list(m_cores) << ")\n";
  m_store->update(rec, false);
}

void Daemon::recover() {
  empty_leftover_trash();
  for (auto& rec : m_store->load_active()) {
    const std::int64_t id = rec.id;
    Active& a = m_active[id];
    a.rec = std::move(rec);
    index(a);
    if (a.rec.state != JobState::running) continue;
    rederive_slots(a.rec);
    const std::string adir = attempt_dir(m_config.state_dir, id, a.rec.attempt);
    for (int r = 0; r < a.rec.spec.ranks; ++r) a.event_offsets[r] = m_store->event_offset(id, a.rec.attempt, r);
    // A live supervisor first: an exit record may also be a file the running job wrote itself.
    const auto pid = read_pid_file(adir + "/shim.pid");
    if (pid && is_alive(*pid)) {
      a.shim = *pid;
      std::cerr << "gpuqd: re-adopted job " << id << " (supervisor pid " << pid->pid << ")\n";
      watch(a);
    } else if (file_exists(adir + "/exit.json")) {
      // Ended while no daemon was running: record it now.
      asio::post(m_io, [this, id] { on_shim_exit(id); });
    } else if (!pid) {
      // Marked running but never started (the daemon stopped between the two): start it again
      // as the same attempt.
      JobRecord next = next_record(a.rec, event::NeverStarted{"requeued: gpuqd stopped before the job started"});
      m_store->update(next, true);
      a.rec = std::move(next);
      index(a);  // into the queue: it was filed as running above
    } else {
      asio::post(m_io, [this, id] { on_shim_exit(id); });  // supervisor gone without an outcome
    }
  }
  resume_restarts();
  arm_ingest_timer();
  start_health_checks();
  forget_old_jobs();
  schedule_soon();
}

// ---- dispatch -----------------------------------------------------------------------------------

void Daemon::dispatch(const json& request, Reply reply) {
  using Sync = json (Daemon::*)(const json&);
  static const std::map<std::string, Sync> k_commands{
      {"hello", &Daemon::cmd_hello},   {"status", &Daemon::cmd_status},
      {"show", &Daemon::cmd_show},     {"cancel", &Daemon::cmd_cancel},   {"results", &Daemon::cmd_results},
      {"gpus", &Daemon::cmd_gpus},     {"events", &Daemon::cmd_events},
      {"hold", &Daemon::cmd_hold},     {"release", &Daemon::cmd_release},
      {"update", &Daemon::cmd_update},   {"drain", &Daemon::cmd_drain},     {"undrain", &Daemon::cmd_undrain},
  };
  try {
    if (!request.is_object() || !request.contains("cmd") || !request["cmd"].is_string())
      throw RequestError(ErrorCode::bad_request, "a request is a JSON object with a string field `cmd`");
    const std::string cmd = request["cmd"].get<std::string>();
    if (cmd == "wait") return cmd_wait(request, reply);
    if (cmd == "clean") return cmd_clean(request, reply);
    if (cmd == "submit") return cmd_submit(request, reply);
    if (cmd == "restart") return cmd_restart(request, reply);
    if (cmd == "shutdown") {
      reply(common::ok_reply());
      if (on_shutdown) asio::post(m_io, on_shutdown);
      return;
    }
    auto it = k_commands.find(cmd);
    if (it == k_commands.end())
      throw RequestError(ErrorCode::unknown_command,
                         "unknown command `" + cmd.substr(0, 64) +
                             "`; known: hello, submit, status, show, cancel, restart, hold, release, update, clean, wait, results, "
                             "events, gpus, drain, undrain, shutdown");
    reply(common::ok_reply((this->*(it->second))(request)));
  } catch (const RequestError& e) {
    reply(common::error_reply(e.code(), e.what()));
  } catch (const std::exception& e) {
    reply(common::error_reply(ErrorCode::internal, std::string("internal error: ") + e.what()));
  }
}

json Daemon::cmd_hello(const json& req) {
  auto hello = common::decode_hello(req);
  if (hello.protocol_version != common::k_protocol_version)
    throw RequestError(ErrorCode::version_mismatch,
                       "client speaks protocol " + std::to_string(hello.protocol_version) + ", gpuqd " GPUQ_VERSION
                       " speaks " + std::to_string(common::k_protocol_version) + "; use matching gpuq and gpuqd");
  return common::HelloReply{common::k_protocol_version, GPUQ_VERSION, static_cast<int>(::getpid()), m_config.state_dir};
}

// ---- submit -------------------------------------------------------------------------------------

// A submit is checked on a helper thread (check_batch: parsing, file-system lookups), then written
// in parts, one per turn of gpuqd's loop (Store::insert_batch_part), so that no client waits
// behind a 100,000-job matrix for more than a part's time. Submissions are written one at a time,
// in the order their checks end; the jobs exist for other requests only once all are written.
void Daemon::cmd_submit(const json& req, Reply& reply) {
  auto sub = common::decode_submit(req);
  if (sub.cwd.empty() || sub.cwd[0] != '/')
    throw RequestError(ErrorCode::bad_request, "field `cwd` must be the submitter's absolute working directory");
  MachineFacts facts;
  facts.gpus = static_cast<int>(m_inventory.gpus().size());
  for (const auto& g : m_inventory.gpus()) facts.largest_gpu_mb = std::max(facts.largest_gpu_mb, g.memory_total_mb);
  facts.gpu_source = m_inventory.source();
  facts.have_worker = !m_config.worker_path.empty();
  facts.default_retries = m_config.default_retries;
  auto s = std::make_shared<Submission>();
  s->reply = std::move(reply);
  s->max_running = sub.max_running;
  s->cwd = sub.cwd;
  asio::post(m_check_thread, [this, s, sub = std::move(sub), facts]() mutable {
    try {
      s->checked = check_batch(std::move(sub), facts);
    } catch (const std::exception& e) {  // out of memory, say: the submitter hears of it
      s->checked = Error{ErrorCode::internal, std::string("internal error: ") + e.what()};
    }
    asio::post(m_io, [this, s] { submit_checked(s); });
  });
}

void Daemon::submit_checked(const std::shared_ptr<Submission>& s) {
  if (!s->checked) return s->reply(common::error_reply(s->checked.error()));
  auto& batch = *s->checked;
  std::map<std::int64_t, bool> known;  // each id looked up once, however many jobs name it
  for (const auto& [i, id] : batch.outside_deps) {
    auto [it, fresh] = known.try_emplace(id, false);
    if (fresh) it->second = lookup(id).has_value();
    if (!it->second) {
      const auto& spec = batch.jobs[i].spec;
      batch.problems.push_back("job[" + std::to_string(i) + "] (" + spec.name + "): `after` names " + missing_job(id));
    }
  }
  if (!batch.problems.empty()) return s->reply(common::error_reply(batch.refusal()));
  s->at = wall_now();
  m_submissions.push_back(s);
  if (m_submissions.size() == 1) write_submission();
}

void Daemon::write_submission() {
  auto s = m_submissions.front();
  auto& batch = *s->checked;
  const std::size_t before = s->write.written;
  bool complete = false;
  try {
    if (s->write.batch != 0 && paused_between_parts([this] { write_submission(); })) return;
    complete = m_store->insert_batch_part(s->write, batch.jobs, batch.local_deps, s->cwd, json(batch.env), s->at,
                                          s->max_running, part_deadline());
  } catch (const std::exception& e) {
    try {
      m_store->discard_batch();
    } catch (const RequestError&) {  // left hidden; the next batch, or the next start, discards it
    }
    s->reply(common::error_reply(ErrorCode::store_error, std::string(e.what()) + "; nothing was submitted"));
    return next_submission();
  }
  // The part's jobs become records to go live, a part at a time too: for 100,000 jobs, making
  // them all at the end held gpuqd's thread for 110 ms. Their ids are above every other.
  for (std::size_t i = before; i < s->write.written; ++i) {
    Active a;
    a.rec = std::move(batch.jobs[i]);
    s->staged.emplace_hint(s->staged.end(), a.rec.id, std::move(a));
  }
  if (!complete) return asio::post(m_io, [this] { write_submission(); });

  if (s->max_running > 0) m_batch_limits[s->write.batch] = s->max_running;
  common::SubmitReply out{s->write.batch, {}};
  out.ids.reserve(s->staged.size());
  for (const auto& [id, _] : s->staged) out.ids.push_back(id);
  m_active.merge(s->staged);
  for (auto it = m_active.find(out.ids.front()); it != m_active.end(); ++it) index(it->second, true);
  schedule_soon();
  s->reply(common::ok_reply(out));
  next_submission();
}

void Daemon::next_submission() {
  m_submissions.pop_front();
  if (!m_submissions.empty()) asio::post(m_io, [this] { write_submission(); });
}

// Test hook ($GPUQ_TEST_PAUSE_PARTS=PATH): long requests (a submission's writing, a clean) go in
// parts of 64 jobs, and while PATH exists none goes on past its first part, and PATH.reached
// exists: a test can look at gpuqd in the middle of one. `resume` is called once PATH is gone
// (polled every 10 ms). False: no pause, go on.
bool Daemon::paused_between_parts(std::function<void()> resume) {
  const char* path = std::getenv("GPUQ_TEST_PAUSE_PARTS");
  if (!path || !*path || !file_exists(path)) return false;
  if (!file_exists(std::string(path) + ".reached")) std::ofstream(std::string(path) + ".reached").put('\n');
  auto timer = std::make_shared<asio::steady_timer>(m_io, std::chrono::milliseconds(10));
  timer->async_wait([timer, resume = std::move(resume)](const boost::system::error_code& ec) {
    if (!ec) resume();
  });
  return true;
}

// The end of a part of a long request: now, or sooner under the test hook above (parts of 64 jobs).
std::chrono::steady_clock::time_point Daemon::part_deadline() {
  return parts_hooked() ? std::chrono::steady_clock::time_point::min() : std::chrono::steady_clock::now() + k_part;
}

bool Daemon::parts_hooked() {
  static const bool hooked = std::getenv("GPUQ_TEST_PAUSE_PARTS") != nullptr;
  return hooked;
}

// ---- read commands ------------------------------------------------------------------------------

namespace {
const std::string k_forgotten = "was forgotten (`gpuq clean --forget`)";  // what became of a removed job or batch
}  // namespace

std::optional<JobRecord> Daemon::lookup(std::int64_t id) {
  if (auto it = m_active.find(id); it != m_active.end()) return it->second.rec;
  return m_store->get(id);
}

JobRecord Daemon::existing_job(std::int64_t id) {
  auto rec = lookup(id);
  if (!rec)
    throw RequestError(ErrorCode::not_found, m_store->was_removed(id) ? "job " + std::to_string(id) + " " + k_forgotten
                                                                      : "no job " + std::to_string(id));
  return std::move(*rec);
}

std::string Daemon::missing_job(std::int64_t id) {
  return "job " + std::to_string(id) + ", which " + (m_store->was_removed(id) ? k_forgotten : "does not exist");
}

RequestError Daemon::missing_batch(std::int64_t batch) {
  return RequestError(ErrorCode::not_found, m_store->was_removed(batch, true)
                                                ? "batch " + std::to_string(batch) + " " + k_forgotten
                                                : "no batch " + std::to_string(batch));
}

std::vector<JobRecord> Daemon::jobs_of_batch(std::int64_t batch) {
  auto rows = m_store->batch_jobs(batch);
  if (rows.empty()) throw missing_batch(batch);
  return rows;
}

std::vector<std::int64_t> Daemon::with_queued_of_batch(std::vector<std::int64_t> ids, std::int64_t batch) {
  if (batch != 0)
    for (const auto& rec : jobs_of_batch(batch))
      if (rec.state == JobState::queued) ids.push_back(rec.id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

common::JobInfo Daemon::info_of(const JobRecord& stored) const {
  auto active = m_active.find(stored.id);
  const JobRecord& r = active != m_active.end() ? active->second.rec : stored;
  std::string wait_reason;
  if (active != m_active.end()) {
    const Active& a = active->second;
    // A job the last pass passed over for its batch's limit, or did not reach, waits for that
    // limit, or for what the pass left everyone behind it.
    const auto limit = m_at_limit.find(r.batch);
    if (a.reason_pass == m_pass || r.state != JobState::queued) wait_reason = a.wait_reason;
    else if (limit != m_at_limit.end()) wait_reason = batch_limit_reason(r.batch, limit->second);
    else if (m_tail_stopped) wait_reason = with_drain_note(r.spec.gpus, tail_wait_reason(pending_of(r), m_tail));
    else wait_reason = a.wait_reason;
  }
  common::JobInfo i;
  i.id = r.id;
  i.batch = r.batch;
  i.name = r.spec.name;
  i.state = std::string(to_string(r.state));
  i.attempt = r.attempt;
  i.retries = r.spec.retries;
  i.restarts = r.restarts;
  i.attempt_base = r.attempt_base;
  i.held = r.held;
  i.priority = r.spec.priority;
  i.gpus_requested = r.spec.gpus;
  i.mode = std::string(common::to_string(r.spec.mode));
  i.ranks = r.spec.ranks;
  i.gpus = r.gpus;
  i.cpus_requested = r.spec.cpus;
  // The cores as launched; a store from before they were kept has the slots alone.
  i.cpus = !r.cores.empty() ? r.cores : job_cores(r, m_cores);
  i.mem_bind = std::string(common::to_string(r.spec.mem_bind));
  if (r.spec.mem_bind != common::MemBind::none) i.mem_nodes = numa_nodes_of(i.cpus, m_cores, m_core_nodes);
  i.submitted_at = r.submitted_at;
  i.started_at = r.started_at;
  i.ended_at = r.ended_at;
  i.exit_code = r.exit_code ? json(*r.exit_code) : json();
  i.exit_signal = r.exit_signal ? json(*r.exit_signal) : json();
  i.reason = r.state == JobState::queued && !wait_reason.empty() && r.reason.empty() ? wait_reason : r.reason;
  if (r.held && r.state == JobState::queued)
    i.reason = "held until `gpuq release " + std::to_string(r.id) + "`" + (r.reason.empty() ? "" : "; " + r.reason);
  i.progress = r.progress;
  i.result = r.result;
  i.after = r.after;
  i.bad_event_lines = r.bad_event_lines;
  i.job_dir = job_dir(m_config.state_dir, r.id);
  i.labels = r.spec.labels;
  return i;
}

bool Daemon::add_to_reply(common::JobsReply& out, const JobRecord& r, std::size_t& bytes) const {
  if (out.jobs.size() >= static_cast<std::size_t>(common::k_max_reply_jobs) || bytes >= common::k_max_reply_bytes) {
    out.more = true;
    return false;
  }
  out.jobs.push_back(info_of(r));
  const auto& i = out.jobs.back();
  // What the record's fixed fields take is small; results and progress are what can be large.
  bytes += 512 + (i.result.is_null() ? 0 : i.result.dump().size()) + (i.progress.is_null() ? 0 : i.progress.dump().size());
  return true;
}

json Daemon::cmd_status(const json& req) {
  auto q = common::decode_status(req);
  common::JobsReply out;
  const auto& f = q.filter;
  out.total = m_store->count_jobs(f);
  std::size_t bytes = 0;
  if (q.all) {
    // One page more than asked tells whether another page follows.
    auto rows = m_store->page_after(q.after, q.page + 1, f);
    out.more = rows.size() > static_cast<std::size_t>(q.page);
    if (out.more) rows.pop_back();
    for (const auto& r : rows)
      if (!add_to_reply(out, r, bytes)) break;
    return out;
  }
  const auto keep = [&](const JobRecord& r) {
    return f.empty() || common::matches(f, r.batch, to_string(r.state), r.spec.name);
  };
  // Without all, the lists are cut to the reply's bound (`more`), never paged: running jobs first,
  // then the queue's head, then the most recent ended jobs.
  for (std::int64_t id : m_running)
    if (keep(m_active.at(id).rec) && !add_to_reply(out, m_active.at(id).rec, bytes)) break;
  // Queued jobs in line order, as many as asked: a deep queue need not travel whole, unless a
  // filter has its jobs counted. Held jobs are not in line: they come after it.
  std::int64_t shown = 0, kept = 0;
  const auto visit = [&](std::int64_t id) {  // false: the rest of the line need not be looked at
    const JobRecord& r = m_active.at(id).rec;
    if (!keep(r)) return true;
    ++kept;
    if ((q.queued >= 0 && shown >= q.queued) || out.more) return !f.empty();
    if (add_to_reply(out, r, bytes)) ++shown;
    return true;
  };
  if (f.states.empty() || std::find(f.states.begin(), f.states.end(), "queued") != f.states.end()) {
    bool more = true;
    for (auto it = m_queue.begin(); more && it != m_queue.end(); ++it) more = visit(it->second.job.id);
    for (auto it = m_held.begin(); more && it != m_held.end(); ++it) more = visit(*it);
  }
  out.queued_total = f.empty() ? static_cast<std::int64_t>(m_queue.size() + m_held.size()) : kept;
  for (auto& r : m_store->recent_finished(q.limit, f))
    if (!add_to_reply(out, r, bytes)) break;
  std::sort(out.jobs.begin(), out.jobs.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  return out;
}

json Daemon::cmd_show(const json& req) {
  auto q = common::decode_id(req);
  const JobRecord rec = existing_job(q.id);
  common::ShowReply out;
  out.job = info_of(rec);
  if (auto it = m_batch_limits.find(rec.batch); it != m_batch_limits.end()) out.batch_max_running = it->second;
  out.spec = common::to_json(rec.spec);
  out.history = m_store->history(q.id);
  for (int a = 1; a <= rec.attempt; ++a)
    for (int r = 0; r < rec.spec.ranks; ++r) {
      std::string p = rank_log_path(attempt_dir(m_config.state_dir, q.id, a), r);
      if (file_exists(p)) out.logs.push_back({a, r, p});
    }
  out.first_failure = rec.first_failure;
  return out;
}

json Daemon::cmd_events(const json& req) {
  auto q = common::decode_events(req);
  const int attempts = existing_job(q.id).attempt;
  if (q.attempt > attempts)
    throw RequestError(ErrorCode::not_found, "job " + std::to_string(q.id) + " has " + std::to_string(attempts) +
                                                 " attempt(s); there is no attempt " + std::to_string(q.attempt));
  common::EventsReply out;
  out.id = q.id;
  out.attempt = q.attempt ? q.attempt : attempts;
  // One row more than asked tells whether another page follows.
  auto rows = m_store->events(q.id, out.attempt, q.after, q.page + 1, q.type);
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

json Daemon::cmd_results(const json& req) {
  auto q = common::decode_results(req);
  if (q.ids.empty() && q.batch == 0) throw RequestError(ErrorCode::bad_request, "give job ids or a batch");
  // Every id named must exist (checked on the first page, with one index probe each: a client
  // polling many ids pages through them); then one page of them, in id order.
  std::vector<std::int64_t> ids = q.ids;  // ascending, each once
  if (q.after == 0)
    for (auto id : ids)
      if (!m_active.count(id) && !m_store->exists(id)) existing_job(id);  // not_found, saying why
  // Of the batch, only the page's worth after `after`: the union's first page lies within it.
  std::vector<JobRecord> batch_rows;
  if (q.batch) {
    if (m_store->batch_page(q.batch, 0, 1).empty()) jobs_of_batch(q.batch);  // not_found, saying why
    batch_rows = m_store->batch_page(q.batch, q.after, q.page + 1);
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
    if (!add_to_reply(out, in_batch ? *row : existing_job(*it), bytes)) break;
    ++shown;
  }
  return out;
}

json Daemon::cmd_gpus(const json&) {
  common::GpusReply out;
  out.source = m_inventory.source();
  auto readings = m_inventory.read();
  for (std::size_t i = 0; i < m_inventory.gpus().size(); ++i) {
    const auto& g = m_inventory.gpus()[i];
    common::GpuInfo info;
    info.index = g.index;
    info.uuid = g.uuid;
    info.name = g.name;
    info.memory_total_mb = g.memory_total_mb;
    if (g.numa_node >= 0) info.numa_node = g.numa_node;
    if (auto d = m_drained.find(g.uuid); d != m_drained.end()) {
      info.drained = true;
      info.drain_reason = d->second;
    }
    if (readings[i].memory_used_mb) info.memory_used_mb = *readings[i].memory_used_mb;
    if (readings[i].utilization) info.utilization = *readings[i].utilization;
    for (std::int64_t id : m_running) {
      const Active& a = m_active.at(id);
      if (std::find(a.rec.gpus.begin(), a.rec.gpus.end(), g.index) == a.rec.gpus.end()) continue;
      info.jobs.push_back(id);
      info.allocated_mb += a.rec.spec.shared ? a.rec.spec.gpu_memory_mb : g.memory_total_mb;
      info.exclusive = info.exclusive || !a.rec.spec.shared;
    }
    out.gpus.push_back(std::move(info));
  }
  const CpuSlots cpu = cpu_pool();
  out.cpu_slots = cpu.total;
  for (int slot : cpu.taken) out.cpu_slots_used += slot < cpu.total;
  out.cores = common::format_cpu_list(m_cores);
  return out;
}

json Daemon::cmd_drain(const json& req) { return set_drained(common::decode_drain(req), true); }
json Daemon::cmd_undrain(const json& req) { return set_drained(common::decode_drain(req), false); }

// Takes GPUs out of service (as Slurm's drain) or back: a drained GPU is given to no job, while
// the jobs already on it run on. Kept by UUID in the store, so it stays drained across restarts
// even if indices change. Answers with the GPUs as `gpus` does.
json Daemon::set_drained(const common::DrainRequest& q, bool drain) {
  std::vector<const Gpu*> targets;
  for (int index : q.gpus) {
    const Gpu* g = m_inventory.find(index);
    if (!g) {
      std::string have;
      for (const auto& x : m_inventory.gpus()) have += (have.empty() ? "" : ", ") + std::to_string(x.index);
      throw RequestError(ErrorCode::not_found, "no GPU " + std::to_string(index) + "; this machine has " +
                                                   (have.empty() ? "none" : "GPUs " + have) + " (" +
                                                   m_inventory.source() + ")");
    }
    targets.push_back(g);
  }
  for (const auto& prefix : q.uuids) {
    std::vector<const Gpu*> found;
    for (const auto& g : m_inventory.gpus())
      if (g.uuid.rfind(prefix, 0) == 0) found.push_back(&g);
    if (found.size() != 1)
      throw RequestError(found.empty() ? ErrorCode::not_found : ErrorCode::bad_request,
                         found.empty() ? "no GPU with UUID " + prefix + " (" + m_inventory.source() + ")"
                                       : "UUID prefix " + prefix + " names GPUs " + std::to_string(found[0]->index) +
                                             " and " + std::to_string(found[1]->index) + "; give more of it");
    targets.push_back(found[0]);
  }
  const std::string reason = q.reason.empty() ? "drained with gpuq drain" : q.reason;
  // Back in service, a GPU's ECC errors so far are forgiven: its health baseline is what it has now.
  const auto health = !drain && !m_ecc_base.empty() ? m_inventory.health() : std::vector<GpuHealth>{};
  for (const Gpu* g : targets) {
    const auto it = m_drained.find(g->uuid);
    if (drain ? it != m_drained.end() && it->second == reason : it == m_drained.end()) continue;  // as asked already
    mark_drained(*g, drain, reason);
    if (!health.empty())  // in gpus() order, which `g` points into
      m_ecc_base[g->uuid] = health[static_cast<std::size_t>(g - m_inventory.gpus().data())].ecc_uncorrected;
  }
  schedule_soon();  // jobs may start on a GPU back in service, and reasons change either way
  return cmd_gpus(json::object());
}

void Daemon::mark_drained(const Gpu& g, bool drain, const std::string& reason) {
  m_store->set_drained(g.uuid, drain, reason);
  if (drain) m_drained[g.uuid] = reason;
  else m_drained.erase(g.uuid);
  std::cerr << "gpuqd: GPU " << g.index << (drain ? " drained: " + reason : " back in service") << "\n";
}

void Daemon::start_health_checks() {
  if (m_config.health_interval_s <= 0 || m_inventory.source().rfind("nvml", 0) != 0) return;
  if (!m_inventory.gpus().empty())
    std::cerr << "gpuqd: " << m_inventory.watch_xids() << " of " << m_inventory.gpus().size()
              << " GPU(s) report critical Xid events to the health checks\n";
  // Errors counted before gpuqd started are not held against a GPU: only new ones drain it.
  const auto health = m_inventory.health();
  for (std::size_t i = 0; i < health.size(); ++i) m_ecc_base[m_inventory.gpus()[i].uuid] = health[i].ecc_uncorrected;
  check_health();
}

void Daemon::check_health() {
  const auto health = m_inventory.health();
  bool drained = false;
  for (std::size_t i = 0; i < health.size(); ++i) {
    const Gpu& g = m_inventory.gpus()[i];
    if (m_drained.count(g.uuid)) continue;
    const std::string problem = health_problem(health[i], m_ecc_base[g.uuid]);
    if (problem.empty()) {
      m_ecc_base[g.uuid] = health[i].ecc_uncorrected;  // follows a count reset by a driver reload
      continue;
    }
    try {
      mark_drained(g, true, "health check: " + problem);
      drained = true;
    } catch (const RequestError& e) {
      std::cerr << "gpuqd: GPU " << g.index << " is unhealthy (" << problem << ") but cannot be drained: " << e.what()
                << "\n";
    }
  }
  if (drained) schedule_soon();
  m_health_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_config.health_interval_s * 1000)));
  m_health_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) check_health();
  });
}

// A job needing more GPUs than are in service waits with the scheduler's "needs 4 GPUs; this
// machine has 3" (it is given only the GPUs in service); this adds why there are 3.
std::string Daemon::with_drain_note(int gpus_needed, std::string reason) const {
  if (m_drained.empty()) return reason;  // the usual case, and a pass's hot path
  std::string drained;
  int in_service = 0;
  for (const auto& g : m_inventory.gpus()) {
    if (!m_drained.count(g.uuid)) ++in_service;
    else drained += (drained.empty() ? "" : ", ") + std::to_string(g.index);
  }
  return drained.empty() || gpus_needed <= in_service ? reason : reason + " in service (GPU " + drained + " drained)";
}

CpuSlots Daemon::cpu_pool() const {
  CpuSlots cpu{m_config.cpu_slots, {}, m_core_nodes};
  std::vector<int> unnumbered;  // running jobs started by a gpuqd whose CPU slots had no numbers yet
  for (std::int64_t id : m_running) {
    const Active& a = m_active.at(id);
    cpu.taken.insert(a.rec.cpu_slots.begin(), a.rec.cpu_slots.end());
    if (a.rec.cpu_slots.empty() && a.rec.spec.gpus == 0) unnumbered.push_back(std::min(a.rec.spec.ranks, cpu.total));
  }
  for (int n : unnumbered)
    for (int slot = 0; n > 0 && slot < cpu.total; ++slot)
      if (cpu.taken.insert(slot).second) --n;
  return cpu;
}

// ---- cancel and wait ----------------------------------------------------------------------------

json Daemon::cmd_cancel(const json& req) {
  auto q = common::decode_ids(req);
  // All ids must exist before anything is cancelled: a typo cancels nothing.
  // (Their states alone: an ended job's row may hold a result of a megabyte.)
  std::map<std::int64_t, JobState> states;
  for (auto id : q.ids) {
    auto active = m_active.find(id);
    auto st = active != m_active.end() ? active->second.rec.state : m_store->state_of(id);
    states[id] = st ? *st : existing_job(id).state;  // not_found, saying why
  }
  // One transaction ends the queued ones and records the intent on the running ones (whatever
  // happens next, they end as cancelled): a failed write (disk full) cancels none of them.
  std::vector<JobRecord> cancelled;
  std::set<std::int64_t> now_cancelled;
  for (auto id : q.ids)
    if (auto it = m_active.find(id); it != m_active.end() && it->second.rec.state == JobState::queued &&
                                     now_cancelled.insert(id).second)
      cancelled.push_back(next_record(it->second.rec, event::Cancelled{wall_now()}));
  std::vector<JobRecord> flagged;
  for (auto id : q.ids)
    if (auto it = m_active.find(id);
        it != m_active.end() && it->second.rec.state == JobState::running && !it->second.rec.cancel_requested)
      flagged.push_back(next_record(it->second.rec, event::CancelRequested{}));
  end_queued(std::move(cancelled), flagged);
  for (const auto& r : flagged) m_active.at(r.id).rec.cancel_requested = true;
  common::CancelReply out;
  for (auto id : q.ids) {
    auto it = m_active.find(id);
    if (it == m_active.end()) {
      const bool done_now = now_cancelled.count(id) > 0;
      out.jobs.push_back({id, done_now ? "cancelled" : std::string(to_string(states.at(id))), done_now});
      continue;
    }
    Active& a = it->second;
    if (a.shim.pid > 0 && is_alive(a.shim)) ::kill(a.shim.pid, SIGTERM);
    out.jobs.push_back({id, "running", true});
  }
  schedule_soon();
  return out;
}

JobRecord Daemon::ended_job(std::int64_t id, const std::string& only) {
  JobRecord rec = existing_job(id);
  if (!is_terminal(rec.state))
    throw RequestError(ErrorCode::wrong_state, job_label(rec) + " is " + std::string(to_string(rec.state)) + "; " + only);
  return rec;
}

json Daemon::cmd_hold(const json& req) { return set_held(common::decode_select(req), true); }
json Daemon::cmd_release(const json& req) { return set_held(common::decode_select(req), false); }

// Holds queued jobs out of line (as Slurm's hold: they keep their place in the history, reserve
// nothing, and start only once released), or releases them. Holding needs every named job to be
// queued, or nothing is held; releasing a job that is not held changes nothing. With a batch,
// its queued jobs. Each change is a transition in the job's history.
json Daemon::set_held(const common::SelectRequest& q, bool hold) {
  for (auto id : q.ids) {
    const JobRecord rec = existing_job(id);
    if (hold && rec.state != JobState::queued)
      throw RequestError(ErrorCode::wrong_state,
                         job_label(rec) + " is " + std::string(to_string(rec.state)) + "; only a queued job can be held" +
                             (rec.state == JobState::running ? " (`gpuq cancel` stops a running one)" : ""));
  }
  const std::vector<std::int64_t> ids = with_queued_of_batch(q.ids, q.batch);

  common::CancelReply out;
  std::vector<JobRecord> changed;
  for (auto id : ids) {
    auto it = m_active.find(id);
    const bool change = it != m_active.end() && it->second.rec.state == JobState::queued && it->second.rec.held != hold;
    if (change) changed.push_back(next_record(it->second.rec, event::Held{hold}));
    const JobState state = it != m_active.end() ? it->second.rec.state : lookup(id)->state;
    out.jobs.push_back({id, std::string(to_string(state)), change});
  }
  std::vector<const JobRecord*> rows;
  for (const auto& r : changed) rows.push_back(&r);
  m_store->update_many(rows, std::vector<std::string>(rows.size(), hold ? "held" : "released"));
  for (auto& rec : changed) {
    Active& a = m_active.at(rec.id);
    a.rec = std::move(rec);
    index(a);
  }
  if (!hold && !changed.empty()) schedule_soon();
  return out;
}

// Changes jobs' priority, retries or timeout after submission, as Slurm's `scontrol update`:
// the spec is rewritten and the job takes its new place in line. A running job takes `priority`
// and `retries`, which decide its next attempt; its supervisor enforces the timeout it started
// with, so that cannot change under it. All or nothing; each change is in the job's history.
json Daemon::cmd_update(const json& req) {
  auto q = common::decode_update(req);
  for (auto id : q.ids) {
    const JobRecord rec = existing_job(id);
    if (is_terminal(rec.state))
      throw RequestError(ErrorCode::wrong_state, job_label(rec) + " has ended " + std::string(to_string(rec.state)) +
                                                     "; `gpuq restart` queues it again, and then it can be updated");
    if (rec.state == JobState::running && q.timeout_s)
      throw RequestError(ErrorCode::wrong_state, job_label(rec) +
                                                     " is running: its supervisor enforces the timeout it started "
                                                     "with; only priority and retries can change now");
  }
  const bool spec_fields = q.priority || q.retries || q.timeout_s;
  // Only the batch's limit: its queued jobs are not asked to change.
  const std::vector<std::int64_t> ids = spec_fields ? with_queued_of_batch(q.ids, q.batch) : q.ids;
  if (!spec_fields) jobs_of_batch(q.batch);  // one that exists

  auto change = [](auto& field, const auto& value, const char* name, std::string& why) {
    if (!value || field == *value) return;
    std::ostringstream text;
    text << (why.empty() ? "updated: " : ", ") << name << " " << field << " -> " << *value;
    why += text.str();
    field = *value;
  };
  common::CancelReply out;
  std::vector<JobRecord> changed;
  std::vector<std::string> why;
  for (auto id : ids) {
    JobRecord next = m_active.at(id).rec;
    std::string what;
    change(next.spec.priority, q.priority, "priority", what);
    change(next.spec.retries, q.retries, "retries", what);
    change(next.spec.timeout_s, q.timeout_s, "timeout_s", what);
    out.jobs.push_back({id, std::string(to_string(next.state)), !what.empty()});
    if (what.empty()) continue;
    changed.push_back(std::move(next));
    why.push_back(std::move(what));
  }
  std::vector<const JobRecord*> rows;
  for (const auto& r : changed) rows.push_back(&r);
  m_store->rewrite_specs(rows, why);
  for (auto& rec : changed) {
    Active& a = m_active.at(rec.id);
    unindex(a.rec);  // filed under the old priority
    a.rec = std::move(rec);
    index(a);
  }
  json reply = out;
  if (q.max_running) {  // jobs already running past a lowered limit run on, as in Slurm
    auto it = m_batch_limits.find(q.batch);
    const common::BatchLimitChange limit{q.batch, *q.max_running, it == m_batch_limits.end() ? 0 : it->second};
    m_store->set_batch_limit(q.batch, limit.max_running);
    if (limit.max_running > 0) m_batch_limits[q.batch] = limit.max_running;
    else m_batch_limits.erase(q.batch);
    reply["batch_limit"] = limit;
  }
  if (!changed.empty() || q.max_running) schedule_soon();
  return reply;
}

// Frees the disk ended jobs' files take: the whole job directory (logs, checkpoints, launch and
// events files), or only the checkpoints. Their records, state history, events and results stay,
// so status, show, results and plot still know them, unless `forget` removes those too. A job
// named that has not ended cleans nothing. The jobs are chosen at once, then done a part (~10 ms)
// per turn of gpuqd's loop, so that cleaning 100,000 jobs holds no other client up; each part
// takes only those of its jobs still ended (one restarted meanwhile is left alone) and, to
// forget, still not needed. Each directory is first renamed into the state dir's trash, which is
// instant, so a restarted job finds its place free at once; the trash is emptied on a thread of
// its own, so gpuqd goes on serving while thousands of directories are deleted, and the reply
// comes when they are gone.
void Daemon::cmd_clean(const json& req, Reply& reply) {
  auto q = common::decode_clean(req);
  std::map<std::int64_t, double> ended;  // id -> ended_at
  const char* only = q.forget ? "only a job that has ended can be forgotten"
                              : "only the files of a job that has ended can be removed";
  for (auto id : q.ids) ended[id] = ended_job(id, only).ended_at;
  if (q.batch != 0) {
    if (!m_store->batch_exists(q.batch)) throw missing_batch(q.batch);
    for (const auto& [id, at] : m_store->ended_of_batch(q.batch)) ended[id] = at;
  }
  if (q.ids.empty() && q.batch == 0) {
    for (auto id : m_store->ended_before(q.ended_before)) ended[id] = 0;
  } else if (q.ended_before > 0) {
    std::erase_if(ended, [&](const auto& e) { return e.second >= q.ended_before; });
  }
  if (q.forget) {  // a named job that is still needed is an error; one selected is kept (clean_part)
    const auto needed = still_needed();
    for (auto id : q.ids)
      if (auto it = needed.find(id); it != needed.end())
        throw RequestError(ErrorCode::wrong_state, job_label(existing_job(id)) + " cannot be forgotten: " + it->second);
  }
  make_trash();
  auto c = std::make_shared<Cleaning>();
  c->forget = q.forget;
  c->checkpoints_only = q.checkpoints_only;
  for (const auto& [id, _] : ended) c->ids.push_back(id);
  c->reply = std::move(reply);
  clean_part(c);
}

void Daemon::clean_part(const std::shared_ptr<Cleaning>& c) {
  if (c->next > 0 && paused_between_parts([this, c] { clean_part(c); })) return;
  if (c->forget && c->needed_as_of != m_needs_changed) {
    c->needed = still_needed();
    c->needed_as_of = m_needs_changed;
  }
  const auto deadline = part_deadline();
  std::vector<std::int64_t> part;
  for (; c->next < c->ids.size(); ++c->next) {
    if (!part.empty() && part.size() % 64 == 0 && std::chrono::steady_clock::now() >= deadline) break;
    const std::int64_t id = c->ids[c->next];
    if (m_active.count(id) || m_restarting.count(id)) continue;  // restarted since it was chosen, or being restarted
    if (c->forget)
      if (auto it = c->needed.find(id); it != c->needed.end()) {
        c->out.kept.push_back({id, it->second});
        continue;
      }
    try {
      const std::string dir = job_dir(m_config.state_dir, id) + (c->checkpoints_only ? "/checkpoints" : "");
      if (auto to = move_to_trash(id, dir, c->checkpoints_only); !to.empty()) c->moved.emplace_back(id, std::move(to));
      part.push_back(id);
    } catch (const RequestError& e) {  // its files stay, and so does its record
      c->failures.push_back(e.what());
    }
  }
  try {
    if (c->forget && !part.empty()) {
      for (auto b : m_store->remove_jobs(part)) m_batch_limits.erase(b);
      for (auto id : part) m_terminal_cache.erase(id);
      c->out.forgotten.insert(c->out.forgotten.end(), part.begin(), part.end());
    }
  } catch (const RequestError& e) {  // after the files: the part's jobs are as a plain clean leaves them
    c->failures.push_back(e.what());
    c->next = c->ids.size();
  }
  if (c->next < c->ids.size()) return asio::post(m_io, [this, c] { clean_part(c); });

  if (!c->failures.empty()) {
    std::string msg = "could not clean " + std::to_string(c->failures.size()) + " job(s) (" +
                      std::to_string(c->moved.size()) + " others' files are being removed" +
                      (c->forget ? ", " + std::to_string(c->out.forgotten.size()) + " jobs were forgotten" : "") + "):";
    for (std::size_t i = 0; i < c->failures.size() && i < 10; ++i) msg += "\n  " + c->failures[i];
    empty_trash(std::move(c->moved), nullptr);
    return c->reply(common::error_reply(ErrorCode::store_error, msg));
  }
  empty_trash(std::move(c->moved), std::move(c->reply), std::move(c->out));
}

void Daemon::forget_old_jobs() {
  if (m_config.forget_after_s <= 0) return;
  const double age = m_config.forget_after_s;
  Reply log = [age](json reply) {
    if (!reply.value("ok", false)) {
      std::cerr << "gpuqd: forgetting old jobs failed: " << reply.value("error", json::object()).value("message", "") << "\n";
      return;
    }
    if (auto n = reply["forgotten"].size())
      std::cerr << "gpuqd: forgot " << n << " job(s) that ended over " << static_cast<long long>(age) << " s ago\n";
  };
  try {
    cmd_clean({{"cmd", "clean"}, {"forget", true}, {"ended_before", std::max(1e-3, wall_now() - age)}}, log);
  } catch (const RequestError& e) {
    log(common::error_reply(e.code(), e.what()));
  }
  // A tenth of the age, within a second and an hour: a job outlives its time by at most that.
  m_forget_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(std::clamp(age / 10, 1.0, 3600.0) * 1000)));
  m_forget_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) forget_old_jobs();
  });
}

std::map<std::int64_t, std::string> Daemon::still_needed() const {
  std::map<std::int64_t, std::string> needed;
  for (std::int64_t id : m_with_deps) {
    const JobRecord& r = m_active.at(id).rec;
    for (auto dep : r.after) needed.try_emplace(dep, "queued " + job_label(r) + " waits for it (`after`)");
  }
  for (const auto& w : m_waiters)
    for (auto id : w.ids) needed.try_emplace(id, "a `gpuq wait` is waiting on it");
  for (auto id : m_restarting) needed.try_emplace(id, "a restart under way is queueing it again");
  for (auto id : m_restarting_needs) needed.try_emplace(id, "a restart under way queues a job that waits for it (`after`)");
  return needed;
}

void Daemon::make_trash() {
  if (auto made = common::ensure_private_dir(m_config.state_dir + "/trash"); !made) throw RequestError(made.error());
}

std::string Daemon::move_to_trash(std::int64_t id, const std::string& dir, bool keep_dir) {
  std::error_code ec;
  if (keep_dir && std::filesystem::is_empty(dir, ec)) return "";  // nothing to free
  const std::string to =
      m_config.state_dir + "/trash/" + std::to_string(id) + "-" + std::to_string(::getpid()) + "-" + std::to_string(++m_trash_seq);
  if (::rename(dir.c_str(), to.c_str()) != 0) {
    if (errno == ENOENT) return "";
    throw RequestError(ErrorCode::store_error, "cannot move " + dir + " into the trash: " + std::strerror(errno));
  }
  if (keep_dir) (void)common::ensure_private_dir(dir);  // emptied: the job may be given its path again
  return to;
}

// Deletes directories moved into the trash, on the file-system thread; then, on gpuqd's own
// thread, answers `reply` (when there is one) with what was freed.
void Daemon::empty_trash(std::vector<std::pair<std::int64_t, std::string>> moved, Reply reply, common::CleanReply out) {
  asio::post(m_fs_thread, [this, moved = std::move(moved), reply = std::move(reply), out = std::move(out)]() mutable {
    for (const auto& [id, dir] : moved) {
      std::error_code ec;
      for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) out.bytes_freed += static_cast<std::int64_t>(it->file_size(ec));
      ec.clear();
      std::filesystem::remove_all(dir, ec);
      if (ec) std::cerr << "gpuqd: cannot delete " << dir << ": " << ec.message() << "\n";
      if (id > 0) out.cleaned.push_back(id);
    }
    if (reply) asio::post(m_io, [reply = std::move(reply), out = std::move(out)] { reply(common::ok_reply(out)); });
  });
}

// What a clean left in the trash when gpuqd stopped before it was emptied.
void Daemon::empty_leftover_trash() {
  std::vector<std::pair<std::int64_t, std::string>> left;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(m_config.state_dir + "/trash", ec), end; !ec && it != end;
       it.increment(ec))
    left.emplace_back(0, it->path().string());
  if (!left.empty()) empty_trash(std::move(left), nullptr);
}

void Daemon::cmd_wait(const json& req, Reply& reply) {
  auto q = common::decode_ids(req);
  for (auto id : q.ids)  // all known, or no wait (one index probe each)
    if (!m_active.count(id) && !m_store->exists(id)) existing_job(id);
  std::set<std::int64_t> ids(q.ids.begin(), q.ids.end());
  Waiter w{ids, ids, std::move(reply), nullptr};
  if (q.timeout_s > 0) {
    w.timer = std::make_shared<asio::steady_timer>(m_io);
    w.timer->expires_after(std::chrono::milliseconds(static_cast<long long>(q.timeout_s * 1000)));
    auto timer = w.timer;
    w.timer->async_wait([this, timer](const boost::system::error_code& ec) {
      if (ec) return;
      for (auto it = m_waiters.begin(); it != m_waiters.end(); ++it) {
        if (it->timer != timer) continue;
        common::JobsReply out;
        std::size_t bytes = 0;
        for (auto id : it->ids)
          if (auto rec = lookup(id); rec && !add_to_reply(out, *rec, bytes)) break;
        out.timed_out = true;
        Reply r = std::move(it->reply);
        m_waiters.erase(it);
        r(common::ok_reply(out));
        return;
      }
    });
  }
  m_waiters.push_back(std::move(w));
  ++m_needs_changed;
  notify_waiters();
}

void Daemon::notify_waiters() {
  for (std::size_t i = 0; i < m_waiters.size();) {
    // Each id leaves `pending` once, so a wait on a whole batch costs O(1) per job that ends.
    auto& pending = m_waiters[i].pending;
    while (!pending.empty() && !m_active.count(*pending.begin())) pending.erase(pending.begin());
    if (!pending.empty()) {
      ++i;
      continue;
    }
    common::JobsReply out;
    std::size_t bytes = 0;
    for (auto id : m_waiters[i].ids)
      if (auto rec = m_store->get(id); rec && !add_to_reply(out, *rec, bytes)) break;
    Waiter w = std::move(m_waiters[i]);
    m_waiters.erase(m_waiters.begin() + static_cast<std::ptrdiff_t>(i));
    if (w.timer) w.timer->cancel();
    w.reply(common::ok_reply(out));
  }
}

// ---- scheduling ---------------------------------------------------------------------------------

void Daemon::schedule_soon() {
  if (m_schedule_posted) return;
  m_schedule_posted = true;
  asio::post(m_io, [this] {
    m_schedule_posted = false;
    try {
      schedule_now();
    } catch (const std::exception& e) {
      // A store write that failed (failing a job whose dependency failed): try the pass again.
      std::cerr << "gpuqd: scheduling pass failed: " << e.what() << "; trying again in " << k_write_retry_s << " s\n";
      m_backoff_timer.expires_after(std::chrono::milliseconds(static_cast<int>(k_write_retry_s * 1000)));
      m_backoff_timer.async_wait([this](const boost::system::error_code& ec) {
        if (!ec) schedule_soon();
      });
    }
  });
}

std::optional<JobState> Daemon::dependency_state(std::int64_t id) {
  if (auto it = m_active.find(id); it != m_active.end()) return it->second.rec.state;
  if (auto it = m_terminal_cache.find(id); it != m_terminal_cache.end()) return it->second;
  auto rec = m_store->get(id);
  if (!rec) return std::nullopt;
  m_terminal_cache[id] = rec->state;
  return rec->state;
}

// Fails queued jobs whose dependencies ended without success. Returns true when some are left
// for the next pass.
bool Daemon::fail_blocked_dependents(double now) {
  // The jobs whose dependency ended without success, then, transitively, the jobs waiting for
  // those: a failed chain fails in one pass (a pass per link was quadratic: 21 s for a chain of
  // 20,000), k_doomed_part jobs a transaction, the nearest first, a pass each (one transaction
  // for 20,000 held gpuqd's thread for 435 ms). Those left wait for a failed dependency meanwhile.
  std::vector<std::pair<std::int64_t, std::int64_t>> waiting;  // (dependency, a queued job naming it), sorted
  std::map<std::int64_t, std::int64_t> blocked_by;  // doomed job -> the dependency that dooms it
  std::vector<std::int64_t> doomed;                 // the nearest first
  for (std::int64_t id : m_with_deps) {
    const Active& a = m_active.at(id);
    for (auto dep : a.rec.after) {
      waiting.emplace_back(dep, id);
      if (blocked_by.count(id)) continue;
      auto st = dependency_state(dep);
      if (!st || (is_terminal(*st) && *st != JobState::succeeded)) {
        doomed.push_back(id);
        blocked_by[id] = dep;
      }
    }
  }
  if (doomed.empty()) return false;
  std::sort(waiting.begin(), waiting.end());
  for (std::size_t i = 0; i < doomed.size() && doomed.size() <= k_doomed_part; ++i)  // the jobs behind each doomed one
    for (auto w = std::lower_bound(waiting.begin(), waiting.end(), std::pair<std::int64_t, std::int64_t>{doomed[i], 0});
         w != waiting.end() && w->first == doomed[i]; ++w)
      if (blocked_by.emplace(w->second, doomed[i]).second) doomed.push_back(w->second);
  const bool left = doomed.size() > k_doomed_part;
  if (left) doomed.resize(k_doomed_part);
  std::vector<JobRecord> failed;
  for (auto id : doomed) {
    const std::int64_t dep = blocked_by[id];
    auto st = dependency_state(dep);  // doomed, but still queued: it ends failed in this same transaction
    failed.push_back(next_record(
        m_active.at(id).rec,
        event::DependencyFailed{dep,
                                !st ? "dependency: " + missing_job(dep)
                                    : "dependency " + std::to_string(dep) + " ended " +
                                          std::string(to_string(is_terminal(*st) ? *st : JobState::failed)),
                                now}));
  }
  end_queued(std::move(failed));
  return left;
}

void Daemon::schedule_now() {
  ++m_pass;
  const double now = wall_now();
  if (fail_blocked_dependents(now)) schedule_soon();  // more to fail, in the next pass

  std::vector<PendingJob> queue;
  queue.reserve(m_queue.size());
  BatchLimits limits;  // of the batches with a job in this pass
  std::int64_t seen_batch = 0;  // a batch's jobs lie together in line: its limit is looked up once a run
  double next_retry = 0;
  for (const auto& [_, q] : m_queue) {
    if (q.has_deps || q.not_before > now) {
      Active& a = m_active.at(q.job.id);
      bool deps_done = true;
      for (auto dep : a.rec.after) deps_done = deps_done && dependency_state(dep) == JobState::succeeded;
      if (!deps_done) {
        a.wait_reason = "waiting for dependencies";
        a.reason_pass = m_pass;
        continue;
      }
      if (q.not_before > now) {
        a.wait_reason = "retrying after a backoff";
        a.reason_pass = m_pass;
        next_retry = next_retry == 0 ? q.not_before : std::min(next_retry, q.not_before);
        continue;
      }
    }
    queue.push_back(q.job);  // in scheduling order already
    if (q.job.batch != seen_batch && !m_batch_limits.empty()) {
      seen_batch = q.job.batch;
      if (auto it = m_batch_limits.find(seen_batch); it != m_batch_limits.end()) limits[it->first].limit = it->second;
    }
  }
  if (!limits.empty())
    for (std::int64_t id : m_running)
      if (auto it = limits.find(m_active.at(id).rec.batch); it != limits.end()) ++it->second.running;

  CpuSlots cpu = cpu_pool();

  std::vector<GpuState> gpus;
  for (const auto& g : m_inventory.gpus())  // a drained GPU is not there for a pass
    if (!m_drained.count(g.uuid)) gpus.push_back({g.index, g.memory_total_mb, 0, 0, false, 0, g.numa_node});
  for (std::int64_t id : m_running) {
    const Active& a = m_active.at(id);
    double ends = a.rec.spec.timeout_s > 0 ? a.rec.started_at + a.rec.spec.timeout_s + m_config.grace_s : k_never;
    for (int idx : a.rec.gpus)
      for (auto& g : gpus)
        if (g.index == idx) {
          g.holders++;
          g.allocated_mb += a.rec.spec.shared ? a.rec.spec.gpu_memory_mb : g.total_mb;
          g.exclusive = g.exclusive || !a.rec.spec.shared;
          g.free_at = std::max(g.free_at, ends);
        }
  }

  Plan plan = schedule(std::move(queue), std::move(gpus), now, cpu, true, std::move(limits));
  m_tail_stopped = plan.stopped;
  m_tail = plan.tail;
  m_at_limit = std::move(plan.at_limit);
  for (auto& [id, reason] : plan.waiting) {
    Active& a = m_active.at(id);
    a.wait_reason = with_drain_note(a.rec.spec.gpus, std::move(reason));
    a.reason_pass = m_pass;
  }
  for (const auto& p : plan.start) {
    Active& a = m_active.at(p.id);
    try {
      launch(a, p, now);
    } catch (const RequestError& e) {
      // Still queued (a full disk, say): tried again on a timer, not only when something else
      // happens to trigger a pass.
      std::cerr << "gpuqd: cannot launch job " << p.id << ": " << e.what() << "\n";
      a.wait_reason = std::string("cannot start: ") + e.what() + "; trying again every " +
                      std::to_string(static_cast<int>(k_write_retry_s)) + " s";
      a.reason_pass = m_pass;
      next_retry = next_retry == 0 ? now + k_write_retry_s : std::min(next_retry, now + k_write_retry_s);
    }
  }
  if (next_retry > 0) {
    m_backoff_timer.expires_after(std::chrono::milliseconds(static_cast<long long>((next_retry - now) * 1000) + 1));
    m_backoff_timer.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) schedule_soon();
    });
  }
  arm_ingest_timer();
}

void Daemon::launch(Active& a, const Placement& placement, double now) {
  const std::vector<int>& gpus = placement.gpus;
  event::Launched launched{gpus, placement.cpu_slots, {}, 0, now};
  {
    JobRecord slots = a.rec;  // the cores follow from the slots, under this gpuqd's CPU mask
    slots.cpu_slots = placement.cpu_slots;
    launched.cores = job_cores(slots, m_cores);
  }
  if (a.rec.spec.mode == common::Mode::ddp) {
    std::set<int> in_use;
    for (std::int64_t id : m_running)
      if (const int port = m_active.at(id).rec.master_port) in_use.insert(port);
    launched.master_port = pick_free_port(in_use);
  }
  JobRecord next = next_record(a.rec, launched);

  if (!next.spec.train.is_null()) next.spec.command[0] = m_config.worker_path;
  const std::string jdir = job_dir(m_config.state_dir, next.id);
  const std::string adir = attempt_dir(m_config.state_dir, next.id, next.attempt);
  for (const auto& dir : {adir, jdir + "/checkpoints"})
    if (auto made = common::ensure_private_dir(dir); !made) throw RequestError(made.error());
  std::vector<std::string> uuids;
  for (int idx : gpus)
    if (const Gpu* g = m_inventory.find(idx)) uuids.push_back(g->uuid);
  Env base;
  const json batch_env = m_store->batch_env(next.batch);  // named: items() would dangle on a temporary
  for (const auto& [k, v] : batch_env.items())
    if (v.is_string()) base[k] = v.get<std::string>();
  auto doc = launch_document(next, base, uuids, m_config.state_dir, m_config.grace_s, m_config.log_limit_mb << 20,
                             m_cores, m_core_nodes);
  if (auto w = write_file_atomic(adir + "/launch.json", doc.dump()); !w) throw RequestError(w.error());

  // Durable before the process exists: a crash from here on re-adopts or restarts this attempt.
  m_store->update(next, true);
  a.rec = std::move(next);
  index(a);
  a.wait_reason.clear();
  a.event_offsets.clear();

  // A working directory gone since submission fails the attempt with that reason (a job like
  // `rm -rf ./*` must never run elsewhere; the rank's own chdir also refuses, should it go later).
  struct stat st {};
  if (const bool missing = ::stat(a.rec.spec.cwd.c_str(), &st) != 0; missing || !S_ISDIR(st.st_mode)) {
    const std::string why = missing ? std::strerror(errno) : "not a directory";
    finish_attempt(a, json{{"error", "the job's working directory " + a.rec.spec.cwd + " is gone (" + why + "); not started"}});
    return;
  }
  auto pid = spawn_supervisor(m_config.shim_path, adir);
  if (!pid) {
    std::cerr << "gpuqd: job " << a.rec.id << ": " << pid.error().message << "\n";
    finish_attempt(a, json{{"error", pid.error().message}});
    return;
  }
  a.shim = {*pid, process_start_time(*pid).value_or(0)};
  a.own_child = true;
  watch(a);
}

// ---- process exits ------------------------------------------------------------------------------

void Daemon::watch(Active& a) {
  const std::int64_t id = a.rec.id;
  int fd = pidfd_open(a.shim.pid);
  if (fd >= 0) {
    a.pidfd = std::make_unique<asio::posix::stream_descriptor>(m_io, fd);
    a.pidfd->async_wait(asio::posix::stream_descriptor::wait_read, [this, id](const boost::system::error_code& ec) {
      if (!ec) on_shim_exit(id);
    });
    return;
  }
  if (errno == ESRCH) {
    asio::post(m_io, [this, id] { on_shim_exit(id); });
    return;
  }
  // No pidfd (old kernel): poll the supervisor's liveness.
  a.poll = std::make_unique<asio::steady_timer>(m_io);
  std::function<void()> tick;
  auto* timer = a.poll.get();
  auto poll = std::make_shared<std::function<void()>>();
  *poll = [this, id, timer, poll] {
    timer->expires_after(std::chrono::milliseconds(200));
    timer->async_wait([this, id, poll](const boost::system::error_code& ec) {
      if (ec) return;
      auto it = m_active.find(id);
      if (it == m_active.end()) return;
      if (is_alive(it->second.shim)) (*poll)();
      else on_shim_exit(id);
    });
  };
  (*poll)();
}

void Daemon::on_shim_exit(std::int64_t id) {
  auto it = m_active.find(id);
  if (it == m_active.end() || it->second.rec.state != JobState::running) return;
  Active& a = it->second;
  if (a.own_child) ::waitpid(a.shim.pid, nullptr, WNOHANG);  // reap our zombie
  a.own_child = false;  // reaped: its pid may be another child's by the next try
  a.pidfd.reset();
  a.poll.reset();
  try {
    if (!ingest(a, true)) throw RequestError(ErrorCode::store_error, "its last events could not be stored");
    const std::string adir = attempt_dir(m_config.state_dir, id, a.rec.attempt);
    finish_attempt(a, read_outcome(adir + "/exit.json"));
  } catch (const RequestError& e) {
    // A full disk, say: the job stays running in the records until its end is stored, and its
    // end is tried again, as a launch is; nothing else would ever record it.
    std::cerr << "gpuqd: job " << id << " ended, but its end cannot be recorded (" << e.what() << "); trying again in "
              << k_write_retry_s << " s\n";
    a.poll = std::make_unique<asio::steady_timer>(m_io, std::chrono::milliseconds(static_cast<int>(k_write_retry_s * 1000)));
    a.poll->async_wait([this, id](const boost::system::error_code& ec) {
      if (!ec) on_shim_exit(id);
    });
  }
}

void Daemon::finish_attempt(Active& a, const json& outcome) {
  const double now = wall_now();
  const JobRecord& rec = a.rec;
  bool all_ok = outcome.contains("ranks") && outcome["ranks"].is_array() && !outcome["ranks"].empty();
  if (all_ok)
    for (const auto& r : outcome["ranks"]) all_ok = all_ok && r.value("exit_code", json()) == json(0);
  const json failure = outcome.value("first_failure", json());
  event::Ended end{JobState::failed, "", std::nullopt, std::nullopt, failure, outcome.value("ended_at", now)};
  if (failure.is_object()) {  // (find: operator[] on a const json asserts that the key is there)
    if (auto it = failure.find("exit_code"); it != failure.end() && it->is_number_integer()) end.exit_code = it->get<int>();
    if (auto it = failure.find("signal"); it != failure.end() && it->is_number_integer()) end.exit_signal = it->get<int>();
  } else if (all_ok) {
    end.exit_code = 0;
  }

  bool retryable = false;
  if (rec.cancel_requested || outcome.value("cancelled", false)) {
    end.state = JobState::cancelled;
    end.reason = "cancelled while running";
  } else if (outcome.value("timed_out", false)) {
    end.state = JobState::timed_out;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "timed out after %g s", rec.spec.timeout_s);
    end.reason = buf;
  } else if (all_ok && !failure.is_object()) {
    end.state = JobState::succeeded;
  } else {
    end.reason = outcome.contains("error") ? outcome["error"].get<std::string>() : describe_exit(failure);
    retryable = true;
  }

  const int run = rec.attempt - rec.attempt_base;  // attempts since the job was submitted or restarted
  if (retryable && run <= rec.spec.retries) {
    double delay = std::min(m_config.retry_backoff_max_s, m_config.retry_backoff_s * std::pow(2.0, run - 1));
    end.reason = "attempt " + std::to_string(rec.attempt) + " failed (" + end.reason + "); retry " +
                 std::to_string(run) + "/" + std::to_string(rec.spec.retries) + " in " +
                 std::to_string(static_cast<int>(std::ceil(delay))) + " s";
    // Record the failed attempt's end, then the requeue, as two transitions of one transaction.
    JobRecord failed = next_record(rec, end);
    JobRecord queued = next_record(failed, event::Retried{now + delay, end.reason});
    m_store->update_many({&failed, &queued});
    a.rec = std::move(queued);
    index(a);
    schedule_soon();
    return;
  }
  JobRecord ended = next_record(rec, end);
  m_store->update(ended, true);
  a.rec = std::move(ended);
  finalize(a);
  schedule_soon();
}

void Daemon::end_queued(std::vector<JobRecord> ended, const std::vector<JobRecord>& also) {
  if (ended.empty() && also.empty()) return;
  std::vector<const JobRecord*> rows, quiet;
  for (const auto& r : ended) rows.push_back(&r);
  for (const auto& r : also) quiet.push_back(&r);
  m_store->update_many(rows, {}, quiet);  // throws before anything changed in memory
  for (auto& r : ended) {
    Active& a = m_active.at(r.id);
    a.rec = std::move(r);
    finalize(a);
  }
}

void Daemon::index(const Active& a, bool fresh) {
  if (!fresh) unindex(a.rec);
  if (a.rec.state == JobState::running) m_running.insert(a.rec.id);
  if (a.rec.state != JobState::queued) return;
  // A held job is out of line, but still fails when a dependency does.
  if (!a.rec.after.empty() && m_with_deps.insert(a.rec.id).second) ++m_needs_changed;
  if (a.rec.held)
    m_held.insert(a.rec.id);
  else
    m_queue[{-a.rec.spec.priority, a.rec.id}] = {pending_of(a.rec), a.rec.not_before, !a.rec.after.empty()};
}

void Daemon::unindex(const JobRecord& r) {
  m_running.erase(r.id);
  m_queue.erase({-r.spec.priority, r.id});
  m_with_deps.erase(r.id);
  m_held.erase(r.id);
}

void Daemon::finalize(Active& a) {
  const std::int64_t id = a.rec.id;
  m_terminal_cache[id] = a.rec.state;
  unindex(a.rec);
  m_active.erase(id);
  notify_waiters();
}

// ---- events -------------------------------------------------------------------------------------

bool Daemon::ingest(Active& a, bool ended) {
  const std::string adir = attempt_dir(m_config.state_dir, a.rec.id, a.rec.attempt);
  bool stored = true;
  for (int r = 0; r < a.rec.spec.ranks; ++r) {
    const std::string path = rank_events_path(adir, r);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    std::int64_t& offset = a.event_offsets[r];
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) st.st_size = 0;  // a fifo in its place: nothing to read
    // Bounded reads: a job that floods its events file cannot balloon the daemon's memory. Each
    // read starts one byte early, to tell whether the last one stopped inside a line.
    constexpr std::int64_t k_chunk = 4 << 20;
    while (st.st_size > offset) {
      const std::int64_t from = offset > 0 ? offset - 1 : 0;
      std::string buf(static_cast<std::size_t>(std::min<std::int64_t>(st.st_size - from, k_chunk)), '\0');
      ssize_t n = ::pread(fd, buf.data(), buf.size(), from);
      if (n <= offset - from) break;
      buf.resize(static_cast<std::size_t>(n));
      std::string_view data(buf);
      const bool mid_line = offset > 0 && data[0] != '\n';
      data.remove_prefix(static_cast<std::size_t>(offset - from));
      const bool at_end = from + n >= st.st_size;  // an unterminated line here is the file's last
      auto parsed = parse_events(data, r, wall_now(), mid_line, ended && at_end);
      if (parsed.consumed == 0) break;  // an unfinished line: next time
      JobRecord next = a.rec;
      next.bad_event_lines += parsed.bad_lines + apply_events(next, parsed.events);
      try {
        m_store->add_events(next, r, offset + static_cast<std::int64_t>(parsed.consumed), parsed.events);
      } catch (const RequestError& e) {
        std::cerr << "gpuqd: job " << a.rec.id << ": cannot store events: " << e.what() << "\n";
        stored = false;
        break;
      }
      a.rec = std::move(next);
      offset += static_cast<std::int64_t>(parsed.consumed);
    }
    ::close(fd);
  }
  return stored;
}

void Daemon::arm_ingest_timer() {
  if (m_ingest_armed) return;
  if (m_running.empty()) return;
  m_ingest_armed = true;
  m_ingest_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(m_config.ingest_interval_s * 1000)));
  m_ingest_timer.async_wait([this](const boost::system::error_code& ec) {
    m_ingest_armed = false;
    if (ec) return;
    for (std::int64_t id : m_running) ingest(m_active.at(id));
    arm_ingest_timer();
  });
}

}  // namespace gpuq::daemon
