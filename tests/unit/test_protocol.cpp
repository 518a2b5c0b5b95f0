// Protocol messages: round trips of every reply record, request decoding errors, the envelope.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string_view>
#include <tuple>

#include "common/protocol.hpp"
#include "common/spec.hpp"

using namespace gpuq::common;
using gpuq::JobState;

namespace {
// Each request type's decoder, as gpuqd reaches it: through a command of the table.
const auto decode_hello = [](const json& j) { return cmd::hello.decode(j); };
const auto decode_submit = [](const json& j) { return cmd::submit.decode(j); };
const auto decode_status = [](const json& j) { return cmd::status.decode(j); };
const auto decode_id = [](const json& j) { return cmd::show.decode(j); };
const auto decode_ids = [](const json& j) { return cmd::cancel.decode(j); };
const auto decode_select = [](const json& j) { return cmd::hold.decode(j); };
const auto decode_restart = [](const json& j) { return cmd::restart.decode(j); };
const auto decode_update = [](const json& j) { return cmd::update.decode(j); };
const auto decode_clean = [](const json& j) { return cmd::clean.decode(j); };
const auto decode_results = [](const json& j) { return cmd::results.decode(j); };
const auto decode_events = [](const json& j) { return cmd::events.decode(j); };
const auto decode_drain = [](const json& j) { return cmd::drain.decode(j); };
}  // namespace

TEST_SUITE_BEGIN("protocol");

TEST_CASE("a JobInfo survives a JSON round trip, nulls included") {
  JobInfo j;
  j.id = 7;
  j.batch = 2;
  j.name = "mnist";
  j.state = JobState::failed;
  j.attempt = 2;
  j.retries = 3;
  j.gpus = {1, 3};
  j.exit_code = 137;
  j.progress = {{"step", 10}, {"loss", 0.5}};
  j.labels = {{"team", "vision"}};
  JobInfo back = json(j).get<JobInfo>();
  CHECK(json(back) == json(j));
  CHECK(json(j)["exit_signal"].is_null());
}

TEST_CASE("replies decode with defaults for fields an older daemon did not send") {
  auto r = json{{"jobs", json::array({{{"id", 1}, {"state", "queued"}}})}}.get<JobsReply>();
  REQUIRE(r.jobs.size() == 1);
  CHECK(r.jobs[0].ranks == 1);
  CHECK(r.jobs[0].gpus.empty());
  CHECK_FALSE(r.timed_out);
}

TEST_CASE("show, gpus, cancel and submit replies round-trip") {
  ShowReply s;
  s.job.id = 3;
  s.history = {{1, JobState::running, 12.5, ""}, {1, JobState::failed, 13.0, "rank 1 exited with code 2"}};
  s.logs = {{1, 0, "/x/rank-0.log"}};
  s.first_failure = {{"rank", 1}, {"exit_code", 2}};
  s.spec_error = "invalid job spec: unknown field `gang_timeout_s`";
  CHECK(json(json(s).get<ShowReply>()) == json(s));
  GpusReply g{"fake:2:100",
              {{0, "GPU-a", "Fake", 100, nullptr, nullptr, 50, false, {4, 5}, 1, true, "ECC", nullptr, 0}},
              8,
              3,
              "0-7",
              5,
              2,
              7,
              4096,
              1,
              9,
              5,
              3 << 20,
              2,
              7,
              "a cgroup per attempt"};
  CHECK(json(json(g).get<GpusReply>()) == json(g));
  CancelReply c{{{1, JobState::cancelled, true}}};
  CHECK(json(json(c).get<CancelReply>()) == json(c));
  SubmitReply sub{4, {10, 11}};
  CHECK(json(json(sub).get<SubmitReply>()) == json(sub));
  RestartReply r{{{3, "failed", 0}, {4, "failed", 3}}, 2, {{"failed", 2}}, 1, false};
  CHECK(json(json(r).get<RestartReply>()) == json(r));
}

