// Job-spec validation: every rule, and that each error names the job, the field and the fix.
#include <doctest/doctest.h>

#include <csignal>
#include <sstream>

#include <algorithm>

#include "common/slurm_script.hpp"
#include "common/spec.hpp"

using gpuq::common::json;
using gpuq::common::parse_batch;
using gpuq::common::parse_job;
using gpuq::common::sbatch_options;
using gpuq::common::sbatch_script;
using gpuq::common::shell_quote;
using gpuq::common::SlurmOptions;
using gpuq::common::to_json;

namespace {
std::string error_of(const std::string& text) {
  auto r = parse_batch(json::parse(text), "/tmp");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == gpuq::ErrorCode::invalid_spec);
  return r.error().message;
}
bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
}  // namespace

TEST_SUITE_BEGIN("spec");

TEST_CASE("a minimal command job gets the documented defaults") {
  auto r = parse_batch(json::parse(R"({"command": ["python3", "train.py"]})"), "/home/u");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  const auto& s = r->at(0);
  CHECK(s.command == std::vector<std::string>{"python3", "train.py"});
  CHECK(s.gpus == 0);
  CHECK(s.mode == gpuq::common::Mode::independent);
  CHECK(s.ranks == 1);
  CHECK(s.retries == 0);
  CHECK(s.cpus == 0);  // not asked: no pinning
  CHECK(s.cwd == "/home/u");
  CHECK_FALSE(s.shared);
}

TEST_CASE("on_finish past 4,096 arguments is refused with the limit named") {
  json spec = {{"command", {"true"}}, {"on_finish", json::array()}};
  for (int i = 0; i < 4097; ++i) spec["on_finish"].push_back("x");
  auto r = parse_batch(spec, "/tmp");
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("field `on_finish` has 4097 arguments; at most 4096") != std::string::npos);
  spec["on_finish"].erase(spec["on_finish"].size() - 1);
  CHECK(parse_batch(spec, "/tmp"));
}

TEST_CASE("on_finish is a command like `command`, kept in the normalised spec") {
  auto r = parse_batch(json::parse(R"({"command": ["true"], "on_finish": ["notify-send", "done"]})"), "/tmp");
  REQUIRE(r.ok());
  CHECK((*r)[0].on_finish == std::vector<std::string>{"notify-send", "done"});
  CHECK(to_json((*r)[0])["on_finish"] == json::parse(R"(["notify-send", "done"])"));
  CHECK_FALSE(to_json(parse_batch(json::parse(R"({"command": ["true"]})"), "/tmp")->at(0)).contains("on_finish"));
  CHECK(contains(error_of(R"({"command": ["true"], "on_finish": "notify-send done"})"),
                 "field `on_finish` must be a non-empty array of strings"));
  CHECK(contains(error_of(R"({"command": ["true"], "on_finish": []})"), "field `on_finish` must be a non-empty array"));
  CHECK(contains(error_of(R"({"command": ["true"], "on_finish": ["x", 3]})"), "field `on_finish[1]` must be a string"));
  CHECK(contains(error_of(R"({"command": ["true"], "on_finish": [""]})"), "field `on_finish[0]` is empty"));
  json big = json::parse(R"({"command": ["true"]})");
  big["on_finish"] = json::array();
  for (int i = 0; i < 3; ++i) big["on_finish"].push_back(std::string(100000, 'x'));
  CHECK(contains(error_of(big.dump()), "at most 262144 in all"));
}

TEST_CASE("preemption fields: preemptible, a signal a program can catch, a bounded grace; kept as given") {
  auto r = parse_batch(json::parse(R"({"command": ["true"]})"), "/tmp");
  REQUIRE(r.ok());
  CHECK_FALSE((*r)[0].preemptible);
  CHECK((*r)[0].preempt_signal.empty());
  CHECK((*r)[0].preempt_grace_s < 0);  // unset: gpuqd's preempt_grace_s
  CHECK_FALSE(to_json((*r)[0]).contains("preemptible"));
  CHECK_FALSE(to_json((*r)[0]).contains("preempt_grace_s"));
  r = parse_batch(
      json::parse(R"({"command": ["true"], "preemptible": true, "preempt_signal": "USR1", "preempt_grace_s": 0})"),
      "/tmp");
  REQUIRE(r.ok());
  const auto& s = (*r)[0];
  CHECK(s.preemptible);
  CHECK(s.preempt_signal == "SIGUSR1");  // the SIG is added
  CHECK(gpuq::common::preempt_signal_number(s.preempt_signal) == SIGUSR1);
  CHECK(gpuq::common::preempt_signal_number("") == SIGTERM);
  CHECK(s.preempt_grace_s == 0);
  const json back = to_json(s);
  CHECK(back["preemptible"] == true);
  CHECK(back["preempt_signal"] == "SIGUSR1");
  CHECK(back["preempt_grace_s"] == 0);
  CHECK(parse_job(back, "/tmp")->preempt_signal == "SIGUSR1");  // a stored spec reads back the same
  for (const char* bad : {"KILL", "SIGSTOP", "SIGSEGV", "9", "", "sigterm"})
    CHECK(contains(error_of(json{{"command", {"true"}}, {"preempt_signal", bad}}.dump()),
                   "field `preempt_signal` must be one of SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT"));
  CHECK(contains(error_of(R"({"command": ["true"], "preempt_grace_s": -1})"),
                 "field `preempt_grace_s` must be between 0"));
  CHECK(contains(error_of(R"({"command": ["true"], "preempt_grace_s": 86401})"), "and 86400"));
  CHECK(contains(error_of(R"({"command": ["true"], "preemptible": "yes"})"), "field `preemptible`"));
}

