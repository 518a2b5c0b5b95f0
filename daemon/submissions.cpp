// Submissions (submissions.hpp): checked off gpuqd's thread, accepted on it, written in parts.
#include "daemon/submissions.hpp"

#include "common/users.hpp"
#include "daemon/parts.hpp"

namespace gpuq::daemon {

Submissions::Submissions(boost::asio::io_context& io, Store& store, Accept accept, Written written)
    : m_io(io), m_store(store), m_accept(std::move(accept)), m_written(std::move(written)) {}

Submissions::~Submissions() { m_check_thread.join(); }

void Submissions::submit(const Caller& caller, common::SubmitRequest sub, const MachineFacts& facts,
                         std::optional<uid_t> owner, Later<common::SubmitReply> reply) {
  auto b = std::make_shared<Batch>();
  b->reply = std::move(reply);
  b->max_running = sub.max_running;
  b->caller = caller;
  b->cwd = sub.cwd;
  boost::asio::post(m_check_thread, [this, b, sub = std::move(sub), facts, owner]() mutable {
    try {
      if (owner) {
        auto account = common::account_of(*owner);
        if (!account)
          b->checked = Error{ErrorCode::forbidden, account.error().message + "; gpuq runs each job as its owner"};
        else
          b->account = std::move(*account);
      }
      if (!owner || b->account) b->checked = check_batch(std::move(sub), facts, b->account ? &*b->account : nullptr);
    } catch (const std::exception& e) {  // out of memory, say: the submitter hears of it
      b->checked = Error{ErrorCode::internal, std::string("internal error: ") + e.what()};
    }
    boost::asio::post(m_io, [this, b] { checked(b); });
  });
}

void Submissions::checked(const std::shared_ptr<Batch>& b) {
  if (!b->checked) return b->reply.fail(b->checked.error());
  if (auto accepted = m_accept(*b); !accepted) return b->reply.fail(accepted.error());
  // A batch with any problem is never written, whatever accepted it: its jobs whose specs did not
  // read whole are placeholders.
  if (!b->checked->problems.empty()) return b->reply.fail(b->checked->refusal());
  b->at = wall_now();
  m_queue.push_back(b);
  if (m_queue.size() == 1) write_part();
}

void Submissions::write_part() {
  auto b = m_queue.front();
  auto& batch = *b->checked;
  const std::size_t before = b->write.written;
  bool complete = false;
  try {
    if (b->write.batch != 0 && paused_between_parts(m_io, [this] { write_part(); })) return;
    complete = m_store.insert_batch_part(b->write, batch.jobs, batch.local_deps, b->cwd, json(batch.env), b->at,
                                         b->max_running, part_deadline());
  } catch (const std::exception& e) {
    try {
      m_store.discard_batch();
    } catch (const RequestError&) {  // left hidden; the next batch, or the next start, discards it
    }
    b->reply.fail(ErrorCode::store_error, std::string(e.what()) + "; nothing was submitted");
    return next();
  }
  // The part's jobs become records to go live, a part at a time too: for 100,000 jobs, making
  // them all at the end held gpuqd's thread for 110 ms. Their ids are above every other.
  for (std::size_t i = before; i < b->write.written; ++i) {
    Active a;
    a.rec = std::move(batch.jobs[i]);
    a.queued_since = a.rec.submitted_at;
    b->staged.emplace_hint(b->staged.end(), a.rec.id, std::move(a));
  }
  if (!complete) return boost::asio::post(m_io, [this] { write_part(); });

  common::SubmitReply out{b->write.batch, {}};
  out.ids.reserve(b->staged.size());
  for (const auto& [id, _] : b->staged) out.ids.push_back(id);
  m_written(*b);
  out.epoch = b->epoch, out.cursor = b->cursor;
  b->reply(out);
  next();
}

void Submissions::next() {
  m_queue.pop_front();
  if (!m_queue.empty()) boost::asio::post(m_io, [this] { write_part(); });
}

}  // namespace gpuq::daemon