TEST_CASE("request decoders name the offending field") {
  auto message = [](auto fn, const json& j) {
    try {
      fn(j);
    } catch (const gpuq::RequestError& e) {
      CHECK(e.code() == gpuq::ErrorCode::bad_request);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message(decode_id, {{"id", "7"}}) == "field `id` must be a positive job id");
  CHECK(message(decode_id, json::object()) == "field `id` must be a positive job id");
  CHECK(message(decode_ids, {{"ids", {1, -2}}}) == "field `ids` must be an array of positive job ids");
  CHECK(message(decode_ids, {{"ids", json::array()}}) == "field `ids` must be a non-empty array of job ids");
  CHECK(message(decode_status, {{"all", 1}}) == "field `all` must be true or false");
  // A held watch keeps its ids: at most a reply's worth, each once, sorted.
  json many = json::array();
  for (int id = 1; id <= k_max_reply_jobs + 1; ++id)
    many.push_back(id);
  CHECK(message([](const json& j) { return cmd::watch.decode(j); }, {{"ids", many}}) ==
        "field `ids` must be an array of at most 2000 job ids");
  many.erase(many.begin());
  many.push_back(2);
  CHECK(cmd::watch.decode({{"ids", many}}).ids.size() == static_cast<std::size_t>(k_max_reply_jobs));
  const std::string states_wanted =
      "field `states` must be an array of job states: queued, running, succeeded, failed, cancelled, timed_out, "
      "out_of_memory";
  CHECK(message(decode_status, {{"states", "failed"}}) == states_wanted);
  CHECK(message(decode_status, {{"states", {"failed", "lost"}}}) == states_wanted);
  CHECK(message(decode_status, {{"name", std::string(257, '*')}}) ==
        "field `name` must be a shell-style glob of at most 256 characters");
  const auto f = decode_status({{"batch", 3}, {"states", {"failed", "timed_out"}}, {"name", "lr-[0-9]*"}}).filter;
  CHECK(matches(f, 3, JobState::failed, "lr-0.1"));
  CHECK_FALSE(matches(f, 4, JobState::failed, "lr-0.1"));      // another batch
  CHECK_FALSE(matches(f, 3, JobState::succeeded, "lr-0.1"));   // another state
  CHECK_FALSE(matches(f, 3, JobState::timed_out, "lr-x"));     // another name
  CHECK(matches({}, 9, JobState::queued, "anything"));         // no filter keeps every job
  CHECK(decode_status(json::object()).filter.empty());
  CHECK(message(decode_restart, json::object()) == "field `ids` must be a non-empty array of job ids, or `batch`");
  CHECK(message(decode_restart, {{"batch", -1}}) == "field `batch` must be a batch id");
  CHECK(message(decode_restart, {{"ids", {3}}, {"fresh", "yes"}}) == "field `fresh` must be true or false");
  CHECK(decode_restart({{"batch", 2}, {"fresh", true}}).fresh);
  CHECK(decode_restart({{"ids", {3, 4}}}).ids == std::vector<std::int64_t>{3, 4});
  CHECK(message(decode_select, {{"batch", "2"}}) == "field `batch` must be a batch id");
  CHECK(message(decode_clean, json::object()) == "field `ids` must be a non-empty array of job ids, or `batch` or `ended_before`");
  CHECK(message(decode_clean, {{"ended_before", -1.0}}) == "field `ended_before` must be a unix time");
  CHECK(decode_clean({{"ended_before", 5.0}, {"checkpoints_only", true}}).checkpoints_only);
  CHECK(decode_clean({{"batch", 2}, {"forget", true}}).forget);
  CHECK(message(decode_clean, {{"ids", {1}}, {"forget", 1}}) == "field `forget` must be true or false");
  CHECK(message(decode_clean, {{"ids", {1}}, {"forget", true}, {"checkpoints_only", true}}) ==
        "field `forget` must be false with `checkpoints_only`: a forgotten job keeps no files");
  const std::string gpus_wanted = "field `gpus` must be a non-empty array of GPU indices or UUIDs (GPU-…, MIG-…)";
  CHECK(message(decode_drain, json::object()) == gpus_wanted);
  CHECK(message(decode_drain, {{"gpus", {0, -1}}}) == gpus_wanted);
  CHECK(message(decode_drain, {{"gpus", {"GPU-"}}}) == gpus_wanted);
  CHECK(message(decode_drain, {{"gpus", {"1a2b"}}}) == gpus_wanted);
  CHECK(decode_drain({{"gpus", {1, "GPU-1a2b"}}}).uuids == std::vector<std::string>{"GPU-1a2b"});
  CHECK(message(decode_drain, {{"gpus", {0}}, {"reason", 5}}) ==
        "field `reason` must be a string of at most 1000 characters");
  CHECK(decode_drain({{"gpus", {2, 3}}, {"reason", "ECC"}}).gpus == std::vector<int>{2, 3});
  CHECK(message(decode_update, {{"ids", {1}}}) ==
        "field `set` must be an object of the fields to change: priority, retries, timeout_s, max_running");
  CHECK(message(decode_update, {{"ids", {1}}, {"set", {{"gpus", 2}}}}) ==
        "field `set.gpus` must be left out: only priority, retries, timeout_s and max_running can change after "
        "submission");
  CHECK(message(decode_update, {{"ids", {1}}, {"set", {{"max_running", 2}}}}) ==
        "field `set.max_running` must be a batch's limit: name the batch (`batch`)");
  CHECK(message(decode_update, {{"batch", 1}, {"set", {{"max_running", 0}}}}) ==
        "field `set.max_running` must be an integer from 1 to 1000000, or null for no limit");
  CHECK(message(decode_update, {{"batch", 1}, {"set", {{"max_running", 1.5}}}}) ==
        "field `set.max_running` must be an integer from 1 to 1000000, or null for no limit");
  CHECK(decode_update({{"batch", 1}, {"set", {{"max_running", 3}}}}).max_running == 3);
  CHECK(decode_update({{"batch", 1}, {"set", {{"max_running", nullptr}}}}).max_running == 0);
  CHECK_FALSE(decode_update({{"batch", 1}, {"set", {{"retries", 2}}}}).max_running);
  auto update = decode_update({{"batch", 2}, {"set", {{"priority", 7}, {"timeout_s", nullptr}}}});
  CHECK(update.priority == 7);
  CHECK_FALSE(update.retries);
  CHECK(update.timeout_s == 0.0);
  CHECK(message(decode_submit, {{"cwd", "/"}}) == "field `jobs` must be a job spec object or an array of them");
  CHECK(message(decode_submit, {{"jobs", json::array()}, {"cwd", "/"}, {"env", {{"A", 1}}}}) ==
        "field `env.A` must be a string");
  CHECK(message(decode_submit, {{"jobs", json::array()}, {"cwd", "/"}, {"max_running", -1}}) ==
        "field `max_running` must be an integer from 1 to 1000000, or 0 for no limit");
  CHECK(message(decode_submit, {{"jobs", json::array()}, {"cwd", "/"}, {"max_running", 1LL << 40}}) ==
        "field `max_running` must be an integer from 1 to 1000000, or 0 for no limit");
  CHECK(decode_submit({{"jobs", json::array()}, {"cwd", "/"}, {"max_running", 2}}).max_running == 2);
  for (const json& cwd : {json(""), json("rel/dir"), json(1), json("/" + std::string(4095, 'a'))})
    CHECK(message(decode_submit, {{"jobs", json::array()}, {"cwd", cwd}}) ==
          "field `cwd` must be the submitter's absolute working directory");
  CHECK(message(decode_submit, {{"jobs", json::array()}}) ==
        "field `cwd` must be the submitter's absolute working directory");
  CHECK(decode_submit({{"jobs", json::array()}, {"cwd", std::string(4095, '/')}}).cwd.size() == 4095);
}

TEST_CASE("an update's values are refused exactly where a job spec's are, each naming set.<field>") {
  const auto refusal_of_set = [](const json& set) {
    try {
      (void)cmd::update.decode({{"ids", {1}}, {"set", set}});
    } catch (const gpuq::RequestError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal_of_set({{"priority", nullptr}}) == "field `set.priority` must be an integer from -1000000 to 1000000");
  CHECK(refusal_of_set({{"retries", 101}}) == "field `set.retries` must be an integer from 0 to 100");
  CHECK(refusal_of_set({{"timeout_s", 0}}) ==
        "field `set.timeout_s` must be a number of seconds > 0 and at most 1e9, or null for no timeout");
  CHECK(refusal_of_set({{"priority", -1000000}, {"retries", 100.0}, {"timeout_s", 1e9}}).empty());
  // The batch's limit, at its edges (with the batch named).
  for (const json& n : {json(1), json(1000000), json(2.0), json(nullptr)})
    CHECK_NOTHROW((void)cmd::update.decode({{"batch", 3}, {"set", {{"max_running", n}}}}));
  for (const json& n : {json(0), json(1000001), json(1.5), json("2")})
    CHECK_THROWS_WITH_AS((void)cmd::update.decode({{"batch", 3}, {"set", {{"max_running", n}}}}),
                         "field `set.max_running` must be an integer from 1 to 1000000, or null for no limit",
                         gpuq::RequestError);
  // drain's GPUs: an index written 1.0 is index 1; a UUID's 128 characters are characters, not bytes.
  CHECK(cmd::drain.decode({{"gpus", {1.0}}}).gpus == std::vector<int>{1});
  std::string uuid = "GPU-";
  for (int i = 0; i < 124; ++i)
    uuid += "\u00e9";
  CHECK(cmd::drain.decode({{"gpus", {uuid}}}).uuids.size() == 1);
  CHECK_THROWS_AS((void)cmd::drain.decode({{"gpus", {uuid + "a"}}}), gpuq::RequestError);
  // Whole numbers written with a fraction (1.0) are left out: a request takes them, as JSON
  // Schema counts them integers; a spec file is stricter.
  const std::vector<json> values{-1000001, -1000000, -1,  0,     1,      1.5,  100,           101,
                                 1000000,  1000001,  1e9, 1.5e9, "high", true, json::array(), json::object()};
  for (const std::string field : {"priority", "retries", "timeout_s"})
    for (const json& v : values) {
      CAPTURE(field);
      CAPTURE(v.dump());
      const bool spec_takes = static_cast<bool>(parse_job({{"command", {"true"}}, {field, v}}, "/"));
      std::string refusal;
      try {
        (void)cmd::update.decode({{"ids", {1}}, {"set", {{field, v}}}});
      } catch (const gpuq::RequestError& e) {
        CHECK(e.code() == gpuq::ErrorCode::invalid_spec);  // as a spec's own
        refusal = e.what();
      }
      CHECK(spec_takes == refusal.empty());
      if (!refusal.empty()) CHECK(refusal.rfind("field `set." + field + "` must be ", 0) == 0);
    }
}

TEST_CASE("the reply envelope carries ok, or an error code and message") {
  auto ok = ok_reply({{"batch", 1}});
  CHECK(ok["ok"] == true);
  CHECK(unwrap_reply(ok).ok());
  auto err = error_reply(gpuq::ErrorCode::not_found, "no job 9");
  CHECK(err["error"]["code"] == "not_found");
  auto unwrapped = unwrap_reply(err);
  REQUIRE_FALSE(unwrapped.ok());
  CHECK(unwrapped.error().code == gpuq::ErrorCode::not_found);
  CHECK(unwrapped.error().message == "no job 9");
  CHECK_FALSE(unwrap_reply(json::array()).ok());
}

TEST_CASE("every error code has a stable wire name") {
  using gpuq::ErrorCode;
  for (auto c : {ErrorCode::bad_request, ErrorCode::invalid_spec, ErrorCode::not_found, ErrorCode::wrong_state,
                 ErrorCode::unknown_command,
                 ErrorCode::version_mismatch, ErrorCode::too_large, ErrorCode::forbidden, ErrorCode::unavailable,
                 ErrorCode::store_error, ErrorCode::internal})
    CHECK(gpuq::error_code_from_string(gpuq::to_string(c)) == c);
}

TEST_CASE("every request the client encodes decodes to the same request in gpuqd") {
  HelloRequest hello{k_protocol_version, 7, "gpuq"};
  CHECK(decode_hello(encode(cmd::hello, hello)) == hello);
  CHECK(decode_hello(json{{"cmd", "hello"}, {"protocol_version", 1}}).protocol_minor == 0);  // an older client
  CHECK(encode(cmd::hello, hello)["cmd"] == "hello");

  SubmitRequest submit;
  submit.jobs = json::array({{{"command", {"true"}}}});
  submit.cwd = "/home/u";
  submit.env = {{"PATH", "/usr/bin"}};
  submit.hold = true;
  submit.max_running = 3;
  CHECK(decode_submit(encode(cmd::submit, submit)) == submit);

  StatusRequest status;
  CHECK(decode_status(encode(cmd::status, status)) == status);
  status.all = true;
  status.after = 40;
  status.page = 7;
  status.queued = 12;
  status.limit = 0;
  status.filter = {3, {JobState::failed, JobState::timed_out}, "lr-*"};
  CHECK(decode_status(encode(cmd::status, status)) == status);

  IdRequest show{9};
  CHECK(decode_id(encode(cmd::show, show)) == show);
  IdsRequest wait{{4, 2, 9}, 1.5};
  CHECK(decode_ids(encode(cmd::wait, wait)) == wait);
  CHECK(encode(cmd::cancel, IdsRequest{{1}})["cmd"] == "cancel");

  SelectRequest hold{{5, 6}, 0};
  CHECK(decode_select(encode(cmd::hold, hold)) == hold);
  SelectRequest release{{}, 8};
  CHECK(decode_select(encode(cmd::release, release)) == release);

  RestartRequest restart;
  restart.batch = 2;
  restart.fresh = true;
  CHECK(decode_restart(encode(cmd::restart, restart)) == restart);

  CleanRequest clean;
  clean.ids = {3};
  clean.ended_before = 1.7e9;
  clean.forget = true;
  CHECK(decode_clean(encode(cmd::clean, clean)) == clean);
  CleanRequest by_age;
  by_age.ended_before = 12;
  by_age.checkpoints_only = true;
  CHECK(decode_clean(encode(cmd::clean, by_age)) == by_age);

  UpdateRequest update;
  update.batch = 4;
  update.priority = -3;
  update.retries = 2;
  update.timeout_s = 0;  // no timeout: sent as null
  update.max_running = 0;  // no limit: sent as null
  CHECK(encode(cmd::update, update)["set"]["timeout_s"].is_null());
  CHECK(decode_update(encode(cmd::update, update)) == update);
  update.timeout_s = 90;
  update.max_running = 5;
  update.retries.reset();
  CHECK(decode_update(encode(cmd::update, update)) == update);

  DrainRequest drain{{0, 3}, {"GPU-1a2b"}, "fan"};
  CHECK(decode_drain(encode(cmd::drain, drain)) == drain);

  ResultsRequest results{{2, 5}, 3, 4, 100};
  CHECK(decode_results(encode(cmd::results, results)) == results);

  EventsRequest events{7, 2, "progress", 100, 50};
  CHECK(decode_events(encode(cmd::events, events)) == events);
}

TEST_SUITE_END();

TEST_SUITE_BEGIN("protocol");

TEST_CASE("requests nested deeper than the limit are refused while parsing") {
  std::string ok = R"({"cmd": "status", "x": )" + std::string(60, '[') + std::string(60, ']') + "}";
  CHECK(gpuq::common::parse_request(ok).ok());
  bool too_deep = true;  // at the limit exactly: 64 levels are read, 65 are not
  auto at_limit = gpuq::common::parse_depth_limited(std::string(64, '[') + "1" + std::string(64, ']'), too_deep);
  const json* inner = &at_limit;
  for (int i = 0; i < 63; ++i) inner = &(*inner)[0];
  CHECK(*inner == json::array({1}));
  CHECK_FALSE(too_deep);
  gpuq::common::parse_depth_limited(std::string(65, '[') + std::string(65, ']'), too_deep);
  CHECK(too_deep);
  CHECK(gpuq::common::parse_depth_limited(R"({"a": [1, 2.5, "x", null, true, {"b": {}}]})", too_deep) ==
        json{{"a", {1, 2.5, "x", nullptr, true, {{"b", json::object()}}}}});
  CHECK_FALSE(too_deep);
  std::string deep = R"({"cmd": "status", "x": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto r = gpuq::common::parse_request(deep);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == gpuq::ErrorCode::bad_request);
  CHECK(r.error().message == "request nests deeper than 64 levels");
  auto nul = gpuq::common::parse_request(std::string("{\"cmd\": \"hello\"}\0junk", 22));
  REQUIRE_FALSE(nul.ok());
  CHECK(nul.error().message == "request contains a NUL byte (at byte 16)");
  auto bad = gpuq::common::parse_request("{\"cmd\": \"show\"}\xff");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("not valid JSON") != std::string::npos);
}

TEST_SUITE_END();

TEST_SUITE_BEGIN("protocol");

TEST_CASE("a number beyond double's range is a bad request, not an exception (found by fuzz_request)") {
  auto r = gpuq::common::parse_request("{\"cmnd\": 9e999}");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == gpuq::ErrorCode::bad_request);
}

