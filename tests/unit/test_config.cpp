// Configuration file parsing and the environment's precedence over it.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include "common/config.hpp"
#include "daemon/options.hpp"

using namespace gpuq::common;

TEST_SUITE_BEGIN("config");

TEST_CASE("a configuration file's settings, with ~ expanded and sources recorded") {
  const char* home = std::getenv("HOME");
  const std::string saved = home ? home : "";
  ::setenv("HOME", "/home/u", 1);
  auto s = parse_settings(R"({"socket": "~/q.sock", "state_dir": "/srv/gpuq", "gpus": "fake:2", "retries": 3,
                              "log_limit_mb": 0, "grace_s": 2.5, "cpu_slots": 4, "health_interval_s": 15,
                              "forget_after_s": 604800, "gpu_process_interval_s": 0.5,
                              "on_finish": ["notify-send", "done"], "hook_timeout_s": 30})",
                          "/etc/c.json");
  REQUIRE(s.ok());
  CHECK(s->socket_path == "/home/u/q.sock");
  CHECK(s->state_dir == "/srv/gpuq");
  CHECK(s->gpus == "fake:2");
  CHECK(s->default_retries == 3);
  CHECK(s->log_limit_mb == 0);
  CHECK(s->grace_s == 2.5);
  CHECK(s->cpu_slots == 4);
  CHECK(s->health_interval_s == 15);
  CHECK(s->forget_after_s == 604800);
  CHECK(s->gpu_process_interval_s == 0.5);
  CHECK(s->on_finish == std::vector<std::string>{"notify-send", "done"});
  CHECK(s->hook_timeout_s == 30);
  CHECK_FALSE(s->has("idle_timeout_s"));
  CHECK(s->idle_timeout_s == 300);  // the default, not given
  CHECK(s->source.at("retries") == "/etc/c.json");
  if (home) ::setenv("HOME", saved.c_str(), 1);
  else ::unsetenv("HOME");
}

TEST_CASE("bad settings are refused with the key and the rule") {
  auto check = [](const char* text, const char* message) {
    auto s = parse_settings(text, "c.json");
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find(message) != std::string::npos);
    CHECK(s.error().message.rfind("c.json: ", 0) == 0);
  };
  check(R"({"retries": 1.5})", "`retries` must be an integer from 0 to 100");
  check(R"({"retries": "2"})", "`retries` must be an integer");
  check(R"({"grace_s": -1})", "`grace_s` must be a number from 0 to 86400");
  check(R"({"health_interval_s": -1})", "`health_interval_s` must be a number from 0 to 86400");
  check(R"({"gpu_process_interval_s": "5"})", "`gpu_process_interval_s` must be a number from 0 to 86400");
  check(R"({"on_finish": "notify-send"})", "`on_finish` must be a non-empty array of strings, a command as a job's `command`");
  check(R"({"on_finish": [""]})", "`on_finish` must be a non-empty array of strings, a command as a job's `command`");
  check(R"({"hook_timeout_s": 0})", "`hook_timeout_s` must be a number from 1 to 86400");
  check(R"({"forget_after_s": "7d"})", "`forget_after_s` must be a number from 0 to 316224000");
  check(R"({"gpus": ""})", "`gpus` must be a non-empty string");
  check(R"({"state_dir": "state"})", "must be an absolute path");
  check(R"({"colour": "red"})", "unknown setting `colour`; known: socket");
  check(R"({"a": 1e999})", "not valid JSON");
  check("[]", "must be a JSON object");
}

TEST_CASE("lab mode's settings: the admin group, per-user limits, fair share's half-life, the priority ceiling") {
  auto s = parse_settings(R"({"multi_user": true, "admin_group": "gpu-admins", "socket_group": "gpu-users",
                              "user_limits": {"*": {"max_gpus": 4, "max_queued": 1000}, "alice": {"max_running": 8}},
                              "usage_half_life_s": 86400, "max_priority": 10})",
                          "lab.json");
  REQUIRE(s.ok());
  CHECK(s->multi_user == true);
  CHECK(s->admin_group == "gpu-admins");
  CHECK(s->socket_group == "gpu-users");
  REQUIRE(s->has("user_limits"));
  CHECK(s->user_limits.at("*").max_gpus == 4);
  CHECK(s->user_limits.at("*").max_queued == 1000);
  CHECK(s->user_limits.at("alice").max_running == 8);
  CHECK(s->user_limits.at("alice").max_gpus == 0);  // not named: no limit (a user's own entry replaces "*")
  CHECK(s->usage_half_life_s == 86400);
  CHECK(s->max_priority == 10);
  auto bad = [](const char* text, const char* message) {
    auto r = parse_settings(text, "lab.json");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find(message) != std::string::npos);
  };
  bad(R"({"multi_user": "yes"})", "`multi_user` must be true or false");
  bad(R"({"user_limits": {"bob": {"max_gpu": 2}}})", "unknown limit `user_limits.bob.max_gpu`; known: max_running");
  bad(R"({"user_limits": {"bob": {"max_gpus": -1}}})", "`user_limits.bob.max_gpus` must be a whole number from 0");
  bad(R"({"user_limits": [1]})", "`user_limits` must be an object of user names");
  bad(R"({"usage_half_life_s": 1})", "`usage_half_life_s` must be a number from 60");
}