TEST_CASE("preempt_mode: auto by default (not written back), requeue or suspend, anything else refused") {
  using gpuq::common::PreemptMode;
  auto r = parse_batch(json::parse(R"({"command": ["true"]})"), "/tmp");
  REQUIRE(r.ok());
  CHECK((*r)[0].preempt_mode == PreemptMode::auto_);
  CHECK_FALSE(to_json((*r)[0]).contains("preempt_mode"));
  for (const auto& [word, mode] : {std::pair{"auto", PreemptMode::auto_}, std::pair{"requeue", PreemptMode::requeue},
                                   std::pair{"suspend", PreemptMode::suspend}}) {
    CAPTURE(word);
    r = parse_batch(json{{"command", {"true"}}, {"preempt_mode", word}}, "/tmp");
    REQUIRE(r.ok());
    CHECK((*r)[0].preempt_mode == mode);
    CHECK(parse_job(to_json((*r)[0]), "/tmp")->preempt_mode == mode);  // a stored spec reads back the same
  }
  CHECK(contains(error_of(R"({"command": ["true"], "preempt_mode": "freeze"})"),
                 "field `preempt_mode` must be \"auto\", \"requeue\" or \"suspend\", got \"freeze\""));
  CHECK(contains(error_of(R"({"command": ["true"], "preempt_mode": 1})"), "field `preempt_mode`"));
}

TEST_CASE("gpu_memory_policy: gpuqd's by default (not written back), requeue or warn, for shared jobs only") {
  using gpuq::common::MemoryPolicy;
  const json shared = {{"command", {"true"}}, {"gpus", 1}, {"shared", true}, {"gpu_memory_mb", 8000}};
  auto r = parse_batch(shared, "/tmp");
  REQUIRE(r.ok());
  CHECK((*r)[0].gpu_memory_policy == MemoryPolicy::default_);
  CHECK_FALSE(to_json((*r)[0]).contains("gpu_memory_policy"));
  for (const auto& [word, policy] :
       {std::pair{"requeue", MemoryPolicy::requeue}, std::pair{"warn", MemoryPolicy::warn}}) {
    CAPTURE(word);
    json spec = shared;
    spec["gpu_memory_policy"] = word;
    r = parse_batch(spec, "/tmp");
    REQUIRE(r.ok());
    CHECK((*r)[0].gpu_memory_policy == policy);
    CHECK(parse_job(to_json((*r)[0]), "/tmp")->gpu_memory_policy == policy);  // a stored spec reads back the same
  }
  json bad = shared;
  bad["gpu_memory_policy"] = "kill";
  CHECK(contains(error_of(bad.dump()), "field `gpu_memory_policy` must be \"requeue\" or \"warn\", got \"kill\""));
  CHECK(contains(error_of(R"({"command": ["true"], "gpus": 1, "gpu_memory_policy": "warn"})"),
                 "field `gpu_memory_policy` needs `shared`"));
}

TEST_CASE("a NUL byte in any string of a spec is refused by its field, not cut short at exec") {
  CHECK(contains(error_of(R"({"command": ["echo", "a\u0000; rm -rf ~"]})"),
                 "field `command[1]` contains a NUL byte"));
  CHECK(contains(error_of(R"({"shell": "true\u0000junk"})"), "field `shell` contains a NUL byte"));
  CHECK(contains(error_of(R"({"command": ["true"], "env": {"A": "x\u0000y"}})"), "field `env.A` contains a NUL byte"));
  CHECK(contains(error_of(R"({"command": ["true"], "cwd": "/tmp\u0000/x"})"), "field `cwd` contains a NUL byte"));
}