TEST_SUITE_END();

TEST_CASE("replies: a field of the wrong type is named by its path; a missing one takes its default") {
  using gpuq::common::ReplyFieldError;
  const auto path_of = [](const json& j) -> std::string {
    try {
      (void)j.get<gpuq::common::JobsReply>();
    } catch (const ReplyFieldError& e) {
      return e.path() + ": " + e.problem();
    }
    return "decoded";
  };
  CHECK(path_of({{"jobs", {{"a", 1}}}}) == "jobs: must be an array, is object");
  CHECK(path_of({{"jobs", {{{"id", 1}}, {{"id", 2}, {"gpus", {0, 1, "two"}}}}}}).rfind("jobs[1].gpus[2]: ", 0) == 0);
  CHECK(path_of({{"jobs", {{{"id", 1}, {"name", 5}}}}}).rfind("jobs[0].name: type must be string", 0) == 0);
  CHECK(path_of({{"more", "yes"}}).rfind("more: ", 0) == 0);
  CHECK(path_of(json::array()) == ": must be an object, is array");
  CHECK(path_of({{"jobs", {{{"id", 3}}}}, {"unknown_field", 1}}) == "decoded");
  // A state this gpuq does not know is an error, not "queued"; a number out of an int's range, or
  // a float where an integer belongs, is an error, not a wrapped or undefined cast.
  CHECK(path_of({{"jobs", {{{"id", 1}, {"state", "exploded"}}}}}).rfind("jobs[0].state: ", 0) == 0);
  CHECK(path_of({{"jobs", {{{"id", 1}, {"attempt", 1e300}}}}}).rfind("jobs[0].attempt: must be an integer", 0) == 0);
  CHECK(path_of({{"jobs", {{{"id", 1}, {"attempt", 4294967297LL}}}}}).rfind("jobs[0].attempt: must be an integer", 0) == 0);
  CHECK(path_of({{"jobs", {1}}}) == "jobs[0]: must be an object, is number");  // no trailing dot
  CHECK(json({{"jobs", {{{"id", 1}, {"state", "timed_out"}}}}}).get<gpuq::common::JobsReply>().jobs[0].state ==
        JobState::timed_out);
  auto r = json({{"jobs", {{{"id", 3}}}}}).get<gpuq::common::JobsReply>();
  REQUIRE(r.jobs.size() == 1);
  CHECK(r.jobs[0].id == 3);
  CHECK(r.jobs[0].mem_bind == "none");  // the default, as gpuqd of an older version leaves it out
  CHECK_FALSE(r.more);
  // What code catching json::exception sees
  CHECK_THROWS_AS((void)json({{"total", "x"}}).get<gpuq::common::JobsReply>(), json::exception);
}

