// Cleaner (cleaner.hpp): freeing ended jobs' files (or forgetting the jobs), a part per turn,
// through the state dir's trash (trash.hpp), which a thread of its own empties; and forgetting old
// jobs on a timer.
#include "daemon/cleaner.hpp"

#include <algorithm>
#include <iostream>
#include <memory>

#include "common/paths.hpp"
#include "daemon/launcher.hpp"
#include "daemon/lifecycle.hpp"
#include "daemon/parts.hpp"

namespace gpuq::daemon {

Cleaner::Cleaner(boost::asio::io_context& io, std::string state_dir, double forget_after_s, Store& store, JobTable& jobs,
                 const RestartPins& pins, const Waiters& waiters, Trash& trash, std::function<Reads()> reads)
    : m_io(io),
      m_state_dir(std::move(state_dir)),
      m_forget_after_s(forget_after_s),
      m_store(store),
      m_jobs(jobs),
      m_pins(pins),
      m_waiters(waiters),
      m_trash(trash),
      m_reads(std::move(reads)),
      m_forget_timer(io) {}

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
void Cleaner::start(const Caller& caller, const common::CleanRequest& q, Later<common::CleanReply>& reply) {
  std::map<std::int64_t, double> ended;  // id -> ended_at
  const char* only = q.forget ? "only a job that has ended can be forgotten"
                              : "only the files of a job that has ended can be removed";
  for (auto id : q.ids) {
    const JobRecord rec = m_reads().ended_job(id, only);
    m_reads().authorize(caller, rec, q.forget ? "forget" : "clean");
    ended[id] = rec.run.ended_at;
  }
  if (q.batch != 0) {
    if (!m_store.batch_exists(q.batch)) throw m_reads().missing_batch(q.batch);
    m_reads().authorize_batch(caller, q.batch, "clean the batch of");
    for (const auto& [id, at] : m_store.ended_of_batch(q.batch)) ended[id] = at;
  }
  if (q.ids.empty() && q.batch == 0) {  // every ended job, or (of one who is no admin) every one of theirs
    for (auto id : m_store.ended_before(q.ended_before))
      if (caller.admin || m_store.owner_of(id) == caller.uid) ended[id] = 0;
  } else if (q.ended_before > 0) {
    std::erase_if(ended, [&](const auto& e) { return e.second >= q.ended_before; });
  }
  if (q.forget) {  // a named job that is still needed is an error; one selected is kept (clean_part)
    const auto needed = still_needed();
    for (auto id : q.ids)
      if (auto it = needed.find(id); it != needed.end())
        throw RequestError(ErrorCode::wrong_state, job_label(m_reads().existing_job(id)) + " cannot be forgotten: " + it->second);
  }
  m_trash.make();
  auto c = std::make_shared<Cleaning>();
  c->forget = q.forget;
  c->checkpoints_only = q.checkpoints_only;
  for (const auto& [id, _] : ended) c->ids.push_back(id);
  c->reply = std::move(reply);
  next_part(c);
}

void Cleaner::next_part(const std::shared_ptr<Cleaning>& c) {
  if (c->next > 0 && paused_between_parts(m_io, [this, c] { next_part(c); })) return;
  if (c->forget && c->needed_as_of != m_jobs.needs_changed()) {
    c->needed = still_needed();
    c->needed_as_of = m_jobs.needs_changed();
  }
  const auto deadline = part_deadline();
  std::vector<std::int64_t> part;
  for (; c->next < c->ids.size(); ++c->next) {
    if (!part.empty() && part.size() % 64 == 0 && std::chrono::steady_clock::now() >= deadline) break;
    const std::int64_t id = c->ids[c->next];
    if (m_jobs.contains(id) || m_pins.pinned(id)) continue;  // restarted since it was chosen, or being restarted
    if (c->forget)
      if (auto it = c->needed.find(id); it != c->needed.end()) {
        c->out.kept.push_back({id, it->second});
        continue;
      }
    try {
      const std::string dir = job_dir(m_state_dir, id) + (c->checkpoints_only ? "/checkpoints" : "");
      if (auto to = m_trash.move(id, dir, c->checkpoints_only); !to.empty()) c->moved.emplace_back(id, std::move(to));
      part.push_back(id);
    } catch (const RequestError& e) {  // its files stay, and so does its record
      c->failures.push_back(e.what());
    }
  }
  try {
    if (c->forget && !part.empty()) {
      for (auto b : m_store.remove_jobs(part)) m_jobs.set_batch_limit(b, 0);
      for (auto id : part) m_jobs.forget_state(id);
      c->out.forgotten.insert(c->out.forgotten.end(), part.begin(), part.end());
    }
  } catch (const RequestError& e) {  // after the files: the part's jobs are as a plain clean leaves them
    c->failures.push_back(e.what());
    c->next = c->ids.size();
  }
  if (c->next < c->ids.size()) return boost::asio::post(m_io, [this, c] { next_part(c); });

  if (!c->failures.empty()) {
    std::string msg = "could not clean " + std::to_string(c->failures.size()) + " job(s) (" +
                      std::to_string(c->moved.size()) + " others' files are being removed" +
                      (c->forget ? ", " + std::to_string(c->out.forgotten.size()) + " jobs were forgotten" : "") + "):";
    for (std::size_t i = 0; i < c->failures.size() && i < 10; ++i) msg += "\n  " + c->failures[i];
    m_trash.empty(std::move(c->moved));
    return c->reply.fail(ErrorCode::store_error, msg);
  }
  empty_trash(std::move(c->moved), std::move(c->reply), std::move(c->out));
}

void Cleaner::forget_old_jobs() {
  if (m_forget_after_s <= 0) return;
  const double age = m_forget_after_s;
  Later<common::CleanReply> log = [age](json reply) {
    if (!reply.value("ok", false)) {
      std::cerr << "gpuqd: forgetting old jobs failed: " << reply.value("error", json::object()).value("message", "") << "\n";
      return;
    }
    if (auto n = reply["forgotten"].size())
      std::cerr << "gpuqd: forgot " << n << " job(s) that ended over " << static_cast<long long>(age) << " s ago\n";
  };
  try {
    common::CleanRequest q;
    q.forget = true;
    q.ended_before = std::max(1e-3, wall_now() - age);
    start(Caller::self(), q, log);
  } catch (const RequestError& e) {
    log.fail(e.code(), e.what());
  }
  // A tenth of the age, within a second and an hour: a job outlives its time by at most that.
  m_forget_timer.expires_after(std::chrono::milliseconds(static_cast<long long>(std::clamp(age / 10, 1.0, 3600.0) * 1000)));
  m_forget_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) forget_old_jobs();
  });
}