TEST_CASE("a timeout beyond the limit says the limit, not that it must be positive") {
  CHECK(contains(error_of(R"({"command": ["true"], "timeout_s": 2e9})"), "field `timeout_s` must be at most 1e9 seconds"));
  auto ok = parse_batch(json::parse(R"({"command": ["true"], "timeout_s": 1e9})"), "/tmp");
  CHECK(ok.ok());
}

TEST_CASE("a typo in a field name is an error that suggests the right name") {
  auto msg = error_of(R"({"name": "x", "command": ["true"], "gpu": 2})");
  CHECK(contains(msg, "job[0] (x): unknown field `gpu` (did you mean `gpus`?)"));
}

TEST_CASE("wrong types name the field and the type received") {
  CHECK(contains(error_of(R"({"command": ["true"], "gpus": "2"})"), "field `gpus` must be an integer, got a string"));
  CHECK(contains(error_of(R"({"command": "python3 train.py"})"), "field `command` must be a non-empty array"));
  CHECK(contains(error_of(R"({"command": ["true", 3]})"), "field `command[1]` must be a string, got an integer"));
  CHECK(contains(error_of(R"({"command": ["true"], "env": {"A": 1}})"), "field `env.A` must be a string"));
  CHECK(contains(error_of(R"({"command": ["true"], "shared": "yes"})"), "field `shared` must be true or false"));
}

TEST_CASE("negative or absurd numbers are rejected with the allowed range") {
  CHECK(contains(error_of(R"({"command": ["true"], "gpus": -1})"), "field `gpus` must be between 0 and 1024, got -1"));
  CHECK(contains(error_of(R"({"command": ["true"], "retries": 1000})"), "field `retries` must be between 0 and 100"));
  CHECK(contains(error_of(R"({"command": ["true"], "timeout_s": 0})"), "field `timeout_s` must be > 0"));
}

TEST_CASE("`cpus` is cores per rank, at least one") {
  auto r = parse_batch(json::parse(R"({"shell": "true", "mode": "ddp", "ranks": 3, "cpus": 4})"), "/");
  REQUIRE(r.ok());
  CHECK(r->at(0).cpus == 4);
  CHECK(contains(error_of(R"({"command": ["true"], "cpus": 0})"), "field `cpus` must be between 1 and 4096, got 0"));
  CHECK(contains(error_of(R"({"command": ["true"], "cpus": 2.5})"), "field `cpus` must be an integer"));
  CHECK(contains(error_of(R"({"command": ["true"], "cpu": 2})"), "unknown field `cpu` (did you mean `cpus`?)"));
  CHECK(contains(error_of(R"({"command": ["true"], "env": {"GPUQ_CPUS": "0"}})"), "cannot be overridden"));
}

TEST_CASE("an environment variable's name is an identifier, so no script it is written into can run it") {
  for (const char* name : {"A\ntouch /tmp/PWNED\n#", "A B", "1A", "A-B", "A=B", "", "A$(id)", "\u00e9"}) {
    const json spec = {{"command", {"true"}}, {"env", {{name, "x"}}}};
    CAPTURE(name);
    CHECK(contains(error_of(spec.dump()), "field `env` has an invalid variable name"));
  }
  CHECK(contains(error_of(R"({"command": ["true"], "env": {"A\ntouch": "x"}})"), "\"A\\ntouch\""));  // shown escaped
  CHECK(parse_job({{"command", {"true"}}, {"env", {{"_A9", "x"}, {"lower_case", "y"}}}}, "/w").ok());
}

TEST_CASE("`mem_bind` is local, prefer or none, and needs `cpus`") {
  using gpuq::common::MemBind;
  auto r = parse_batch(json::parse(R"([{"shell": "true", "cpus": 2, "mem_bind": "local"},
                                       {"shell": "true", "cpus": 2, "mem_bind": "prefer"},
                                       {"shell": "true", "cpus": 2, "mem_bind": "none"},
                                       {"shell": "true", "cpus": 2}])"),
                       "/");
  REQUIRE(r.ok());
  CHECK(r->at(0).mem_bind == MemBind::local);
  CHECK(r->at(1).mem_bind == MemBind::prefer);
  CHECK(r->at(2).mem_bind == MemBind::none);
  CHECK(r->at(3).mem_bind == MemBind::none);
  CHECK(contains(error_of(R"({"command": ["true"], "cpus": 1, "mem_bind": "strict"})"),
                 "field `mem_bind` must be \"local\", \"prefer\" or \"none\", got \"strict\""));
  CHECK(contains(error_of(R"({"command": ["true"], "mem_bind": "local"})"), "field `mem_bind` needs `cpus`"));
  CHECK(contains(error_of(R"({"command": ["true"], "cpus": 1, "mem_bind": true})"), "field `mem_bind` must be a string"));
  CHECK(contains(error_of(R"({"command": ["true"], "membind": "local"})"), "(did you mean `mem_bind`?)"));
}

