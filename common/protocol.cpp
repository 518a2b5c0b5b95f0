// Request decoding with field-naming errors, and the reply envelope.
#include "common/protocol.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>

#include "common/job_state.hpp"
#include "common/spec.hpp"

namespace gpuq::common {

Result<json> parse_request(std::string_view line) { return parse_untrusted(line, "request"); }

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& want) {
  throw RequestError(ErrorCode::bad_request, "field `" + field + "` must be " + want);
}

template <class T>
T get_or(const json& j, const char* field, T fallback, const char* want) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) bad(field, want);
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) bad(field, want);
    // In range of T, not wrapped: `attempt: 4294967297` is not attempt 1.
    if (!detail::fits_integer<T>(*it)) bad(field, std::string(want) + " (at most " + std::to_string(std::numeric_limits<T>::max()) + ")");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) bad(field, want);
  } else {
    if (!it->is_string()) bad(field, want);
    // Strings reach C APIs (fnmatch, paths), which would cut them at a NUL byte.
    if (it->template get_ref<const std::string&>().find('\0') != std::string::npos)
      bad(field, std::string(want) + " without NUL bytes");
  }
  return it->template get<T>();
}

std::vector<std::int64_t> id_list(const json& j, const char* field) {
  std::vector<std::int64_t> ids;
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return ids;
  if (!it->is_array()) bad(field, "an array of job ids");
  for (const auto& v : *it) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX) || v.get<std::int64_t>() <= 0)
      bad(field, "an array of positive job ids");
    ids.push_back(v.get<std::int64_t>());
  }
  return ids;
}

}  // namespace

HelloRequest decode_hello(const json& j) {
  HelloRequest r;
  r.protocol_version = get_or<int>(j, "protocol_version", 0, "an integer");
  r.protocol_minor = get_or<int>(j, "protocol_minor", 0, "an integer");
  r.client = get_or<std::string>(j, "client", "", "a string");
  return r;
}

SubmitRequest decode_submit(const json& j) {
  SubmitRequest r;
  auto it = j.find("jobs");
  if (it == j.end()) bad("jobs", "a job spec object or an array of them");
  r.jobs = *it;
  r.cwd = get_or<std::string>(j, "cwd", "", "an absolute directory path");
  r.hold = get_or<bool>(j, "hold", false, "true or false");
  const auto limit = get_or<std::int64_t>(j, "max_running", 0, "an integer");
  if (limit < 0 || limit > k_max_running_limit)
    bad("max_running", "an integer from 1 to " + std::to_string(k_max_running_limit) + ", or 0 for no limit");
  r.max_running = static_cast<int>(limit);
  if (auto e = j.find("env"); e != j.end() && !e->is_null()) {
    if (!e->is_object()) bad("env", "an object of strings");
    for (const auto& [k, v] : e->items()) {
      if (!v.is_string()) bad("env." + k, "a string");
      r.env[k] = v.get<std::string>();
    }
  }
  return r;
}

StatusRequest decode_status(const json& j) {
  StatusRequest r;
  r.all = get_or<bool>(j, "all", false, "true or false");
  r.limit = get_or<int>(j, "limit", 20, "an integer");
  if (r.limit < 0 || r.limit > k_max_reply_jobs) bad("limit", "between 0 and " + std::to_string(k_max_reply_jobs));
  r.after = get_or<std::int64_t>(j, "after", 0, "a job id");
  if (r.after < 0) bad("after", "a job id >= 0");
  r.page = get_or<int>(j, "page", 1000, "an integer");
  if (r.page < 1 || r.page > k_max_reply_jobs) bad("page", "between 1 and " + std::to_string(k_max_reply_jobs));
  r.queued = get_or<std::int64_t>(j, "queued", -1, "an integer");
  if (r.queued < -1 || r.queued > k_max_reply_jobs)
    bad("queued", "-1 (as many as a reply holds) or 0 to " + std::to_string(k_max_reply_jobs));
  r.filter.batch = get_or<std::int64_t>(j, "batch", 0, "a batch id");
  if (r.filter.batch < 0) bad("batch", "a batch id");
  if (auto it = j.find("states"); it != j.end()) {
    const char* want = "an array of job states: queued, running, succeeded, failed, cancelled, timed_out";
    if (!it->is_array()) bad("states", want);
    for (const auto& s : *it) {
      const auto state = s.is_string() ? job_state_from_string(s.get<std::string>()) : std::nullopt;
      if (!state) bad("states", want);
      r.filter.states.push_back(*state);
    }
  }
  r.filter.name = get_or<std::string>(j, "name", "", "a string (a shell-style glob)");
  if (r.filter.name.size() > 256) bad("name", "at most 256 characters");
  return r;
}