TEST_CASE("the command table: names unique, each encoded request names its command and decodes by its decoder") {
  std::set<std::string_view> names;
  std::size_t count = 0;
  std::apply([&](const auto&... c) { ((names.insert(c.name), ++count), ...); }, k_commands);
  CHECK(names.size() == count);  // no two commands share a name
  CHECK(count == request_decoders().size());
  // The commands that share a request type each put their own name on the wire.
  CHECK(encode(cmd::hold, SelectRequest{{1}, 0})["cmd"] == "hold");
  CHECK(encode(cmd::release, SelectRequest{{1}, 0})["cmd"] == "release");
  CHECK(encode(cmd::why, IdRequest{3})["cmd"] == "why");
  CHECK(encode(cmd::undrain, DrainRequest{{0}, {}, ""})["cmd"] == "undrain");
  std::apply(
      [](const auto&... c) {
        (
            [](const auto& command) {
              const json j = encode(command);
              CHECK(j == json{{"cmd", command.name}});
              CHECK_NOTHROW(command.decode(j));
            }(c),
            ...);
      },
      std::tie(cmd::gpus, cmd::usage, cmd::shutdown));
  // A request of each single-command type names that command.
  CHECK(encode(cmd::hello, HelloRequest{})["cmd"] == cmd::hello.name);
  CHECK(encode(cmd::status, StatusRequest{})["cmd"] == cmd::status.name);
  CHECK(encode(cmd::results, ResultsRequest{})["cmd"] == cmd::results.name);
  CHECK(encode(cmd::events, EventsRequest{})["cmd"] == cmd::events.name);
}