TEST_CASE("core lists are written the way the kernel writes them") {
  using gpuq::common::format_cpu_list;
  CHECK(format_cpu_list({}) == "");
  CHECK(format_cpu_list({5}) == "5");
  CHECK(format_cpu_list({6, 0, 1, 2, 3}) == "0-3,6");
  CHECK(format_cpu_list({1, 1, 2, 4, 5, 9}) == "1-2,4-5,9");
}

TEST_CASE("a job needs exactly one thing to run") {
  CHECK(contains(error_of(R"({"name": "x"})"), "needs one of `command`"));
  CHECK(contains(error_of(R"({"command": ["true"], "shell": "true"})"), "give only one of"));
}

TEST_CASE("a shell job runs through /bin/sh -c only when asked") {
  auto r = parse_batch(json::parse(R"({"shell": "echo $HOME | wc -c"})"), "/");
  REQUIRE(r.ok());
  CHECK(r->at(0).command == std::vector<std::string>{"/bin/sh", "-c", "echo $HOME | wc -c"});
}

TEST_CASE("ddp jobs get one rank per GPU, or explicit CPU ranks") {
  auto r = parse_batch(json::parse(R"({"command": ["t"], "mode": "ddp", "gpus": 4})"), "/");
  REQUIRE(r.ok());
  CHECK(r->at(0).ranks == 4);
  r = parse_batch(json::parse(R"({"command": ["t"], "mode": "ddp", "ranks": 2})"), "/");
  REQUIRE(r.ok());
  CHECK(r->at(0).ranks == 2);
  CHECK(r->at(0).gpus == 0);
  CHECK(contains(error_of(R"({"command": ["t"], "mode": "ddp"})"), "needs `ranks`"));
  CHECK(contains(error_of(R"({"command": ["t"], "mode": "ddp", "gpus": 2, "ranks": 3})"), "must equal `gpus`"));
  CHECK(contains(error_of(R"({"command": ["t"], "ranks": 2})"), "needs \"mode\": \"ddp\""));
  CHECK(contains(error_of(R"({"command": ["t"], "mode": "dpp"})"), "must be \"independent\" or \"ddp\""));
}

TEST_CASE("shared jobs must say how much memory they need") {
  CHECK(contains(error_of(R"({"command": ["t"], "gpus": 1, "shared": true})"), "a shared job needs `gpu_memory_mb`"));
  CHECK(contains(error_of(R"({"command": ["t"], "shared": true, "gpu_memory_mb": 100})"), "needs `gpus` >= 1"));
  CHECK(contains(error_of(R"({"command": ["t"], "mode": "ddp", "gpus": 2, "shared": true, "gpu_memory_mb": 10})"),
                 "a ddp job cannot be shared"));
}

TEST_CASE("host memory per rank, and whether an attempt out of memory is retried") {
  auto r =
      parse_batch(json::parse(R"({"command": ["t"], "memory_mb": 2048, "retries": 1, "retry_on_oom": true})"), "/tmp");
  REQUIRE(r.ok());
  CHECK(r->at(0).memory_mb == 2048);
  CHECK(r->at(0).retry_on_oom);
  const json again = to_json(r->at(0));
  CHECK(again["memory_mb"] == 2048);
  CHECK(again["retry_on_oom"] == true);
  const json plain = to_json(parse_batch(json::parse(R"({"command": ["t"]})"), "/tmp")->at(0));
  CHECK_FALSE(plain.contains("memory_mb"));
  CHECK_FALSE(plain.contains("retry_on_oom"));
  CHECK(contains(error_of(R"({"command": ["t"], "memory_mb": 3})"), "`memory_mb`"));  // under what a process needs
  CHECK(contains(error_of(R"({"command": ["t"], "memory_mb": "1G"})"), "`memory_mb`"));
  CHECK(contains(error_of(R"({"command": ["t"], "retry_on_oom": 1})"), "`retry_on_oom`"));
}

TEST_CASE("gpuq's own environment variables cannot be overridden") {
  CHECK(contains(error_of(R"({"command": ["t"], "env": {"CUDA_VISIBLE_DEVICES": "0"}})"),
                 "field `env.CUDA_VISIBLE_DEVICES` is set by gpuq"));
  CHECK(contains(error_of(R"({"command": ["t"], "env": {"RANK": "0"}})"), "`env.RANK`"));
}