bool matches(const JobFilter& f, std::int64_t batch, JobState state, const std::string& name) {
  if (f.batch != 0 && batch != f.batch) return false;
  if (!f.states.empty() && std::find(f.states.begin(), f.states.end(), state) == f.states.end()) return false;
  return f.name.empty() || ::fnmatch(f.name.c_str(), name.c_str(), 0) == 0;
}

IdRequest decode_id(const json& j) {
  IdRequest r;
  r.id = get_or<std::int64_t>(j, "id", 0, "a positive job id");
  if (r.id <= 0) bad("id", "a positive job id");
  return r;
}

IdsRequest decode_ids(const json& j) {
  IdsRequest r;
  r.ids = id_list(j, "ids");
  // Each id once, in the order first named: a request repeating one id 1,000 times is not 1,000
  // times the work (or the reply).
  std::set<std::int64_t> seen;
  r.ids.erase(std::remove_if(r.ids.begin(), r.ids.end(), [&](std::int64_t id) { return !seen.insert(id).second; }),
              r.ids.end());
  if (r.ids.empty()) bad("ids", "a non-empty array of job ids");
  r.timeout_s = get_or<double>(j, "timeout_s", 0.0, "a number of seconds");
  if (r.timeout_s < 0) bad("timeout_s", ">= 0");
  return r;
}

ResultsRequest decode_results(const json& j) {
  ResultsRequest r;
  r.ids = id_list(j, "ids");
  std::sort(r.ids.begin(), r.ids.end());
  r.ids.erase(std::unique(r.ids.begin(), r.ids.end()), r.ids.end());
  r.batch = get_or<std::int64_t>(j, "batch", 0, "a batch id");
  if (r.batch < 0) bad("batch", "a batch id");
  r.after = get_or<std::int64_t>(j, "after", 0, "a job id");
  if (r.after < 0) bad("after", "a job id >= 0");
  r.page = get_or<int>(j, "page", k_max_reply_jobs, "an integer");
  if (r.page < 1 || r.page > k_max_reply_jobs) bad("page", "between 1 and " + std::to_string(k_max_reply_jobs));
  return r;
}

namespace {
// The `ids` and `batch` of a command that selects jobs by both.
SelectRequest read_selection(const json& j) {
  SelectRequest r;
  r.ids = id_list(j, "ids");
  r.batch = get_or<std::int64_t>(j, "batch", 0, "a batch id");
  if (r.batch < 0) bad("batch", "a batch id");
  return r;
}
}  // namespace

SelectRequest decode_select(const json& j) {
  SelectRequest r = read_selection(j);
  if (r.ids.empty() && r.batch == 0) bad("ids", "a non-empty array of job ids, or `batch`");
  return r;
}

CleanRequest decode_clean(const json& j) {
  CleanRequest r;
  static_cast<SelectRequest&>(r) = read_selection(j);
  r.ended_before = get_or<double>(j, "ended_before", 0.0, "a unix time");
  if (!(r.ended_before >= 0)) bad("ended_before", "a unix time");
  if (r.ids.empty() && r.batch == 0 && r.ended_before == 0)
    bad("ids", "a non-empty array of job ids, or `batch` or `ended_before`");
  r.checkpoints_only = get_or<bool>(j, "checkpoints_only", false, "true or false");
  r.forget = get_or<bool>(j, "forget", false, "true or false");
  if (r.forget && r.checkpoints_only) bad("forget", "false with `checkpoints_only`: a forgotten job keeps no files");
  return r;
}