TEST_CASE("a minor version apart: what the other side adds is ignored, in requests and in replies") {
  // A newer client's request with a field this gpuqd does not know decodes as without it.
  StatusRequest plain;
  json newer = encode(cmd::status, plain);
  newer["colour"] = "blue";
  CHECK(decode_status(newer) == plain);
  json hold = encode(cmd::hold, SelectRequest{{4}, 0});
  hold["until"] = "tomorrow";
  CHECK(decode_select(hold) == SelectRequest{{4}, 0});
  // A newer gpuqd's reply with a field this client does not know reads as without it.
  json reply = HelloReply{};
  reply["protocol_minor"] = 9;
  reply["gpu_budgets"] = true;
  const auto read = reply.get<HelloReply>();
  CHECK(read.protocol_minor == 9);
  CHECK(read.protocol_version == k_protocol_version);
  // An older gpuqd says no minor: read as 0, never as this client's own.
  CHECK(json{{"protocol_version", 1}, {"daemon_version", "0.0.9"}}.get<HelloReply>().protocol_minor == 0);
}

namespace {

// A value the schema `s` allows: the smallest where it says one, an example of an item where an
// array needs one, the last property where an object needs one.
json example(const json& s) {
  if (s.contains("const")) return s["const"];
  if (s.contains("enum")) return s["enum"].back();
  if (s.contains("anyOf")) return example(s["anyOf"][0]);
  const json type = s.value("type", json());
  const std::string t = type.is_array() ? type[0].get<std::string>() : type.is_string() ? type.get<std::string>() : "";
  if (t == "boolean") return true;
  if (t == "integer") return s.contains("minimum") ? std::max(s["minimum"].get<std::int64_t>(), std::int64_t{1}) : 1;
  if (t == "number") return s.contains("minimum") ? std::max(s["minimum"].get<double>(), 1.0) : 1.0;
  if (t == "string") return s.contains("pattern") ? "/" : "";  // the one pattern: an absolute path
  if (t == "array") return s.value("minItems", 0) > 0 ? json::array({example(s["items"])}) : json::array();
  if (t == "object" && s.value("minProperties", 0) > 0) {
    const auto last = std::prev(s["properties"].end());
    return json{{last.key(), example(last.value())}};
  }
  return json::object();
}

// Adds to `base` what schema `rule` wants present: each of allOf, the first of anyOf.
void satisfy(json& base, const json& rule, const json& properties) {
  for (const auto& r : rule.value("allOf", json::array()))
    satisfy(base, r, properties);
  if (rule.contains("anyOf")) satisfy(base, rule["anyOf"][0], properties);
  for (const auto& f : rule.value("required", json::array())) {
    const std::string field = f;
    json s = properties[field];
    if (rule.contains("properties") && rule["properties"].contains(field)) s.update(rule["properties"][field]);
    base[field] = example(s);
  }
}

// Calls `f` with each `not` the rules of `s` hold.
void for_each_not(const json& s, const std::function<void(const json&)>& f) {
  if (s.contains("not")) f(s["not"]);
  for (const char* k : {"allOf", "anyOf"})
    for (const auto& r : s.value(k, json::array()))
      for_each_not(r, f);
}

// The refusal of a request, or "" when it decodes.
template <class C>
std::string refusal_of(const C& command, const json& request) {
  try {
    (void)command.decode(request);
  } catch (const gpuq::RequestError& e) {
    return e.what();
  }
  return "";
}

// The schema `s` with a $ref followed into `defs`.
const json& resolved(const json& s, const json& defs) {
  if (!s.contains("$ref")) return s;
  const std::string ref = s["$ref"];
  return defs.at(ref.substr(ref.rfind('/') + 1));
}

// The types schema `s` allows ("null" too where a field may be left out); none where it says no
// type (any value, or an enum alone).
std::vector<std::string> types_of(const json& s) {
  const json t = s.value("type", json());
  if (t.is_string()) return {t.get<std::string>()};
  return t.is_array() ? t.get<std::vector<std::string>>() : std::vector<std::string>{};
}

// What schema `s` says of one field, the decoder does: each value the schema allows at its edges is
// accepted, each just past them refused, naming the field (`named`). `with(v)` is the refusal of a
// request with v in that field ("" when it decodes); `may_leave_out`: the request decodes without it.
void check_bounds(const json& s, bool required, bool may_leave_out, const std::string& named,
                  const std::function<std::string(json)>& with) {
  const auto accepted = [&](const json& v) { CHECK_MESSAGE(with(v) == "", "refused " << v.dump()); };
  const auto refused = [&](const json& v) {
    const std::string why = with(v);
    CHECK_MESSAGE(why.rfind(named, 0) == 0, "not refused by name: " << v.dump() << " (" << why << ")");
  };
  const auto types = types_of(s);
  const auto allows = [&](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
  constexpr auto k_min = std::numeric_limits<std::int64_t>::min(), k_max = std::numeric_limits<std::int64_t>::max();
  // An integer range: both ends in, one past each out (past int64's own, a number beyond it).
  const auto integer_edges = [&](const json& range, auto wrap) {
    const auto lo = range.at("minimum").get<std::int64_t>(), hi = range.at("maximum").get<std::int64_t>();
    accepted(wrap(lo));
    accepted(wrap(hi));
    accepted(wrap(static_cast<double>(std::clamp<std::int64_t>(1, lo, hi))));  // 1.0 is an integer
    refused(wrap(lo == k_min ? json(-1e19) : json(lo - 1)));
    refused(wrap(hi == k_max ? json(static_cast<std::uint64_t>(k_max) + 1) : json(hi + 1)));
    if (lo <= 1 && hi >= 2) refused(wrap(1.5));
  };
  if (!types.empty()) {
    // A value of a kind the schema does not allow is refused.
    if (!allows("string")) refused("3");
    if (!allows("integer") && !allows("number")) refused(7);
    if (!allows("boolean")) refused(true);
    if (!allows("array")) refused(json::array());
    if (!allows("object")) refused(json::object());
    if (!allows("null"))
      refused(nullptr);
    else if (may_leave_out)
      accepted(nullptr);  // null reads as left out (unless a rule wants it)
  }
  CHECK(allows("null") == !required);
  if (types.empty()) return;
  const std::string t = types[0];
  if (t == "boolean") accepted(false);
  if (t == "integer") integer_edges(s, [](json v) { return v; });
  if (t == "number") {
    if (s.contains("minimum")) accepted(s["minimum"]), refused(s["minimum"].get<double>() - 1);
    if (s.contains("maximum")) accepted(s["maximum"]), refused(s["maximum"].get<double>() + 1);
  }
  if (t == "string") {
    // maxLength counts characters: as many two-byte ones are in, one more is out.
    std::string most;
    for (std::size_t i = 0; s.contains("maxLength") && i < s["maxLength"].get<std::size_t>(); ++i)
      most += "\u00e9";
    if (s.contains("maxLength")) accepted(most), refused(most + "a");
    for (const auto& v : s.value("enum", json::array()))
      accepted(v);
    if (s.contains("enum")) refused("no-such-value");
    if (s.contains("pattern")) {  // an absolute path without NUL bytes
      CHECK(s["pattern"] == "^/[^\\u0000]*$");
      accepted("/x");
      refused("relative");
      refused(std::string("/a\0b", 4));
    }
  }
  if (t == "array" && s["items"].value("type", "") == "integer")
    integer_edges(s["items"], [](json v) { return json::array({std::move(v)}); });
  if (t == "array" && s["items"].contains("enum")) {
    for (const auto& v : s["items"]["enum"])
      accepted(json::array({v}));
    refused(json::array({"no-such-value"}));
  }
  if (t == "object" && s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
    accepted(json{{"A", "x"}});
    refused(json{{"A", 1}});
  }
}

}  // namespace

TEST_CASE("the schema says of each command's request what its decoder does, and of its reply what is encoded") {
  const json schema = protocol_schema();
  const json& defs = schema["$defs"];
  std::size_t described = 0;
  std::apply(
      [&](const auto&... c) {
        (
            [&](const auto& command) {
              using C = std::remove_cvref_t<decltype(command)>;
              const std::string name(command.name);
              CAPTURE(name);
              REQUIRE(schema["commands"].contains(name));
              ++described;
              const json& request = schema["commands"][name]["request"];
              CHECK(request["properties"]["cmd"]["const"] == name);
              // A request of each required field's smallest value decodes.
              json base{{"cmd", name}};
              for (const auto& field : request["required"])
                if (field != "cmd")
                  base[field.get<std::string>()] = example(request["properties"][field.get<std::string>()]);
              // What the rules over several fields want (`allOf`), the decoder wants too.
              if (request.contains("allOf")) {
                CHECK(refusal_of(command, base) != "");
                for (const auto& rule : request["allOf"])
                  satisfy(base, rule, request["properties"]);
                for_each_not(request, [&](const json& forbidden) {
                  json j = base;
                  for (const auto& [field, s] : forbidden["properties"].items())
                    j[field] = s["const"];
                  CHECK(refusal_of(command, j) != "");
                });
              }
              CHECK(refusal_of(command, base) == "");
              for (const auto& [field, s] : request["properties"].items()) {
                if (field == "cmd") continue;
                CAPTURE(field);
                CHECK(s.contains("description"));
                const std::string named = "field `" + field;
                auto with = [&](json v) {
                  json j = base;
                  j[field] = std::move(v);
                  return refusal_of(command, j);
                };
                const json& need = request["required"];
                json without = base;
                without.erase(field);
                check_bounds(s, std::find(need.begin(), need.end(), field) != need.end(),
                             refusal_of(command, without) == "", named, with);
                // An absent field decodes to the default the schema says: the encoder leaves it out.
                if (s.contains("default") && !base.contains(field)) {
                  const auto decoded = command.decode(base);
                  const json again = encode(command, decoded);
                  CHECK_FALSE(again.contains(field));
                }
              }
              // Every field the encoder writes is described.
              const json written = encode(command, command.decode(base));
              for (const auto& [field, v] : written.items()) {
                CAPTURE(field);
                CHECK(request["properties"].contains(field));
              }
              // The reply: every field its encoding has is described, with the default it has.
              const json& reply = resolved(schema["commands"][name]["reply"], defs);
              const json encoded = typename C::reply{};
              for (const auto& [field, v] : encoded.items()) {
                CAPTURE(field);
                REQUIRE(reply["properties"].contains(field));
                if (reply["properties"][field].contains("default")) CHECK(reply["properties"][field]["default"] == v);
              }
            }(c),
            ...);
      },
      k_commands);
  CHECK(described == schema["commands"].size());
}

TEST_CASE("docs/protocol.schema.json is the protocol's schema as gpuq schema prints it") {
  std::ifstream in(GPUQ_SOURCE_DIR "/docs/protocol.schema.json");
  REQUIRE_MESSAGE(in, "docs/protocol.schema.json is missing: gpuq schema > docs/protocol.schema.json");
  const json doc = json::parse(in);
  CHECK_MESSAGE(doc == protocol_schema(),
                "docs/protocol.schema.json is stale: gpuq schema > docs/protocol.schema.json");
}