TEST_CASE("strings exec would refuse (over 128 KiB) are refused at submit, naming the field") {
  const std::string big(128 * 1024, 'x');
  const auto job = [](json fields) {
    fields["name"] = "big";
    return fields.dump();
  };
  CHECK(contains(error_of(job({{"command", {"echo", big}}})),
                 "field `command[1]` is 131072 bytes; exec takes at most 128 KiB in one argument"));
  CHECK(contains(error_of(job({{"shell", big}})), "field `shell` is 131072 bytes"));
  CHECK(contains(error_of(job({{"shell", "true"}, {"env", {{"BIG", big}}}})),
                 "field `env.BIG` is 131072 bytes; exec takes at most 128 KiB in one environment variable"));
  // A train spec reaches gpuq-worker as one argument: 100,000 class weights do not fit.
  json train = {{"dataset", {{"kind", "synthetic"}, {"classes", 100000},
                             {"class_weights", std::vector<double>(100000, 0.123456789)}}}};
  CHECK(contains(error_of(job({{"train", train}})), "field `train` (given to gpuq-worker as one argument) is "));
  // Just under the limit is fine: 131071 bytes and the NUL.
  CHECK(parse_batch(json::parse(job({{"command", {"echo", big.substr(1)}}})), "/tmp").ok());
  CHECK(parse_batch(json::parse(job({{"shell", "true"}, {"env", {{"B", big.substr(3)}}}})), "/tmp").ok());
}

TEST_CASE("cwd must be absolute and names must be safe") {
  CHECK(contains(error_of(R"({"command": ["t"], "cwd": "rel/dir"})"), "field `cwd` must be an absolute path"));
  CHECK(contains(error_of(R"({"command": ["t"], "name": "../../etc"})"), "field `name` must be 1-128 characters"));
  CHECK(contains(error_of(R"({"command": ["t"], "name": "123"})"), "not all digits"));
}

TEST_CASE("a batch reports every problem at once, each with its job") {
  auto msg = error_of(R"([{"name": "a", "command": ["t"], "gpus": -2}, {"name": "b", "comand": ["t"]}])");
  CHECK(contains(msg, "3 problems"));  // the typo also leaves job[1] with nothing to run
  CHECK(contains(msg, "job[0] (a): field `gpus`"));
  CHECK(contains(msg, "job[1] (b): unknown field `comand` (did you mean `command`?)"));
}

TEST_CASE("a batch is an object or a non-empty array of objects") {
  CHECK(contains(error_of("[]"), "the batch is empty"));
  CHECK(contains(error_of("42"), "expected a job object or an array of jobs, got an integer"));
  CHECK(contains(error_of(R"([{"command": ["t"]}, 7])"), "job[1]: must be an object"));
}

TEST_CASE("dependencies resolve by name within the batch") {
  auto r = parse_batch(json::parse(R"([{"name": "prep", "command": ["t"]},
                                      {"name": "train", "command": ["t"], "after": ["prep", 17]}])"),
                       "/");
  REQUIRE(r.ok());
  auto deps = gpuq::common::resolve_batch_dependencies(*r);
  REQUIRE(deps.ok());
  CHECK(deps->at(1) == std::vector<std::size_t>{0});
  CHECK(r->at(1).after.at(1).id == 17);  // an existing job: checked by the daemon
}

TEST_CASE("unknown dependency names, duplicates and cycles are rejected") {
  CHECK(contains(error_of(R"([{"name": "a", "command": ["t"], "after": ["nope"]}])"),
                 "`after` names \"nope\", which is not a job in this batch"));
  CHECK(contains(error_of(R"([{"name": "a", "command": ["t"]}, {"name": "a", "command": ["t"]}])"),
                 "name also used by job[0]"));
  CHECK(contains(error_of(R"([{"name": "a", "command": ["t"], "after": ["a"]}])"), "depends on itself"));
  auto msg = error_of(R"([{"name": "a", "command": ["t"], "after": ["c"]},
                          {"name": "b", "command": ["t"], "after": ["a"]},
                          {"name": "c", "command": ["t"], "after": ["b"]}])");
  CHECK(contains(msg, "dependency cycle: a -> c -> b -> a"));
}