UpdateRequest decode_update(const json& j) {
  UpdateRequest r;
  static_cast<SelectRequest&>(r) = decode_select(j);
  auto it = j.find("set");
  if (it == j.end() || !it->is_object() || it->empty())
    bad("set", "an object of the fields to change: priority, retries, timeout_s, max_running");
  // The values are checked by the job-spec parser itself, on a spec that holds only them.
  json probe = {{"command", {"true"}}};
  for (const auto& [k, v] : it->items()) {
    if (k == "max_running") {
      if (r.batch == 0) bad("set.max_running", "a batch's limit: name the batch (`batch`)");
      if (v.is_null()) {
        r.max_running = 0;
      } else if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > k_max_running_limit) {
        bad("set.max_running", "an integer from 1 to " + std::to_string(k_max_running_limit) + ", or null for no limit");
      } else {
        r.max_running = v.get<int>();
      }
      continue;
    }
    if (k != "priority" && k != "retries" && k != "timeout_s")
      bad("set." + k, "left out: only priority, retries, timeout_s and max_running can change after submission");
    if (!v.is_null()) probe[k] = v;
    else if (k != "timeout_s") bad("set." + k, "a number");
  }
  auto parsed = parse_job(probe, "/");
  if (!parsed) throw RequestError(parsed.error());
  if (it->contains("priority")) r.priority = parsed->priority;
  if (it->contains("retries")) r.retries = parsed->retries;
  if (it->contains("timeout_s")) r.timeout_s = parsed->timeout_s;
  return r;
}

NoFields decode_no_fields(const json&) { return {}; }

const std::vector<RequestDecoder>& request_decoders() {
  static const std::vector<RequestDecoder> k_decoders = std::apply(
      [](const auto&... c) {
        return std::vector<RequestDecoder>{{c.name, [decode = c.decode](const json& r) { decode(r); }}...};
      },
      k_commands);
  return k_decoders;
}

DrainRequest decode_drain(const json& j) {
  DrainRequest r;
  auto it = j.find("gpus");
  constexpr const char* want = "a non-empty array of GPU indices or UUIDs (GPU-…, MIG-…)";
  if (it == j.end() || !it->is_array() || it->empty()) bad("gpus", want);
  for (const auto& v : *it) {
    if (v.is_string()) {
      const auto& s = v.get_ref<const std::string&>();
      if (s.size() < 5 || s.size() > 128 || (s.rfind("GPU-", 0) != 0 && s.rfind("MIG-", 0) != 0)) bad("gpus", want);
      r.uuids.push_back(s);
      continue;
    }
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 1 << 20) bad("gpus", want);
    r.gpus.push_back(v.get<int>());
  }
  r.reason = get_or<std::string>(j, "reason", "", "a string");
  if (r.reason.size() > 1000) bad("reason", "at most 1000 characters");
  return r;
}

RestartRequest decode_restart(const json& j) {
  RestartRequest r;
  static_cast<SelectRequest&>(r) = decode_select(j);
  r.fresh = get_or<bool>(j, "fresh", false, "true or false");
  return r;
}

EventsRequest decode_events(const json& j) {
  EventsRequest r;
  r.id = decode_id(j).id;
  r.attempt = get_or<int>(j, "attempt", 0, "an attempt number");
  if (r.attempt < 0) bad("attempt", "an attempt number >= 1, or 0 for the latest");
  r.type = get_or<std::string>(j, "type", "", "\"progress\", \"result\" or \"\"");
  if (r.type != "" && r.type != "progress" && r.type != "result") bad("type", "\"progress\", \"result\" or \"\"");
  r.after = get_or<std::int64_t>(j, "after", 0, "an event seq");
  if (r.after < 0) bad("after", "an event seq >= 0");
  r.page = get_or<int>(j, "page", 10000, "an integer");
  if (r.page < 1 || r.page > 100000) bad("page", "between 1 and 100000");
  return r;
}