TEST_CASE("the environment overrides the file, and a bad variable is named") {
  auto s = parse_settings(R"({"gpus": "fake:2", "retries": 1})", "c.json");
  REQUIRE(s.ok());
  ::setenv("GPUQ_GPUS", "none", 1);
  ::setenv("GPUQ_RETRIES", "", 1);  // empty: no override
  REQUIRE(apply_environment(*s).ok());
  CHECK(s->gpus == "none");
  CHECK(s->source.at("gpus") == "$GPUQ_GPUS");
  CHECK(s->default_retries == 1);
  ::setenv("GPUQ_RETRIES", "7x", 1);
  auto bad = apply_environment(*s);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "$GPUQ_RETRIES: must be an integer from 0 to 100");
  ::unsetenv("GPUQ_GPUS");
  ::unsetenv("GPUQ_RETRIES");
}

TEST_CASE("the executor and its Slurm options come from the file; a wrong one names the key") {
  auto s = parse_settings(R"({"executor": "slurm", "slurm": {"partition": "gpu", "account": "lab", "qos": "normal",
                              "extra_args": ["--constraint=a100", "--mail-type=END"]}})",
                          "/etc/c.json");
  REQUIRE(s.ok());
  CHECK(s->executor == "slurm");
  REQUIRE(s->has("slurm"));
  CHECK(s->slurm.partition == "gpu");
  CHECK(s->slurm.account == "lab");
  CHECK(s->slurm.qos == "normal");
  CHECK(s->slurm.extra_args == std::vector<std::string>{"--constraint=a100", "--mail-type=END"});
  CHECK(s->source.at("slurm") == "/etc/c.json");
  auto refused = [](const std::string& text, const std::string& why) {
    auto r = parse_settings(text, "/etc/c.json");
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(r.error().message.find(why) != std::string::npos, r.error().message);
  };
  refused(R"({"executor": "kubernetes"})", "`executor` must be \"local\"");
  refused(R"({"slurm": "gpu"})", "`slurm` must be an object");
  refused(R"({"slurm": {"partition": "a b"}})", "`slurm.partition` must be a Slurm name");
  refused(R"({"slurm": {"extra_args": ["rm -rf /"]}})", "`slurm.extra_args` holds sbatch options");
  refused(R"({"slurm": {"extra_args": ["--x\n#SBATCH --y"]}})", "`slurm.extra_args` holds sbatch options");
  refused(R"({"slurm": {"nodes": 2}})", "unknown setting `slurm.nodes`");
}