TEST_CASE("labels keep their JSON type; a label is a string, a number or a boolean") {
  auto r = parse_batch(json::parse(R"({"command": ["t"], "labels": {"lr": 0.3, "seed": 2, "tag": "a", "best": true}})"),
                       "/");
  REQUIRE(r.ok());
  CHECK(r->at(0).labels.at("lr") == 0.3);
  CHECK(r->at(0).labels.at("lr").is_number_float());
  CHECK(r->at(0).labels.at("seed").is_number_integer());
  CHECK(r->at(0).labels.at("tag") == "a");
  CHECK(gpuq::common::to_json(r->at(0))["labels"]["lr"] == 0.3);  // stored as typed
  CHECK(contains(error_of(R"({"command": ["t"], "labels": {"hidden": [64]}})"),
                 "field `labels.hidden` must be a string, a number or a boolean, got an array"));
  CHECK(contains(error_of(R"({"command": ["t"], "labels": {"n": null}})"), "field `labels.n` must be"));
  CHECK(contains(error_of(R"({"command": ["t"], "labels": "lr=0.3"})"), "field `labels` must be an object"));
}

TEST_CASE("a report pattern needs a named group, written (?P<name>...) or (?<name>...)") {
  auto with = [](const char* pattern) {
    return parse_batch(json{{"command", {"t"}}, {"report", {{"result", {pattern}}}}}, "/");
  };
  CHECK(with("acc=(?P<acc>[0-9.]+)").ok());
  CHECK(with("acc=(?<acc>[0-9.]+)").ok());  // RE2's own word on it comes from gpuqd
  CHECK(contains(with("(?<=x)acc=([0-9.]+)").error().message, "has no named group"));  // a look-behind
  CHECK(contains(with("acc=[0-9.]+").error().message, "has no named group"));
}

TEST_CASE("parse_batch_all keeps going past a job with problems, saying which jobs read whole") {
  auto r = gpuq::common::parse_batch_all(json::parse(R"([{"name": "a", "command": ["t"], "gpus": "2"},
                                                        {"name": "b", "command": ["t"], "gpus": 3},
                                                        7,
                                                        {"name": "d", "command": ["t"], "retries": -1, "bogus": 1}])"),
                                         "/");
  REQUIRE(r.ok());
  REQUIRE(r->specs.size() == 4);
  CHECK(r->ok == std::vector<bool>{false, true, false, false});
  CHECK(r->specs[1].gpus == 3);  // a job that read whole is whole, for the machine's checks
  REQUIRE(r->problems.size() == 4);
  CHECK(contains(r->problems[0], "job[0] (a): field `gpus`"));
  CHECK(contains(r->problems[1], "job[2]: must be an object"));
  CHECK(r->local_deps.empty());  // not resolved while a name may be wrong
  // Whole, its `after` resolves as parse_batch's does.
  auto whole = gpuq::common::parse_batch_all(json::parse(R"([{"name": "a", "command": ["t"]},
                                                            {"name": "b", "command": ["t"], "after": ["a"]}])"),
                                             "/");
  REQUIRE(whole.ok());
  CHECK(whole->problems.empty());
  CHECK(whole->local_deps == std::vector<std::vector<std::size_t>>{{}, {0}});
  auto cycle = gpuq::common::parse_batch_all(json::parse(R"([{"name": "a", "command": ["t"], "after": ["a"]}])"), "/");
  REQUIRE(cycle.ok());
  REQUIRE(cycle->problems.size() == 1);
  CHECK(contains(cycle->problems[0], "depends on itself"));
  CHECK_FALSE(gpuq::common::parse_batch_all(json::array(), "/").ok());  // nothing to look at
}

TEST_CASE("a stored spec parses back to the same job") {
  auto r = parse_batch(json::parse(R"({"name": "n", "shell": "echo", "gpus": 2, "mode": "ddp", "retries": 3,
                                      "timeout_s": 9.5, "env": {"A": "1"}, "labels": {"k": "v", "lr": 0.5}, "after": [4], "cpus": 3,
                                      "mem_bind": "prefer"})"),
                       "/w");
  REQUIRE(r.ok());
  auto again = gpuq::common::parse_job(gpuq::common::to_json(r->at(0)), "/");
  REQUIRE(again.ok());
  CHECK(again->cpus == 3);
  CHECK(again->mem_bind == gpuq::common::MemBind::prefer);
  CHECK(gpuq::common::to_json(*again) == gpuq::common::to_json(r->at(0)));
}

TEST_SUITE_END();

