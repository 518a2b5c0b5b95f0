// Each request's field table (field_table.hpp: decoding with field-naming errors, encoding,
// schema), the protocol's schema, and the reply envelope.
#include "common/protocol.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <type_traits>

#include "common/field_table.hpp"
#include "common/job_state.hpp"
#include "common/schema.hpp"
#include "common/spec.hpp"

namespace gpuq::common {

Result<json> parse_request(std::string_view line) { return parse_untrusted(line, "request"); }

using namespace fields;  // field_table.hpp

namespace {
const Bounds k_id{1, k_inf};          // a job id
const Bounds k_at_least_0{0, k_inf};  // a batch id, an `after`, seconds
const std::string k_bool = "true or false";
constexpr std::size_t k_max_path = 4095;  // the longest path getcwd() returns (PATH_MAX, less its NUL)

// The `ids` and `batch` every request that selects jobs by both has.
template <class R>
TableOf<R> selection() {
  TableOf<R> t;
  t.field(
       "ids", [](R & r) -> auto& { return r.ids; }, "an array of positive job ids", k_id)
      .field(
          "batch", [](R & r) -> auto& { return r.batch; }, "a batch id", k_at_least_0);
  return t;
}
void ids_or_batch(SelectRequest& r) {
  if (r.ids.empty() && r.batch == 0) bad("ids", "a non-empty array of job ids, or `batch`");
}
// The schema of a rule that wants one of `fields` given: ids non-empty, a number above 0.
json one_of_given(std::initializer_list<const char*> fields) {
  json any = json::array();
  for (const char* f : fields) {
    const json given = std::string(f) == "ids" ? json{{"minItems", 1}} : json{{"exclusiveMinimum", 0}};
    any.push_back({{"required", {f}}, {"properties", {{f, given}}}});
  }
  return {{"anyOf", std::move(any)}};
}

}  // namespace

const FieldTable& fields_of(const HelloRequest*) {
  using R = HelloRequest;
  static const FieldTable t = TableOf<R>()
                                  .field("protocol_version", [](R & r) -> auto& { return r.protocol_version; },
                                         "an integer", {-k_inf, k_inf, true})
                                  .field(
                                      "protocol_minor", [](R & r) -> auto& { return r.protocol_minor; }, "an integer")
                                  .field(
                                      "client", [](R & r) -> auto& { return r.client; }, "a string")
                                  .done();
  return t;
}

const FieldTable& fields_of(const SubmitRequest*) {
  using R = SubmitRequest;
  static const FieldTable t =
      TableOf<R>()
          .custom(
              "jobs", "a job spec object or an array of them", true, {{"type", {"object", "array"}}},
              [](const json& v, R& r) {
                if (!v.is_object() && !v.is_array()) bad_spec("jobs", "a job spec object or an array of them");
                r.jobs = v;
              },
              [](const R& r, json& out) { out["jobs"] = r.jobs; })
          .custom(
              "cwd", "the submitter's absolute working directory", true,
              // A path's limit is in bytes (PATH_MAX), which JSON Schema cannot say: the pattern
              // says no NUL byte (a C API would cut the path there), the comment says the rest.
              {{"type", "string"}, {"pattern", "^/[^\\u0000]*$"}, {"$comment", "at most 4095 bytes of UTF-8"}},
              [](const json& v, R& r) {
                if (!v.is_string()) bad("cwd", "the submitter's absolute working directory");
                const auto& path = v.get_ref<const std::string&>();
                if (path.rfind('/', 0) != 0 || path.size() > k_max_path || path.find('\0') != std::string::npos)
                  bad("cwd", "the submitter's absolute working directory");
                r.cwd = path;
              },
              [](const R& r, json& out) { out["cwd"] = r.cwd; })
          .field(
              "env", [](R & r) -> auto& { return r.env; }, "an object of strings")
          .field(
              "hold", [](R & r) -> auto& { return r.hold; }, k_bool)
          .field("max_running", [](R & r) -> auto& { return r.max_running; },
                 "an integer from 1 to " + std::to_string(k_max_running_limit) + ", or 0 for no limit",
                 {0, k_max_running_limit})
          .done();
  return t;
}

const FieldTable& fields_of(const StatusRequest*) {
  using R = StatusRequest;
  const std::string most = std::to_string(k_max_reply_jobs);
  static const FieldTable t =
      TableOf<R>()
          .field(
              "all", [](R & r) -> auto& { return r.all; }, k_bool)
          .field("limit", [](R & r) -> auto& { return r.limit; }, "an integer from 0 to " + most, {0, k_max_reply_jobs})
          .field(
              "after", [](R & r) -> auto& { return r.after; }, "a job id >= 0", k_at_least_0)
          .field("page", [](R & r) -> auto& { return r.page; }, "an integer from 1 to " + most, {1, k_max_reply_jobs})
          .field("queued", [](R & r) -> auto& { return r.queued; }, "-1 (as many as a reply holds) or 0 to " + most,
                 {-1, k_max_reply_jobs})
          .field(
              "batch", [](R & r) -> auto& { return r.filter.batch; }, "a batch id", k_at_least_0)
          .field(
              "states", [](R & r) -> auto& { return r.filter.states; },
              "an array of job states: queued, running, succeeded, failed, cancelled, timed_out, out_of_memory")
          .field("name", [](R & r) -> auto& { return r.filter.name; }, "a shell-style glob of at most 256 characters",
                 {-k_inf, 256})
          .done();
  return t;
}

const FieldTable& fields_of(const IdRequest*) {
  using R = IdRequest;
  static const FieldTable t =
      TableOf<R>().field("id", [](R & r) -> auto& { return r.id; }, "a positive job id", {1, k_inf, true}).done();
  return t;
}

const FieldTable& fields_of(const IdsRequest*) {
  using R = IdsRequest;
  static const FieldTable t =
      TableOf<R>()
          .field(
              "ids", [](R & r) -> auto& { return r.ids; }, "an array of positive job ids", k_id)
          .field("timeout_s", [](R & r) -> auto& { return r.timeout_s; },
                 "a number of seconds from 0 to 1e9 (wait only)", {0, k_max_timeout_s})
          .check(
              [](R& r) {
                // Each id once, in the order first named: a request repeating one id 1,000 times is not
                // 1,000 times the work (or the reply).
                std::set<std::int64_t> seen;
                r.ids.erase(std::remove_if(r.ids.begin(), r.ids.end(),
                                           [&](std::int64_t id) { return !seen.insert(id).second; }),
                            r.ids.end());
                if (r.ids.empty()) bad("ids", "a non-empty array of job ids");
              },
              one_of_given({"ids"}))
          .done();
  return t;
}

const FieldTable& fields_of(const SelectRequest*) {
  static const FieldTable t = selection<SelectRequest>().check(ids_or_batch, one_of_given({"ids", "batch"})).done();
  return t;
}

const FieldTable& fields_of(const RestartRequest*) {
  using R = RestartRequest;
  static const FieldTable t = selection<R>()
                                  .field(
                                      "fresh", [](R & r) -> auto& { return r.fresh; }, k_bool)
                                  .check([](R& r) { ids_or_batch(r); }, one_of_given({"ids", "batch"}))
                                  .done();
  return t;
}

namespace {
// An update's `set`: each value checked as the job spec checks it (its limits, spec.hpp), named
// `set.<field>`; max_running is the batch's.
const std::string k_set_priority =
    "an integer from -" + std::to_string(k_max_priority) + " to " + std::to_string(k_max_priority);
const std::string k_set_retries = "an integer from 0 to " + std::to_string(k_max_retries);
const std::string k_set_timeout = "a number of seconds > 0 and at most 1e9, or null for no timeout";
const std::string k_set_max_running =
    "an integer from 1 to " + std::to_string(k_max_running_limit) + ", or null for no limit";
void read_set(const json& v, UpdateRequest& r) {
  if (!v.is_object() || v.empty())
    bad("set", "an object of the fields to change: priority, retries, timeout_s, max_running");
  for (const auto& [k, x] : v.items()) {
    if (k == "max_running") {
      if (r.batch == 0) bad("set.max_running", "a batch's limit: name the batch (`batch`)");
      const auto n = integer_of<int>(x);
      if (!x.is_null() && (!n || *n < 1 || *n > k_max_running_limit)) bad("set.max_running", k_set_max_running);
      r.max_running = x.is_null() ? 0 : *n;
    } else if (k == "priority") {
      const auto n = integer_of<int>(x);
      if (!n || *n < -k_max_priority || *n > k_max_priority) bad_spec("set.priority", k_set_priority);
      r.priority = *n;
    } else if (k == "retries") {
      const auto n = integer_of<int>(x);
      if (!n || *n < 0 || *n > k_max_retries) bad_spec("set.retries", k_set_retries);
      r.retries = *n;
    } else if (k == "timeout_s") {
      if (!x.is_null() && !(x.is_number() && x.get<double>() > 0 && x.get<double>() <= k_max_timeout_s))
        bad_spec("set.timeout_s", k_set_timeout);
      r.timeout_s = x.is_null() ? 0.0 : x.get<double>();
    } else {
      bad("set." + k, "left out: only priority, retries, timeout_s and max_running can change after submission");
    }
  }
}
void write_set(const UpdateRequest& r, json& out) {
  json set = json::object();
  if (r.priority) set["priority"] = *r.priority;
  if (r.retries) set["retries"] = *r.retries;
  if (r.timeout_s) set["timeout_s"] = *r.timeout_s > 0 ? json(*r.timeout_s) : json(nullptr);
  if (r.max_running) set["max_running"] = *r.max_running > 0 ? json(*r.max_running) : json(nullptr);
  out["set"] = std::move(set);
}
}  // namespace

const FieldTable& fields_of(const UpdateRequest*) {
  using R = UpdateRequest;
  static const FieldTable t =
      selection<R>()
          .custom(
              "set", "an object of the fields to change: priority, retries, timeout_s, max_running", true,
              {{"type", "object"},
               {"minProperties", 1},
               {"additionalProperties", false},
               {"properties",
                {{"priority",
                  {{"type", "integer"},
                   {"minimum", -k_max_priority},
                   {"maximum", k_max_priority},
                   {"description", k_set_priority}}},
                 {"retries",
                  {{"type", "integer"}, {"minimum", 0}, {"maximum", k_max_retries}, {"description", k_set_retries}}},
                 {"timeout_s",
                  {{"anyOf",
                    {{{"type", "number"}, {"exclusiveMinimum", 0}, {"maximum", k_max_timeout_s}}, {{"type", "null"}}}},
                   {"description", k_set_timeout}}},
                 {"max_running",
                  {{"type", {"integer", "null"}},
                   {"minimum", 1},
                   {"maximum", k_max_running_limit},
                   {"description", "the batch's limit (needs `batch`); null: none"}}}}}},
              read_set, write_set)
          .check([](R& r) { ids_or_batch(r); },
                 {{"allOf",
                   {one_of_given({"ids", "batch"}),
                    {{"if", {{"properties", {{"set", {{"required", {"max_running"}}}}}}}},
                     {"then", {{"required", {"batch"}}, {"properties", {{"batch", {{"exclusiveMinimum", 0}}}}}}}}}}})
          .done();
  return t;
}

const FieldTable& fields_of(const CleanRequest*) {
  using R = CleanRequest;
  static const FieldTable t =
      selection<R>()
          .field(
              "ended_before", [](R & r) -> auto& { return r.ended_before; }, "a unix time", k_at_least_0)
          .field(
              "checkpoints_only", [](R & r) -> auto& { return r.checkpoints_only; }, k_bool)
          .field(
              "forget", [](R & r) -> auto& { return r.forget; }, k_bool)
          .check(
              [](R& r) {
                if (r.ids.empty() && r.batch == 0 && r.ended_before == 0)
                  bad("ids", "a non-empty array of job ids, or `batch` or `ended_before`");
                if (r.forget && r.checkpoints_only)
                  bad("forget", "false with `checkpoints_only`: a forgotten job keeps no files");
              },
              {{"allOf",
                {one_of_given({"ids", "batch", "ended_before"}),
                 {{"not",
                   {{"required", {"forget", "checkpoints_only"}},
                    {"properties", {{"forget", {{"const", true}}}, {"checkpoints_only", {{"const", true}}}}}}}}}}})
          .done();
  return t;
}

const FieldTable& fields_of(const ResultsRequest*) {
  using R = ResultsRequest;
  static const FieldTable t =
      TableOf<R>()
          .field(
              "ids", [](R & r) -> auto& { return r.ids; }, "an array of positive job ids", k_id)
          .field(
              "batch", [](R & r) -> auto& { return r.batch; }, "a batch id", k_at_least_0)
          .field(
              "after", [](R & r) -> auto& { return r.after; }, "a job id >= 0", k_at_least_0)
          .field("page", [](R & r) -> auto& { return r.page; },
                 "an integer from 1 to " + std::to_string(k_max_reply_jobs), {1, k_max_reply_jobs})
          .check([](R& r) {  // each once, ascending
            std::sort(r.ids.begin(), r.ids.end());
            r.ids.erase(std::unique(r.ids.begin(), r.ids.end()), r.ids.end());
          })
          .done();
  return t;
}

const FieldTable& fields_of(const EventsRequest*) {
  using R = EventsRequest;
  static const FieldTable t =
      TableOf<R>()
          .field("id", [](R & r) -> auto& { return r.id; }, "a positive job id", {1, k_inf, true})
          .field(
              "attempt", [](R & r) -> auto& { return r.attempt; }, "an attempt number >= 1, or 0 for the latest",
              k_at_least_0)
          .field("type", [](R & r) -> auto& { return r.type; }, "\"progress\", \"result\", \"checkpoint\" or \"\"",
                 {-k_inf, k_inf, false, {"", "progress", "result", "checkpoint"}})
          .field(
              "after", [](R & r) -> auto& { return r.after; }, "an event seq >= 0", k_at_least_0)
          .field("page", [](R & r) -> auto& { return r.page; }, "an integer from 1 to 100000", {1, 100000})
          .done();
  return t;
}

const FieldTable& fields_of(const WatchRequest*) {
  using R = WatchRequest;
  const std::string most = std::to_string(k_max_reply_jobs);
  static const FieldTable t =
      TableOf<R>()
          .field(
              "epoch", [](R & r) -> auto& { return r.epoch; }, "the epoch of an earlier reply, or 0", k_at_least_0)
          .field(
              "after", [](R & r) -> auto& { return r.after; }, "the cursor of an earlier reply, or 0", k_at_least_0)
          .field(
              "ids", [](R & r) -> auto& { return r.ids; }, "an array of at most " + most + " positive job ids", k_id)
          .field(
              "batch", [](R & r) -> auto& { return r.batch; }, "a batch id", k_at_least_0)
          .field("timeout_s", [](R & r) -> auto& { return r.timeout_s; }, "a number of seconds from 0 to 300", {0, 300})
          .field("page", [](R & r) -> auto& { return r.page; }, "an integer from 1 to " + most, {1, k_max_reply_jobs})
          .check([](R& r) {
            std::sort(r.ids.begin(), r.ids.end());
            r.ids.erase(std::unique(r.ids.begin(), r.ids.end()), r.ids.end());
            if (r.ids.size() > static_cast<std::size_t>(k_max_reply_jobs))
              bad("ids", "an array of at most " + std::to_string(k_max_reply_jobs) + " job ids");
          })
          .done();
  return t;
}

namespace {
constexpr const char* k_gpus_wanted = "a non-empty array of GPU indices or UUIDs (GPU-…, MIG-…)";
void read_gpus(const json& v, DrainRequest& r) {
  if (!v.is_array() || v.empty()) bad("gpus", k_gpus_wanted);
  for (const auto& x : v) {
    if (x.is_string()) {
      const auto& s = x.get_ref<const std::string&>();
      if (s.size() < 5 || characters(s) > 128 || (s.rfind("GPU-", 0) != 0 && s.rfind("MIG-", 0) != 0))
        bad("gpus", k_gpus_wanted);
      r.uuids.push_back(s);
      continue;
    }
    const auto index = integer_of<int>(x);
    if (!index || *index < 0 || *index > 1 << 20) bad("gpus", k_gpus_wanted);
    r.gpus.push_back(*index);
  }
}
void write_gpus(const DrainRequest& r, json& out) {
  json gpus = json::array();
  for (int g : r.gpus)
    gpus.push_back(g);
  for (const auto& u : r.uuids)
    gpus.push_back(u);
  out["gpus"] = std::move(gpus);
}
}  // namespace

const FieldTable& fields_of(const DrainRequest*) {
  using R = DrainRequest;
  static const FieldTable t =
      TableOf<R>()
          .custom("gpus", k_gpus_wanted, true,
                  {{"type", "array"},
                   {"minItems", 1},
                   {"items",
                    {{"anyOf",
                      {{{"type", "integer"}, {"minimum", 0}, {"maximum", 1 << 20}},
                       {{"type", "string"}, {"pattern", "^(GPU|MIG)-"}, {"minLength", 5}, {"maxLength", 128}}}}}}},
                  read_gpus, write_gpus)
          .field("reason", [](R & r) -> auto& { return r.reason; }, "a string of at most 1000 characters",
                 {-k_inf, 1000})
          .done();
  return t;
}

const FieldTable& fields_of(const NoFields*) {
  static const FieldTable t = TableOf<NoFields>().done();
  return t;
}

namespace detail {

void decode_fields(const FieldTable& t, const json& j, void* request) {
  for (const auto& row : t.rows) {
    const auto it = j.find(row.name);
    if (it == j.end() || it->is_null()) {
      if (row.required) bad(row.name, row.want);
      continue;
    }
    row.read(*it, request);
  }
  if (t.check) t.check(request);
}

json encode_fields(const FieldTable& t, std::string_view cmd, const void* request) {
  json out{{"cmd", cmd}};
  for (const auto& row : t.rows)
    row.write(request, out);
  return out;
}

}  // namespace detail

const std::vector<RequestDecoder>& request_decoders() {
  static const std::vector<RequestDecoder> k_decoders = std::apply(
      [](const auto&... c) {
        return std::vector<RequestDecoder>{{c.name, [&c](const json& r) { (void)c.decode(r); }}...};
      },
      k_commands);
  return k_decoders;
}

void to_json(json& j, const UpdateReply& r) {
  j = {{"jobs", r.jobs}};
  if (r.batch_limit) j["batch_limit"] = *r.batch_limit;
}

void from_json(const json& j, UpdateReply& r) {
  detail::require_object(j);
  detail::field_from_json(j, "jobs", r.jobs, {});
  r.batch_limit.reset();
  if (const auto it = j.find("batch_limit"); it != j.end() && !it->is_null()) {
    BatchLimitChange limit;
    detail::field_from_json(j, "batch_limit", limit, {});
    r.batch_limit = limit;
  }
}

json protocol_schema() {
  json defs = json::object();
  json commands = json::object();
  std::apply(
      [&](const auto&... c) {
        (
            [&](const auto& command) {
              using C = std::remove_cvref_t<decltype(command)>;
              const FieldTable& t = fields_of(static_cast<const typename C::request*>(nullptr));
              json properties{{"cmd", {{"const", command.name}}}};
              json required = json::array({"cmd"});
              for (const auto& row : t.rows) {
                properties[row.name] = row.schema;
                if (row.required) required.push_back(row.name);
              }
              json request{
                  {"type", "object"}, {"properties", std::move(properties)}, {"required", std::move(required)}};
              if (!t.rules.is_null()) request["allOf"] = json::array({t.rules});
              commands[std::string(command.name)] = {{"request", std::move(request)},
                                                     {"reply", schema::of<typename C::reply>(defs)}};
            }(c),
            ...);
      },
      k_commands);
  return {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
          {"title", "gpuqd protocol " + std::to_string(k_protocol_version) + "." + std::to_string(k_protocol_minor)},
          {"description",
           "One JSON object per line over a unix socket (docs/protocol.md). Each command's request and the body of "
           "its reply ({\"ok\": true, ...}); a failure is {\"ok\": false, \"error\": {\"code\", \"message\"}}. Each "
           "side ignores fields it does not know; a missing field takes its default."},
          {"protocol_version", k_protocol_version},
          {"protocol_minor", k_protocol_minor},
          {"commands", std::move(commands)},
          {"$defs", std::move(defs)}};
}

bool matches(const JobFilter& f, std::int64_t batch, JobState state, const std::string& name) {
  if (f.batch != 0 && batch != f.batch) return false;
  if (!f.states.empty() && std::find(f.states.begin(), f.states.end(), state) == f.states.end()) return false;
  return f.name.empty() || ::fnmatch(f.name.c_str(), name.c_str(), 0) == 0;
}

json ok_reply(json body) {
  if (!body.is_object()) body = json::object();
  body["ok"] = true;
  return body;
}

json error_reply(ErrorCode code, const std::string& message) {
  return {{"ok", false}, {"error", {{"code", to_string(code)}, {"message", message}}}};
}

Result<json> unwrap_reply(const json& reply) {
  if (!reply.is_object() || !reply.contains("ok") || !reply["ok"].is_boolean())
    return Error{ErrorCode::internal, "malformed reply from gpuqd: " + reply.dump().substr(0, 200)};
  if (reply["ok"].get<bool>()) return reply;
  const json& e = reply.value("error", json::object());
  return Error{error_code_from_string(e.value("code", "internal")), e.value("message", "unknown error")};
}

}  // namespace gpuq::common