TEST_CASE("every key of the one table is parsed, shown by `gpuq config`, named in the known keys and in docs/cli.md") {
  // Nothing here lists the keys: a key added to the table is checked as it is. For each, the
  // first of these values it takes must come back, alone, from settings_json (what `gpuq config`
  // prints), so a key wired to another's member, or not shown, fails.
  const std::vector<nlohmann::json> candidates{60,
                                               3600,
                                               "/tmp/x",
                                               "local",
                                               "flag",
                                               "spread",
                                               "fair_share",
                                               "warn",
                                               true,
                                               nlohmann::json::array({"x"}),
                                               nlohmann::json::object()};
  std::ifstream doc(GPUQ_SOURCE_DIR "/docs/cli.md");
  const std::string cli_md((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  REQUIRE_FALSE(cli_md.empty());
  const auto unknown = parse_settings(R"({"nonesuch": 1})", "f");
  REQUIRE_FALSE(unknown.ok());
  const auto keys = setting_keys();
  CHECK(keys.size() >= 28);
  for (const auto& k : keys) {
    CAPTURE(k.key);
    bool taken = false;
    for (const auto& v : candidates) {
      auto s = parse_settings(nlohmann::json{{k.key, v}}.dump(), "/etc/gpuq.json");
      if (!s.ok()) continue;
      taken = true;
      const auto shown = settings_json(*s);
      CHECK(shown.size() == 1);
      REQUIRE(shown.contains(k.key));
      CHECK(shown[k.key]["from"] == "/etc/gpuq.json");
      if (!v.is_object()) CHECK(shown[k.key]["value"] == v);
      break;
    }
    CHECK(taken);
    CHECK(unknown.error().message.find(k.key) != std::string::npos);
    // docs/cli.md's configuration table: a row for the key, its variable and gpuqd's option next
    const std::string row = "| `" + k.key + "` | " + (k.variable.empty() ? "" : "`" + k.variable + "` ") + "|" +
                            (k.option.empty() ? "" : " `" + k.option + "` |");
    CHECK_MESSAGE(cli_md.find(row) != std::string::npos, "docs/cli.md has no row " << row);
  }
}

TEST_CASE("gpuqd's options are the table's: each sets its key through the key's rule, named as the option") {
  // Nothing here lists the options: every key of the table that names one is tried with the first
  // of these texts its rule takes, which must land in that key alone, with the option as source.
  const std::vector<std::string> texts{"90", "2h", "/tmp/x", "slurm", "retry", "spread", "fair_share", "warn", "g"};
  Settings defaults;
  std::size_t options = 0;
  for (const auto& k : setting_keys()) {
    if (k.option.empty()) continue;
    CAPTURE(k.option);
    ++options;
    bool taken = false;
    for (const auto& text : k.value_name.empty() ? std::vector<std::string>{""} : texts) {
      Settings s;
      CLI::App app;
      gpuq::daemon::add_setting_options(app, s);
      std::vector<std::string> argv{k.option};  // CLI11 parses a reversed vector
      if (!k.value_name.empty()) argv.insert(argv.begin(), text);
      try {
        app.parse(argv);
      } catch (const CLI::ParseError&) {
        continue;
      }
      taken = true;
      CHECK(s.source == std::map<std::string, std::string>{{k.key, k.option}});
      CHECK(setting_value(s, k.key) != setting_value(defaults, k.key));
      CHECK(app.help().find(k.option) != std::string::npos);
      break;
    }
    CHECK(taken);
  }
  CHECK(options >= 23);

  // A value the file's rule refuses is refused on the command line, saying so.
  Settings s;
  CLI::App app;
  gpuq::daemon::add_setting_options(app, s);
  auto refusal = [&](std::vector<std::string> argv) -> std::string {
    try {
      app.parse(argv);
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(refusal({"-1", "--grace"}) == "--grace: must be a number from 0 to 86400");
  CHECK(refusal({"2x", "--default-retries"}) == "--default-retries: must be an integer from 0 to 100");
  CHECK(refusal({"7x", "--forget-after"}) == "--forget-after: 7x is not a duration like 90s, 30m, 12h, 7d or 2w");
  CHECK(refusal({"state", "--state-dir"}).find("--state-dir: must be an absolute path") == 0);
  CHECK(refusal({"k8s", "--executor"}).find("--executor: must be \"local\"") == 0);
  CHECK(refusal({"--multi-user=maybe"}) == "--multi-user: must be true or false");
  CHECK(refusal({"0x10", "--grace"}) == "--grace: must be a number from 0 to 86400");
  CHECK(refusal({" 5", "--grace"}) == "--grace: must be a number from 0 to 86400");
  CHECK(refusal({"", "--forget-after"}) == "--forget-after: \"\" is not a duration like 90s, 30m, 12h, 7d or 2w");
  CHECK(s.source.empty());
  // A duration's unit, and the option over what the file said.
  auto file = parse_settings(R"({"forget_after_s": 60, "grace_s": 5})", "/etc/gpuq.json");
  REQUIRE(file.ok());
  CLI::App app2;
  gpuq::daemon::add_setting_options(app2, *file);
  CHECK(app2.help().find("[5]") != std::string::npos);  // the value in effect, shown as the default
  app2.parse(std::vector<std::string>{"12h", "--forget-after"});
  CHECK(file->forget_after_s == 43200);
  CHECK(file->source.at("forget_after_s") == "--forget-after");
  CHECK(file->grace_s == 5);
  CHECK(file->source.at("grace_s") == "/etc/gpuq.json");
  // A flag given false turns off what the file turned on.
  auto lab = parse_settings(R"({"multi_user": true})", "/etc/gpuq.json");
  REQUIRE(lab.ok());
  CLI::App app3;
  gpuq::daemon::add_setting_options(app3, *lab);
  app3.parse(std::vector<std::string>{"--multi-user=false"});
  CHECK_FALSE(lab->multi_user);
  CHECK(lab->source.at("multi_user") == "--multi-user");
}