TEST_CASE("nodes: a ddp gang split evenly over machines; anything else is refused, naming the field") {
  auto one = [](json spec) { return parse_job(spec, "/tmp"); };
  auto ok = one({{"command", {"t"}}, {"mode", "ddp"}, {"gpus", 8}, {"nodes", 2}});
  REQUIRE(ok);
  CHECK(ok->nodes == 2);
  CHECK(ok->ranks == 8);
  CHECK(to_json(*ok)["nodes"] == 2);
  CHECK(parse_job(to_json(*ok), "/tmp")->nodes == 2);  // as stored and reloaded
  CHECK(one({{"command", {"t"}}})->nodes == 1);
  CHECK_FALSE(to_json(*one({{"command", {"t"}}})).contains("nodes"));
  auto refused = [&](json spec, const std::string& why) {
    auto r = one(spec);
    REQUIRE_FALSE(r);
    CHECK_MESSAGE(r.error().message.find(why) != std::string::npos, r.error().message);
  };
  refused({{"command", {"t"}}, {"gpus", 2}, {"nodes", 2}}, "needs \"mode\": \"ddp\"");
  refused({{"command", {"t"}}, {"mode", "ddp"}, {"gpus", 3}, {"nodes", 2}}, "must split evenly over `nodes` (2)");
  refused({{"command", {"t"}}, {"mode", "ddp"}, {"ranks", 3}, {"nodes", 2}}, "`ranks` (3) must split evenly");
  refused({{"command", {"t"}}, {"mode", "ddp"}, {"gpus", 2}, {"nodes", 0}}, "nodes");
  refused({{"command", {"t"}}, {"mode", "ddp"}, {"gpus", 2}, {"nodes", 5000}}, "nodes");
}

TEST_CASE("slurm: a spec's sbatch options and script, quoted for bash, environment its own") {
  auto spec = *parse_job({{"name", "ddp-run"},
                          {"command", {"python3", "it's.py"}},
                          {"mode", "ddp"},
                          {"gpus", 4},
                          {"nodes", 2},
                          {"cpus", 3},
                          {"memory_mb", 1000},
                          {"timeout_s", 90},
                          {"priority", -4},
                          {"env", {{"X", "a'b"}}}},
                         "/work");
  SlurmOptions o;
  o.partition = "gpu";
  o.extra_args = {"--constraint=a100"};
  const auto opts = sbatch_options(spec, o);
  const std::vector<std::string> want{"--job-name=ddp-run",
                                      "--nodes=2",
                                      "--ntasks-per-node=2",
                                      "--gpus-per-node=2",
                                      "--cpus-per-task=3",
                                      "--mem=2000M",
                                      "--time=3",
                                      "--signal=TERM@60",
                                      "--nice=4",
                                      "--chdir=/work",
                                      "--output=ddp-run-%j.log",
                                      "--export=NONE",
                                      "--partition=gpu",
                                      "--constraint=a100"};
  CHECK(opts == want);
  const std::string script = *sbatch_script(spec, o);
  CHECK(script.rfind("#!/bin/bash\n#SBATCH --job-name=ddp-run\n", 0) == 0);
  CHECK(script.find("export X='a'\\''b'\n") != std::string::npos);
  CHECK(script.find("export OMP_NUM_THREADS=3\n") != std::string::npos);
  CHECK(script.find("export WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_WORLD_SIZE=2") != std::string::npos);
  CHECK(script.find("srun --export=ALL --kill-on-bad-exit=1 --ntasks=4 --ntasks-per-node=2 ") != std::string::npos);
  CHECK(script.find(" gpuq-rank 'python3' 'it'\\''s.py'\n") != std::string::npos);
  // Unmapped parts are said, not dropped silently
  auto later = *parse_job({{"command", {"t"}}, {"priority", 5}, {"retries", 2}, {"after", {7}}}, "/w");
  const std::string s2 = *sbatch_script(later, {});
  CHECK(s2.find("# It waits for: job 7") != std::string::npos);
  CHECK(s2.find("# retries: 2") != std::string::npos);
  CHECK(s2.find("# priority: 5") != std::string::npos);
  CHECK(s2.find("#SBATCH --nice") == std::string::npos);
  CHECK(s2.find("MASTER_ADDR") == std::string::npos);  // one process: no rendezvous
  CHECK(shell_quote("") == "''");
  // gpuqd's own script: its supervisor keeps the time (Slurm's limit backs it up, no warning
  // signal) and the output goes into the attempt directory
  const auto own = sbatch_options(spec, o, {"/s/jobs/1/attempt-1/slurm.out", 4});
  CHECK(std::count(own.begin(), own.end(), "--time=4") == 1);
  CHECK(std::count(own.begin(), own.end(), "--output=/s/jobs/1/attempt-1/slurm.out") == 1);
  CHECK(std::none_of(own.begin(), own.end(), [](const std::string& x) { return x.rfind("--signal", 0) == 0; }));
  CHECK(own.size() == want.size() - 1);
}

// The options sbatch reads from a script: its #SBATCH lines before the first command.
std::vector<std::string> directives(const std::string& script) {
  std::vector<std::string> out;
  std::istringstream in(script);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#SBATCH ", 0) == 0) out.push_back(line.substr(8));
    else if (!line.empty() && line[0] != '#') break;
  }
  return out;
}