// ---- encoders ------------------------------------------------------------------------------

namespace {
json with_selection(json j, const SelectRequest& r) {
  if (!r.ids.empty()) j["ids"] = r.ids;
  if (r.batch != 0) j["batch"] = r.batch;
  return j;
}
}  // namespace

json encode(const HelloRequest& r) {
  return {{"cmd", cmd::hello.name},
          {"protocol_version", r.protocol_version},
          {"protocol_minor", r.protocol_minor},
          {"client", r.client}};
}

json encode(const SubmitRequest& r) {
  json j{{"cmd", cmd::submit.name}, {"jobs", r.jobs}, {"cwd", r.cwd}, {"env", r.env}, {"hold", r.hold}};
  if (r.max_running != 0) j["max_running"] = r.max_running;
  return j;
}

json encode(const StatusRequest& r) {
  json j{{"cmd", cmd::status.name}, {"all", r.all},     {"limit", r.limit},
         {"after", r.after}, {"page", r.page}, {"queued", r.queued}};
  if (r.filter.batch != 0) j["batch"] = r.filter.batch;
  if (!r.filter.states.empty()) j["states"] = r.filter.states;
  if (!r.filter.name.empty()) j["name"] = r.filter.name;
  return j;
}

json encode(const Cmd<IdRequest>& c, const IdRequest& r) { return {{"cmd", c.name}, {"id", r.id}}; }

json encode(const Cmd<IdsRequest>& c, const IdsRequest& r) {
  json j{{"cmd", c.name}, {"ids", r.ids}};
  if (r.timeout_s != 0) j["timeout_s"] = r.timeout_s;
  return j;
}

json encode(const Cmd<SelectRequest>& c, const SelectRequest& r) { return with_selection({{"cmd", c.name}}, r); }

json encode(const RestartRequest& r) { return with_selection({{"cmd", cmd::restart.name}, {"fresh", r.fresh}}, r); }

json encode(const CleanRequest& r) {
  json j = with_selection({{"cmd", cmd::clean.name}, {"checkpoints_only", r.checkpoints_only}, {"forget", r.forget}}, r);
  if (r.ended_before != 0) j["ended_before"] = r.ended_before;
  return j;
}

json encode(const UpdateRequest& r) {
  json set = json::object();
  if (r.priority) set["priority"] = *r.priority;
  if (r.retries) set["retries"] = *r.retries;
  if (r.timeout_s) set["timeout_s"] = *r.timeout_s > 0 ? json(*r.timeout_s) : json(nullptr);
  if (r.max_running) set["max_running"] = *r.max_running > 0 ? json(*r.max_running) : json(nullptr);
  return with_selection({{"cmd", cmd::update.name}, {"set", std::move(set)}}, r);
}

json encode(const Cmd<DrainRequest>& c, const DrainRequest& r) {
  json gpus = json::array();
  for (int g : r.gpus) gpus.push_back(g);
  for (const auto& u : r.uuids) gpus.push_back(u);
  json j{{"cmd", c.name}, {"gpus", std::move(gpus)}};
  if (!r.reason.empty()) j["reason"] = r.reason;
  return j;
}

json encode(const Cmd<NoFields>& c) { return {{"cmd", c.name}}; }

json encode(const ResultsRequest& r) {
  json j{{"cmd", cmd::results.name}, {"after", r.after}, {"page", r.page}};
  if (!r.ids.empty()) j["ids"] = r.ids;
  if (r.batch != 0) j["batch"] = r.batch;
  return j;
}

json encode(const EventsRequest& r) {
  json j{{"cmd", cmd::events.name}, {"id", r.id}, {"attempt", r.attempt}, {"after", r.after}, {"page", r.page}};
  if (!r.type.empty()) j["type"] = r.type;
  return j;
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