std::map<std::int64_t, std::string> Cleaner::still_needed() const {
  std::map<std::int64_t, std::string> needed;
  for (const Active& waiting : m_jobs.with_deps()) {
    const JobRecord& r = waiting.rec;
    for (auto dep : r.after) needed.try_emplace(dep, "queued " + job_label(r) + " waits for it (`after`)");
  }
  m_waiters.for_each_named([&](std::int64_t id) { needed.try_emplace(id, "a `gpuq wait` is waiting on it"); });
  m_pins.for_each_pinned([&](std::int64_t id) { needed.try_emplace(id, "a restart under way is queueing it again"); });
  m_pins.for_each_needed([&](std::int64_t id) {
    needed.try_emplace(id, "a restart under way queues a job that waits for it (`after`)");
  });
  return needed;
}

void Cleaner::empty_trash(Trash::Moved moved, Later<common::CleanReply> reply, common::CleanReply out) {
  // Shared: the trash's callback is a std::function, which must be copyable; a Later is not.
  auto later = std::make_shared<Later<common::CleanReply>>(std::move(reply));
  m_trash.empty(std::move(moved),
                [later, out = std::move(out)](std::int64_t bytes, std::vector<std::int64_t> cleaned) mutable {
                  out.bytes_freed += bytes;
                  out.cleaned.insert(out.cleaned.end(), cleaned.begin(), cleaned.end());
                  (*later)(out);
                });
}

}  // namespace gpuq::daemon