TEST_CASE("slurm: a preemptible job goes with its signal; requeued by Slurm when exported and by gpuqd under it") {
  auto has = [](const std::vector<std::string>& opts, const std::string& o) {
    return std::count(opts.begin(), opts.end(), o) == 1;
  };
  auto timed =
      *parse_job({{"command", {"t"}}, {"preemptible", true}, {"preempt_signal", "USR1"}, {"timeout_s", 90}}, "/w");
  // Exported: Slurm requeues it and reruns the script (its log appended to, its attempt counted),
  // and sends the preempt signal both at preemption and before the time limit.
  auto opts = sbatch_options(timed, {});
  CHECK(has(opts, "--signal=" + std::to_string(SIGUSR1) + "@60"));
  CHECK(has(opts, "--requeue"));
  CHECK(has(opts, "--open-mode=append"));
  CHECK_FALSE(has(opts, "--signal=TERM@60"));
  CHECK(sbatch_script(timed, {})->find(" GPUQ_ATTEMPT=$((${SLURM_RESTART_COUNT:-0} + 1))\n") != std::string::npos);
  auto untimed = *parse_job({{"command", {"t"}}, {"preemptible", true}}, "/w");
  CHECK(has(sbatch_options(untimed, {}), "--signal=" + std::to_string(SIGTERM) + "@60"));
  // Under gpuqd: Slurm ends it, gpuqd puts it back in line; its supervisor gets SIGUSR1 alone.
  for (const auto& spec : {timed, untimed}) {
    const auto own = sbatch_options(spec, {}, {"/s/jobs/1/attempt-1/slurm.out", spec.timeout_s > 0 ? 4 : -1, true});
    CHECK(has(own, "--signal=B:USR1@30"));
    CHECK(has(own, "--no-requeue"));
    CHECK_FALSE(has(own, "--requeue"));
    CHECK(std::count_if(own.begin(), own.end(), [](const std::string& x) { return x.rfind("--signal", 0) == 0; }) == 1);
  }
  // Not preemptible: neither.
  auto plain = *parse_job({{"command", {"t"}}}, "/w");
  for (const auto& o : sbatch_options(plain, {}, {"/s/x", -1, true})) {
    CHECK(o.find("requeue") == std::string::npos);
    CHECK(o.rfind("--signal", 0) != 0);
  }
}

TEST_CASE("slurm: a value sbatch would split or cut is never an #SBATCH line") {
  using gpuq::common::fits_directive;
  CHECK(fits_directive("--chdir=/work/run-1"));
  CHECK(fits_directive("--constraint=a100&nvlink"));
  for (const char* bad : {"--chdir=/tmp/my project", "--chdir=/tmp/x --partition=other", "--comment=gpuq:/s#1",
                          "--chdir=/a\n#SBATCH --x=1", "--job-name=\"q\"", "--chdir=it's", "--chdir=a\\b",
                          "--chdir=a\tb", ""})
    CHECK_FALSE(fits_directive(bad));
  // A working directory that cannot be one: the script goes there itself.
  for (const std::string cwd : {"/tmp/my project", "/tmp/x --partition=other", "/work/a\n#SBATCH --x=1", "/w/#1"}) {
    auto spec = *parse_job({{"command", {"t"}}}, cwd);
    const auto opts = sbatch_options(spec, {});
    CHECK(std::count(opts.begin(), opts.end(), "--chdir=" + cwd) == 1);  // exact, for sbatch's command line
    const std::string script = *sbatch_script(spec, {});
    for (const auto& d : directives(script)) {
      CHECK(d.rfind("--chdir", 0) != 0);
      CHECK(d.find("partition") == std::string::npos);
      CHECK(d.find("--x") == std::string::npos);
    }
    CHECK(script.find("\ncd -- " + gpuq::common::shell_quote(cwd) + "\n") != std::string::npos);
  }
  // Another option that cannot be one is refused, naming it.
  auto plain = *parse_job({{"command", {"t"}}}, "/work");
  SlurmOptions nl;
  nl.partition = "gpu\n#SBATCH --qos=high";
  auto refused = sbatch_script(plain, nl);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("'--partition=gpu #SBATCH --qos=high' cannot be an #SBATCH line") != std::string::npos);
  // A spec built without parse_job, with a name that would end a comment and start a command.
  plain.env["A\ntouch /tmp/PWNED\n#"] = "x";
  auto bad_name = sbatch_script(plain, {});
  REQUIRE_FALSE(bad_name.ok());
  CHECK(bad_name.error().message.find("invalid variable name") != std::string::npos);
}
