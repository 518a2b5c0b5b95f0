// The wire protocol between gpuq clients and gpuqd (docs/protocol.md): one JSON object per line
// over a unix socket. Every request has "cmd"; every reply has "ok", and on failure
// "error": {"code", "message"}. One struct per message; requests are decoded with messages that
// name the offending field (each request's field table, protocol.cpp: type, bounds, words), and so
// are replies (GPUQ_JSON_TYPE: a missing field takes its default, one of the wrong type is a
// ReplyFieldError that names it). Both also describe themselves: protocol_schema() is the JSON
// Schema of every command's request and reply (`gpuq schema`, docs/protocol.schema.json).
//
// Longer than the ~600 lines a file is held to: it is the protocol's one list of messages, each
// struct beside its field list, and the command table that binds a request to its reply; split
// into requests and replies, a command's two halves would live apart.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_input.hpp"
#include "common/job_state.hpp"

namespace gpuq {
// A job's state travels as its name ("queued", "timed_out"...), and is a JobState on both sides;
// a name this gpuq does not know is an error, not "queued" (nlohmann's enum macro's fallback).
inline void to_json(nlohmann::json& j, JobState s) { j = std::string(to_string(s)); }
inline void from_json(const nlohmann::json& j, JobState& s) {
  const auto known = j.is_string() ? job_state_from_string(j.get_ref<const std::string&>()) : std::nullopt;
  if (!known)
    throw nlohmann::json::type_error::create(302, "not a job state: " + j.dump().substr(0, 40), &j);
  s = *known;
}
}  // namespace gpuq

namespace gpuq::common {

using json = nlohmann::json;

// A reply field of the wrong type, named by its path ("jobs[3].state: ..."). It is a
// json::exception, so code that catches those catches it.
class ReplyFieldError : public nlohmann::json::exception {
 public:
  ReplyFieldError(const std::string& path, const std::string& problem)
      : exception(0, ("field `" + path + "`: " + problem).c_str()), m_path(path), m_problem(problem) {}
  const std::string& path() const { return m_path; }
  const std::string& problem() const { return m_problem; }

 private:
  std::string m_path, m_problem;
};

namespace detail {
// nlohmann's "[json.exception.type_error.302] type must be string, but is number" without the tag.
inline std::string plain_message(const nlohmann::json::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m[0] == '[')
    if (auto end = m.find("] "); end != std::string::npos) m.erase(0, end + 2);
  return m;
}
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class A>
struct is_vector<std::vector<bool, A>> : std::false_type {};

// An integer number (not a float, however whole) within T's range: nlohmann would cast 1e300 to
// int (undefined) and wrap 4294967297 to 1. Requests and replies check their integers with it.
template <class T>
bool fits_integer(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
  if (!v.is_number_integer()) return false;
  const auto x = v.get<std::int64_t>();
  return x >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
         (std::numeric_limits<T>::max() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          x <= static_cast<std::int64_t>(std::numeric_limits<T>::max()));
}

template <class T>
void field_from_json(const nlohmann::json& j, const std::string& name, T& out, const T& fallback) {
  auto it = j.find(name);
  if (it == j.end()) {
    out = fallback;
    return;
  }
  if constexpr (is_vector<T>::value) {
    if (!it->is_array()) throw ReplyFieldError(name, std::string("must be an array, is ") + it->type_name());
    T items;
    items.reserve(it->size());
    for (std::size_t i = 0; i < it->size(); ++i) {
      try {
        items.push_back((*it)[i].template get<typename T::value_type>());
      } catch (const ReplyFieldError& e) {
        throw ReplyFieldError(name + "[" + std::to_string(i) + "]" + (e.path().empty() ? "" : "." + e.path()), e.problem());
      } catch (const nlohmann::json::exception& e) {
        throw ReplyFieldError(name + "[" + std::to_string(i) + "]", plain_message(e));
      }
    }
    out = std::move(items);
  } else {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (!fits_integer<T>(*it))
        throw ReplyFieldError(name, std::string("must be an integer within range, is ") +
                                        (it->is_number() ? it->dump() : std::string(it->type_name())));
    }
    try {
      out = it->template get<T>();
    } catch (const ReplyFieldError& e) {
      throw ReplyFieldError(e.path().empty() ? name : name + "." + e.path(), e.problem());
    } catch (const nlohmann::json::exception& e) {
      throw ReplyFieldError(name, plain_message(e));
    }
  }
}
inline void require_object(const nlohmann::json& j) {
  if (!j.is_object()) throw ReplyFieldError("", std::string("must be an object, is ") + j.type_name());
}
}  // namespace detail

// NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT, decoding with errors that name the field; and
// gpuq_describe, which names the type and each field with its C++ type and default to a schema
// writer (common/schema.hpp), so a reply's schema comes from the same list as its encoding.
#define GPUQ_JSON_FROM_FIELD(v1) ::gpuq::common::detail::field_from_json(nlohmann_json_j, #v1, nlohmann_json_t.v1, nlohmann_json_default_obj.v1);
#define GPUQ_JSON_DESCRIBE_FIELD(v1) gpuq_schema_s.field(#v1, nlohmann_json_default_obj.v1);
#define GPUQ_JSON_TYPE(Type, ...)                                                       \
  inline void to_json(nlohmann::json& nlohmann_json_j, const Type& nlohmann_json_t) {   \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(NLOHMANN_JSON_TO, __VA_ARGS__))            \
  }                                                                                     \
  inline void from_json(const nlohmann::json& nlohmann_json_j, Type& nlohmann_json_t) { \
    ::gpuq::common::detail::require_object(nlohmann_json_j);                            \
    const Type nlohmann_json_default_obj{};                                             \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(GPUQ_JSON_FROM_FIELD, __VA_ARGS__))        \
  }                                                                                     \
  template <class S>                                                                    \
  void gpuq_describe(S& gpuq_schema_s, const Type*) {                                   \
    const Type nlohmann_json_default_obj{};                                             \
    gpuq_schema_s.name(#Type);                                                          \
    NLOHMANN_JSON_EXPAND(NLOHMANN_JSON_PASTE(GPUQ_JSON_DESCRIBE_FIELD, __VA_ARGS__))    \
  }

// The protocol's version: major.minor. A client and a gpuqd of the same major work together
// whatever their minors: a minor adds (a command, an optional request field, a reply field) and
// changes nothing, so each side ignores what it does not know; a field a client needs from a
// newer minor is asked for only where the hello's reply says that minor. A major changes
// meanings and is refused (`version_mismatch`).
constexpr int k_protocol_version = 1;
// 1: the job state out_of_memory (sent as failed to a client of 0); 2: the command `watch`;
// 3: labels as typed (strings to a client of 2 or less), a job's `first_bad_event`; the command
// `requeue`; 4: the command `preempt`, a job's `preemptible`, `preemptions`, `preempted_by`,
// `preempted_at` and `preempting`; 5: a job's `suspended_for`, `suspended_at` and `suspensions`;
// 6: a job's `gpu_budget_mb`, `gpu_budget_why` and `gpu_budget_at`.
constexpr int k_protocol_minor = 6;
constexpr std::size_t k_max_request_bytes = 1 << 20;  // longer lines are refused unread

// Parses one request line within json_input.hpp's limits (depth, no NUL byte), or a bad_request
// error saying which.
Result<json> parse_request(std::string_view line);

// ---- shared records ---------------------------------------------------------------------------

// A job as status, show, wait and results report it. Optional values are JSON null.
struct JobInfo {
  std::int64_t id = 0;
  std::int64_t batch = 0;
  std::string name;
  JobState state = JobState::queued;
  int attempt = 0;  // 0 before the first start; n during/after the n-th run (restarts included)
  int retries = 0;  // allowed retries from the spec
  int restarts = 0;      // times `restart` queued it again after it had ended
  bool held = false;     // queued, but kept from starting until `release`
  int attempt_base = 0;  // attempts before the latest restart: its retries count from there
  int priority = 0;
  int gpus_requested = 0;
  std::string mode;
  int ranks = 1;
  std::vector<int> gpus;  // assigned GPU indices (current or last attempt)
  int cpus_requested = 0;  // `cpus`: cores per rank, 0 = not asked
  std::vector<int> cpus;   // the cores its ranks are pinned to (current or last attempt)
  std::string mem_bind = "none";  // `mem_bind`: "none", "local" or "prefer"
  std::vector<int> mem_nodes;     // with mem_bind: the NUMA nodes of `cpus` (empty: unknown)
  double submitted_at = 0, started_at = 0, ended_at = 0;  // unix seconds, 0 = not yet
  json exit_code;    // int or null
  json exit_signal;  // int or null
  std::string reason;  // why it failed / was cancelled / waits
  json progress;       // last progress event or null
  json result;         // merged result events of the last attempt, or null
  std::vector<std::int64_t> after;
  std::int64_t bad_event_lines = 0;
  std::string job_dir;
  std::map<std::string, json> labels;  // as typed (minor 3); to a client of an older minor, each as text
  std::string first_bad_event;         // the first event line (or results file) it could not take, and why; "" if none
  std::string external_id;  // the current or last attempt in the system that ran it ("slurm:42"), or ""
  std::string user;  // its owner's name (its uid as text where the user database has none)
  std::int64_t uid = 0;
  bool details_hidden = false;  // lab mode: another user's job; its result, progress, labels and reasons are theirs and admins'
  bool hung = false;  // running, silent for hang_after_s since its last progress event: `reason` says more
  json
      gpu_memory_peak_mb;  // the most GPU memory its processes held on one GPU in any attempt (NVML), null when unknown
  bool preemptible = false;  // (minor 4) a job of higher priority may stop it to start
  int preemptions = 0;       // times it was preempted since it was submitted
  // Queued after a preemption, or running and asked to stop for one (`preempting`): by whom
  // ("job 12 (urgent)", "alice (gpuq preempt)") and when; "" and 0 otherwise.
  std::string preempted_by;
  double preempted_at = 0;
  bool preempting = false;
  // (minor 5) Running, frozen in place for another job that runs on its CPU slots: that job
  // ("job 12 (urgent)") and since when; "" and 0 otherwise. `suspensions`: times it was suspended.
  std::string suspended_for;
  double suspended_at = 0;
  int suspensions = 0;
  // (minor 6) A shared job's GPU memory budget on each of its GPUs (0: none, a job with GPUs of
  // its own); where gpuq raised it from its spec's `gpu_memory_mb`, why and when ("" and 0: as
  // declared).
  std::int64_t gpu_budget_mb = 0;
  std::string gpu_budget_why;
  double gpu_budget_at = 0;
};
GPUQ_JSON_TYPE(JobInfo, id, batch, name, state, attempt, retries, restarts, attempt_base, held, priority,
               gpus_requested, mode, ranks, gpus, cpus_requested, cpus, mem_bind, mem_nodes, submitted_at, started_at,
               ended_at, exit_code, exit_signal, reason, progress, result, after, bad_event_lines, first_bad_event,
               job_dir, labels, external_id, user, uid, details_hidden, hung, gpu_memory_peak_mb, preemptible,
               preemptions, preempted_by, preempted_at, preempting, suspended_for, suspended_at, suspensions,
               gpu_budget_mb, gpu_budget_why, gpu_budget_at)

struct Transition {
  int attempt = 0;
  JobState state = JobState::queued;
  double at = 0;
  std::string reason;
};
GPUQ_JSON_TYPE(Transition, attempt, state, at, reason)

struct LogFile {
  int attempt = 0;
  int rank = 0;
  std::string path;
};
GPUQ_JSON_TYPE(LogFile, attempt, rank, path)

// A process NVML lists on a GPU: one of a job's (`job`), or one gpuq did not start (job null).
struct GpuProcessInfo {
  int pid = 0;
  json used_mb;   // null where the driver cannot say
  json job;       // the running job it belongs to, or null: outside gpuq
  std::string user;     // who runs it ("" once it is gone, or in another pid namespace)
  std::string command;  // its name (/proc/PID/comm)
};
GPUQ_JSON_TYPE(GpuProcessInfo, pid, used_mb, job, user, command)

struct GpuInfo {
  int index = 0;
  std::string uuid;
  std::string name;
  std::int64_t memory_total_mb = 0;
  json memory_used_mb;  // from NVML, null for fake GPUs
  json utilization;     // percent from NVML, null when unknown
  std::int64_t allocated_mb = 0;  // gpuq's own bookkeeping
  bool exclusive = false;         // held whole by one job
  std::vector<std::int64_t> jobs;
  json numa_node;  // the NUMA node of its PCI slot, null when unknown
  bool drained = false;      // out of service: no job is given it (those on it run on)
  std::string drain_reason;  // why, as `drain` was told
  json processes;            // [GpuProcessInfo] from NVML, null where it cannot list them
  std::int64_t foreign_mb = 0;  // held by processes outside gpuq: counted as used when packing
};
GPUQ_JSON_TYPE(GpuInfo, index, uuid, name, memory_total_mb,
                                                memory_used_mb, utilization, allocated_mb,
                                                exclusive, jobs, numa_node, drained, drain_reason,
                                                processes, foreign_mb)

// ---- requests ---------------------------------------------------------------------------------

struct HelloRequest {
  int protocol_version = k_protocol_version;  // required
  int protocol_minor = 0;  // absent (an older client): 0; gpuq sends k_protocol_minor
  std::string client;
  bool operator==(const HelloRequest&) const = default;
};
constexpr int k_max_running_limit = 1000000;  // the largest batch limit on running jobs
// Every reply that lists jobs is bounded, so no request can make gpuqd build a huge reply or hold
// its thread long (docs/reliability.md): at most k_max_reply_jobs jobs in any list (about 50 ms
// of gpuqd's time at 2,000), and a list stops early once its results and progress pass
// k_max_reply_bytes (each job's are bounded too, at 1 MiB). A cut list says `more`; the client
// asks again from the last id it got (`after`).
constexpr int k_max_reply_jobs = 2000;
// 8 MiB: a reply is held whole in gpuqd until its client reads it, and a user's unread replies are
// bounded at 32 MiB (daemon/outbox.hpp); a list of larger jobs takes more pages.
constexpr std::size_t k_max_reply_bytes = 8 << 20;
// The longest reply line a client reads: a list cut at 64 MiB (earlier gpuqds' bound), its last
// job's 1 MiB and the rest of the reply fit with room to spare. A longer one is not gpuqd's.
constexpr std::size_t k_max_reply_line = (64 << 20) + (16 << 20);

struct SubmitRequest {
  json jobs;  // one spec object or an array: validated by common::parse_batch in the daemon
  std::string cwd;
  std::map<std::string, std::string> env;  // the submitter's environment, the jobs' base env
  bool hold = false;  // queue the jobs held: none starts before `release`
  int max_running = 0;  // at most this many of the batch's jobs run at once (0: no limit)
  bool operator==(const SubmitRequest&) const = default;
};
// Which jobs a status lists: all three must hold (an empty one holds for every job).
struct JobFilter {
  std::int64_t batch = 0;           // its jobs only (0: any batch)
  std::vector<JobState> states;     // jobs in one of these states
  std::string name;                 // names matching this shell-style glob: * ? [...]
  bool empty() const { return batch == 0 && states.empty() && name.empty(); }
  bool operator==(const JobFilter&) const = default;
};
bool matches(const JobFilter& f, std::int64_t batch, JobState state, const std::string& name);

struct StatusRequest {
  JobFilter filter;
  bool all = false;
  int limit = 20;  // finished jobs shown besides the active ones (ignored with all): 0..k_max_reply_jobs
  // With all: one page of every job, in id order, from the first id above `after`; the reply's
  // `more` says whether another page follows. Clients page through history of any size with
  // bounded memory on both sides.
  std::int64_t after = 0;
  int page = 1000;  // 1..k_max_reply_jobs
  // Without all: at most this many queued jobs, the first in line, up to k_max_reply_jobs; -1 =
  // as many as a reply holds. `queued_total` counts them all.
  std::int64_t queued = -1;
  bool operator==(const StatusRequest&) const = default;
};
struct IdRequest {  // show
  std::int64_t id = 0;
  bool operator==(const IdRequest&) const = default;
};
struct IdsRequest {  // cancel, wait
  std::vector<std::int64_t> ids;  // each once, in the order first named
  double timeout_s = 0;  // wait only: 0 = until done
  bool operator==(const IdsRequest&) const = default;
};
// Jobs named by id and by batch: hold and release (the batch's queued jobs), and the requests below.
struct SelectRequest {
  std::vector<std::int64_t> ids;
  std::int64_t batch = 0;  // and this batch's jobs the command applies to
  bool operator==(const SelectRequest&) const = default;
};
struct RestartRequest : SelectRequest {  // ids: ended jobs; batch: its jobs that ended without success
  bool fresh = false;                     // empty their checkpoint directories: start over, not resume
  bool operator==(const RestartRequest&) const = default;
};
struct DrainRequest {  // drain, undrain
  std::vector<int> gpus;           // GPU indices, as `gpuq gpus` shows them
  std::vector<std::string> uuids;  // and GPUs by UUID, or a prefix of one naming one GPU ("GPU-1a2b")
  std::string reason;     // drain: why
  bool operator==(const DrainRequest&) const = default;
};
struct UpdateRequest : SelectRequest {  // ids: queued jobs (running ones: `priority` and `retries` only)
  // From `set`, checked as a job spec's fields are: the ones to change.
  std::optional<int> priority, retries;
  std::optional<double> timeout_s;  // 0: no timeout (`"timeout_s": null`)
  std::optional<int> max_running;   // the batch's limit (needs `batch`); 0: none (`null`)
  bool operator==(const UpdateRequest&) const = default;
};
struct CleanRequest : SelectRequest {  // ids: ended jobs; batch: its ended jobs
  double ended_before = 0;        // > 0: only jobs that ended before this time (alone: every such job)
  bool checkpoints_only = false;  // remove the checkpoints, keep the logs
  bool forget = false;            // remove the jobs' records too (not with checkpoints_only)
  bool operator==(const CleanRequest&) const = default;
};
struct ResultsRequest {
  std::vector<std::int64_t> ids;  // each once, ascending, whatever the request repeated
  std::int64_t batch = 0;
  // One page: the jobs named (ids and batch) with ids above `after`, in id order, at most `page`
  // (1..k_max_reply_jobs); the reply's `more` says whether another page follows.
  std::int64_t after = 0;
  int page = k_max_reply_jobs;
  bool operator==(const ResultsRequest&) const = default;
};

// `watch`: the jobs that changed since a cursor, answered once one has (or at the timeout). See
// docs/protocol.md#watch and daemon/watches.hpp.
struct WatchRequest {
  std::int64_t epoch = 0;         // the epoch `after` was given in (0 with after 0: none yet)
  std::int64_t after = 0;         // the cursor of the last reply: changes after it
  std::vector<std::int64_t> ids;  // only these jobs (at most k_max_reply_jobs); none: every job the caller sees
  std::int64_t batch = 0;         // only this batch's jobs (0: any)
  double timeout_s = 30;          // how long gpuqd holds the request when nothing changed: 0..300
  int page = 1000;                // at most this many jobs in the reply: 1..k_max_reply_jobs
  bool operator==(const WatchRequest&) const = default;
};

struct EventsRequest {
  std::int64_t id = 0;
  int attempt = 0;         // 0: the job's latest attempt
  std::string type;        // "progress", "result", "checkpoint", or "" for all
  std::int64_t after = 0;  // events with seq above this (paging: the last seq received)
  int page = 10000;        // 1..100000
  bool operator==(const EventsRequest&) const = default;
};

// A request without fields (gpus, usage, shutdown); whatever else the request holds is ignored.
// Also the reply of a command that answers only {"ok": true} (shutdown).
struct NoFields {
  bool operator==(const NoFields&) const = default;
};
inline void to_json(json& j, const NoFields&) {
  j = json::object();
}
inline void from_json(const json&, NoFields&) {}
template <class S>
void gpuq_describe(S& s, const NoFields*) {
  s.name("NoFields");
}

// ---- request fields -----------------------------------------------------------------------------
// Each request type's fields are one table in protocol.cpp (fields_of): name, type, bounds,
// default, and the words an error and the schema use ("a positive job id"), plus the rules over
// several fields. Decoding, encoding and the request's schema all come from it: decoding refuses
// a value of the wrong type or out of bounds with RequestError(bad_request) "field `x` must be
// <words>" (an update's values, checked as a job spec's are: invalid_spec); a missing or null field
// takes the default; fields it does not know are ignored (a newer client's). Encoding writes the
// fields that differ from the defaults, and the required ones.
struct FieldTable;
const FieldTable& fields_of(const HelloRequest*);
const FieldTable& fields_of(const SubmitRequest*);
const FieldTable& fields_of(const StatusRequest*);
const FieldTable& fields_of(const IdRequest*);
const FieldTable& fields_of(const IdsRequest*);
const FieldTable& fields_of(const SelectRequest*);
const FieldTable& fields_of(const RestartRequest*);
const FieldTable& fields_of(const UpdateRequest*);
const FieldTable& fields_of(const CleanRequest*);
const FieldTable& fields_of(const ResultsRequest*);
const FieldTable& fields_of(const EventsRequest*);
const FieldTable& fields_of(const WatchRequest*);
const FieldTable& fields_of(const DrainRequest*);
const FieldTable& fields_of(const NoFields*);
namespace detail {
void decode_fields(const FieldTable& t, const json& j, void* request);
json encode_fields(const FieldTable& t, std::string_view cmd, const void* request);
}  // namespace detail

// ---- replies ----------------------------------------------------------------------------------

struct HelloReply {
  int protocol_version = k_protocol_version;
  int protocol_minor = 0;  // absent (an older gpuqd): 0; gpuqd sends k_protocol_minor
  std::string daemon_version;
  int pid = 0;
  std::string state_dir;
  bool multi_user = false;  // lab mode: one gpuqd for every user of the machine (docs/lab.md)
  std::string user;         // the caller, as gpuqd knows it
  bool admin = false;       // whether the caller may act on every job
};
GPUQ_JSON_TYPE(HelloReply, protocol_version, protocol_minor, daemon_version, pid,
                                                state_dir, multi_user, user, admin)

struct SubmitReply {
  std::int64_t batch = 0;
  std::vector<std::int64_t> ids;
  // Where the watch stream stood just before the batch's jobs went live (0, 0 from a gpuqd without
  // it): a watch from there on the ids tells of each job at once, then of its changes.
  std::int64_t epoch = 0;
  std::int64_t cursor = 0;
};
GPUQ_JSON_TYPE(SubmitReply, batch, ids, epoch, cursor)

struct JobsReply {  // status, wait, results
  std::vector<JobInfo> jobs;
  std::int64_t total = 0;  // status: jobs in history (shown or not) that the filter keeps
  bool timed_out = false;  // wait: the wait's own timeout expired first
  bool more = false;       // the list was cut (a page, or the reply's bound): ask again with `after`
  std::int64_t queued_total = 0;  // status: queued jobs, shown or not, that the filter keeps
};
GPUQ_JSON_TYPE(JobsReply, jobs, total, timed_out, more, queued_total)

struct ShowReply {
  JobInfo job;
  int batch_max_running = 0;  // its batch's limit on running jobs, 0 for none
  json spec;
  std::vector<Transition> history;
  std::vector<LogFile> logs;
  json first_failure;  // {rank, exit_code, signal} of the last failed attempt, or null
  // Why its stored spec does not parse (written by a later gpuq, or damaged), "" when it does:
  // then `spec` holds only its name and ranks, and the job cannot run again.
  std::string spec_error;
};
GPUQ_JSON_TYPE(ShowReply, job, batch_max_running, spec, history, logs, first_failure, spec_error)

// `why`: what a job waits for, in full.
struct Holder {  // a running job on GPUs the waiting one could use
  std::int64_t id = 0;
  std::string name, user;
  std::vector<int> gpus;
  double ends_by = 0;  // started + timeout (+ the grace period): it is over by then; 0 for no timeout
};
GPUQ_JSON_TYPE(Holder, id, name, user, gpus, ends_by)
struct WhyReply {
  JobInfo job;
  std::vector<std::string> details;  // what it waits for, a sentence each
  std::vector<Holder> holders;       // the running jobs holding GPUs, those ending first first
  std::int64_t ahead = 0;            // queued jobs ahead of it in line
  json estimated_start;              // unix time: the earliest it can start, from the holders' timeouts; or null
};
GPUQ_JSON_TYPE(WhyReply, job, details, holders, ahead, estimated_start)

struct Event {
  std::int64_t seq = 0;  // increasing in the order gpuqd read the events
  int rank = 0;
  std::string type;      // "progress" or "result"
  double at = 0;         // when gpuqd read it (unix seconds)
  json data;             // the event as the job wrote it
};
GPUQ_JSON_TYPE(Event, seq, rank, type, at, data)
struct EventsReply {
  std::int64_t id = 0;
  int attempt = 0;  // the attempt these events belong to (0: the job never started)
  std::vector<Event> events;
  bool more = false;  // another page follows: ask again with `after` = the last seq
};
GPUQ_JSON_TYPE(EventsReply, id, attempt, events, more)

struct WatchReply {
  std::int64_t epoch = 0;   // this gpuqd's run: a cursor of another one is not resumed (reset)
  std::int64_t cursor = 0;  // the next request's `after`
  std::vector<JobInfo>
      jobs;  // each job that changed after `after` (once, as it is now), in the order of its first change
  bool reset =
      false;  // `after` could not be resumed from: read the jobs afresh (status, results), then watch from `cursor`
  bool more = false;  // cut at the page or the reply's bound: ask again at once
};
GPUQ_JSON_TYPE(WatchReply, epoch, cursor, jobs, reset, more)

struct CancelOutcome {  // cancel, hold, release
  std::int64_t id = 0;
  JobState state = JobState::queued;  // state after the request
  bool changed = false;
};
GPUQ_JSON_TYPE(CancelOutcome, id, state, changed)
struct CancelReply {
  std::vector<CancelOutcome> jobs;
};
GPUQ_JSON_TYPE(CancelReply, jobs)
// update's reply: a CancelReply (the jobs whose spec fields were asked to change), with
// `batch_limit` when it set the batch's `max_running`.
struct BatchLimitChange {
  std::int64_t batch = 0;
  int max_running = 0, was = 0;  // 0: no limit
};
GPUQ_JSON_TYPE(BatchLimitChange, batch, max_running, was)

struct RestartOutcome {
  std::int64_t id = 0;
  std::string was;          // the state it had ended in
  std::int64_t with = 0;    // 0: asked for; else the restarted job it had failed waiting for
};
GPUQ_JSON_TYPE(RestartOutcome, id, was, with)
struct RestartReply {
  std::vector<RestartOutcome> jobs;  // in id order, the first k_max_reply_jobs
  std::int64_t total = 0;            // jobs queued again, all of them
  std::map<std::string, std::int64_t> was;  // of those, how many had ended in each state
  std::int64_t along = 0;            // of those, how many came with a job they wait for
  bool more = false;                 // `jobs` holds the first k_max_reply_jobs only
};
GPUQ_JSON_TYPE(RestartReply, jobs, total, was, along, more)

struct KeptJob {  // an ended job a clean --forget selected but kept, and why
  std::int64_t id = 0;
  std::string reason;
};
GPUQ_JSON_TYPE(KeptJob, id, reason)
struct CleanReply {
  std::vector<std::int64_t> cleaned;  // jobs whose files were removed, by id
  std::int64_t bytes_freed = 0;
  std::vector<std::int64_t> forgotten;  // forget: jobs whose records were removed, by id
  std::vector<KeptJob> kept;            // forget: selected by batch or age but still needed
};
GPUQ_JSON_TYPE(CleanReply, cleaned, bytes_freed, forgotten, kept)

struct GpusReply {
  std::string source;  // "nvml", "fake:N:MiB[:NODES]" or "none"
  std::vector<GpuInfo> gpus;
  int cpu_slots = 0;       // gpuqd's CPU pool
  int cpu_slots_used = 0;  // held by running jobs
  std::string cores;       // the cores the pool's slots map to, e.g. "0-15"
  // Since gpuqd started: scheduling passes run and GPU health checks read. What has not happened
  // yet is said by waiting for these to move on, not by sleeping (a loaded box runs fewer).
  std::uint64_t scheduling_passes = 0;
  std::uint64_t health_checks = 0;
  // Reads of running jobs' events files (one rank's file at one tick), and the most bytes one read.
  std::uint64_t events_reads = 0;
  std::int64_t events_read_max_bytes = 0;
  // `watch`es held now (each waits for a change it asks about), and those answered so far.
  std::uint64_t watches_held = 0;
  std::uint64_t watch_answers = 0;
  std::uint64_t waits_held = 0;  // `wait`s held now
  // Replies made and not yet read by their clients and request lines read in part, in bytes, and
  // the connections closed since gpuqd started for holding too many (docs/reliability.md).
  // Admins' alone, as the watches'.
  std::uint64_t replies_unread_bytes = 0;
  std::uint64_t connections_dropped = 0;
  std::uint64_t connections_open = 0;  // clients connected now, this one's included
  // What holds a job's processes together and out of others' reach (Executor::containment):
  // "a cgroup per attempt (cgroup v2 at ... (cgroup.kill))", or what is used where none can be made.
  std::string containment;
};
GPUQ_JSON_TYPE(GpusReply, source, gpus, cpu_slots, cpu_slots_used, cores, scheduling_passes, health_checks,
               events_reads, events_read_max_bytes, watches_held, watch_answers, waits_held, replies_unread_bytes,
               connections_dropped, connections_open, containment)

// `usage` (lab mode): each user's recent GPU use, what they hold and wait for, and their limits.
struct UserUsage {
  std::string user;
  std::int64_t uid = 0;
  double gpu_hours = 0;   // recent GPU use: GPU-hours, decayed by half every half_life_s
  int running = 0;        // jobs
  int gpus = 0;           // GPUs their running jobs hold
  std::int64_t queued = 0;  // jobs waiting
  int max_running = 0, max_gpus = 0;  // their limits (0: none)
  std::int64_t max_queued = 0;
};
GPUQ_JSON_TYPE(UserUsage, user, uid, gpu_hours, running, gpus, queued, max_running,
                                                max_gpus, max_queued)
struct UsageReply {
  bool multi_user = false;
  double half_life_s = 0;
  std::vector<UserUsage> users;  // those with jobs or recent use, least recent use first
};
GPUQ_JSON_TYPE(UsageReply, multi_user, half_life_s, users)

// update's reply: the jobs whose spec fields were asked to change, and `batch_limit` (only) when
// it set the batch's `max_running`.
struct UpdateReply {
  std::vector<CancelOutcome> jobs;
  std::optional<BatchLimitChange> batch_limit;
};
void to_json(json& j, const UpdateReply& r);
void from_json(const json& j, UpdateReply& r);
template <class S>
void gpuq_describe(S& s, const UpdateReply*) {
  s.name("UpdateReply");
  s.field("jobs", std::vector<CancelOutcome>{});
  s.field("batch_limit", std::optional<BatchLimitChange>{});
}

// ---- the command table ------------------------------------------------------------------------
// A command of the protocol, bound to the request it takes and the reply it gives. The objects in
// `cmd` and the list k_commands are the only list of commands: gpuqd's dispatch pairs each with a
// handler (daemon.cpp, in this order; a unit test holds the two the same) whose answer must be of
// the command's reply type, request_decoders() and the request fuzzer walk it, the client encodes
// through it, and protocol_schema() describes it, so a command's name cannot drift from its
// request's or its reply's type.
template <class Request, class Reply>
struct Cmd {
  using request = Request;
  using reply = Reply;
  std::string_view name;
  // The request from its JSON, by the request type's field table; throws RequestError.
  Request decode(const json& j) const {
    Request r{};
    detail::decode_fields(fields_of(static_cast<const Request*>(nullptr)), j, &r);
    return r;
  }
};

namespace cmd {
inline constexpr Cmd<HelloRequest, HelloReply> hello{"hello"};
inline constexpr Cmd<SubmitRequest, SubmitReply> submit{"submit"};
inline constexpr Cmd<StatusRequest, JobsReply> status{"status"};
inline constexpr Cmd<IdRequest, ShowReply> show{"show"};
inline constexpr Cmd<IdsRequest, CancelReply> cancel{"cancel"};
inline constexpr Cmd<IdsRequest, CancelReply> requeue{"requeue"};
inline constexpr Cmd<IdsRequest, CancelReply> preempt{"preempt"};
inline constexpr Cmd<RestartRequest, RestartReply> restart{"restart"};
inline constexpr Cmd<SelectRequest, CancelReply> hold{"hold"};
inline constexpr Cmd<SelectRequest, CancelReply> release{"release"};
inline constexpr Cmd<UpdateRequest, UpdateReply> update{"update"};
inline constexpr Cmd<CleanRequest, CleanReply> clean{"clean"};
inline constexpr Cmd<IdsRequest, JobsReply> wait{"wait"};
inline constexpr Cmd<ResultsRequest, JobsReply> results{"results"};
inline constexpr Cmd<EventsRequest, EventsReply> events{"events"};
inline constexpr Cmd<WatchRequest, WatchReply> watch{"watch"};
inline constexpr Cmd<NoFields, GpusReply> gpus{"gpus"};
inline constexpr Cmd<DrainRequest, GpusReply> drain{"drain"};
inline constexpr Cmd<DrainRequest, GpusReply> undrain{"undrain"};
inline constexpr Cmd<IdRequest, WhyReply> why{"why"};
inline constexpr Cmd<NoFields, UsageReply> usage{"usage"};
inline constexpr Cmd<NoFields, NoFields> shutdown{"shutdown"};
}  // namespace cmd

inline constexpr auto k_commands =
    std::tie(cmd::hello, cmd::submit, cmd::status, cmd::show, cmd::cancel, cmd::requeue, cmd::preempt, cmd::restart,
             cmd::hold, cmd::release, cmd::update, cmd::clean, cmd::wait, cmd::results, cmd::events, cmd::watch,
             cmd::gpus, cmd::drain, cmd::undrain, cmd::why, cmd::usage, cmd::shutdown);

// Each command's name with a check of its request (its decoder, the result dropped): what the
// request fuzzer walks, so a new command is fuzzed once it is in k_commands.
struct RequestDecoder {
  std::string_view name;
  std::function<void(const json&)> check;  // throws RequestError as the decoder does
};
const std::vector<RequestDecoder>& request_decoders();

// A request from the client's side, as {"cmd": name, ...fields}: what the command's decoder reads
// back as `r` (tests/unit/test_protocol.cpp).
template <class Request, class Reply>
json encode(const Cmd<Request, Reply>& c, const Request& r = {}) {
  return detail::encode_fields(fields_of(static_cast<const Request*>(nullptr)), c.name, &r);
}

// The JSON Schema (2020-12) of the protocol: each command's request and reply, the records they
// hold under $defs. `gpuq schema` prints it; docs/protocol.schema.json is a copy a test keeps
// current.
json protocol_schema();

// Wraps a reply body: {"ok": true, ...body}. Errors: {"ok": false, "error": {...}}.
json ok_reply(json body = json::object());
json error_reply(ErrorCode code, const std::string& message);
inline json error_reply(const Error& e) { return error_reply(e.code, e.message); }
// Turns a reply into its body, or the Error it carries (also for replies that are not objects).
Result<json> unwrap_reply(const json& reply);

}  // namespace gpuq::common
