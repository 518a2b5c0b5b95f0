// The Slurm executor's gang record: one exit record made of every rank's supervisor's, each run by
// srun on its own node (gpuq-shim --slurm-task), and the paths each such supervisor writes.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "daemon/executor.hpp"
#include "supervisor/supervisor.hpp"

using gpuq::daemon::merge_task_records;
using gpuq::daemon::Outcome;
using json = nlohmann::json;

namespace {
json ok(double ended) { return {{"ranks", {{{"exit_code", 0}}}}, {"ended_at", ended}, {"cancelled", false}}; }
json failed(int code, double at) {
  return {{"ranks", {{{"exit_code", code}}}}, {"first_failure", {{"rank", 0}, {"exit_code", code}, {"at", at}}},
          {"ended_at", at + 1}};
}
json torn_down() { return {{"ranks", {json::object()}}, {"cancelled", true}, {"ended_at", 50.0}}; }
json missing() { return {{"error", "the job's supervisor ended without recording an outcome"}}; }
}  // namespace

TEST_SUITE_BEGIN("executor");

TEST_CASE("a gang's ranks all succeeding make one record of every rank's exit") {
  const json out = merge_task_records({ok(10), ok(12)});
  CHECK(out["ranks"] == json::array({{{"exit_code", 0}}, {{"exit_code", 0}}}));
  CHECK(out["ended_at"] == 12.0);
  CHECK_FALSE(out.contains("started_at"));  // none recorded one
  json early = ok(11), late = ok(12);
  early["started_at"] = 3.0;
  late["started_at"] = 4.0;
  CHECK(merge_task_records({late, early})["started_at"] == 3.0);  // the gang began with its first rank
  CHECK_FALSE(out.contains("first_failure"));
  CHECK_FALSE(out.contains("cancelled"));
  CHECK_FALSE(out.contains("error"));
}

TEST_CASE("the earliest failure is the gang's, named by its rank; the ranks torn down after it are not cancelled") {
  const json out = merge_task_records({torn_down(), failed(7, 40), failed(9, 41)});
  CHECK(out["first_failure"]["rank"] == 1);
  CHECK(out["first_failure"]["exit_code"] == 7);
  CHECK_FALSE(out.contains("cancelled"));
  CHECK(out["ranks"].size() == 3);
  CHECK(merge_task_records({failed(9, 41), failed(7, 40)})["first_failure"]["rank"] == 1);
}

TEST_CASE("timed out wins over the ranks torn down with it; a rank without a record is named; all torn down is cancelled") {
  json late = torn_down();
  late["timed_out"] = true;
  late["cancelled"] = false;
  const json timed = merge_task_records({late, torn_down()});
  CHECK(timed["timed_out"] == true);
  CHECK_FALSE(timed.contains("cancelled"));

  const json lost = merge_task_records({torn_down(), missing()});
  CHECK(lost["error"] == "rank 1: the job's supervisor ended without recording an outcome");
  CHECK_FALSE(lost.contains("cancelled"));
  CHECK(lost["ranks"][1] == json::object());

  CHECK(merge_task_records({torn_down(), torn_down()})["cancelled"] == true);
}

TEST_CASE("no rank recorded anything: the error of one missing record, as for a single supervisor") {
  CHECK(merge_task_records({missing(), missing()}) == missing());
  CHECK(merge_task_records({}).contains("error"));
}

TEST_CASE("each rank's supervisor writes files of its own beside the others'") {
  using gpuq::supervisor::task_path;
  CHECK(task_path("/s/jobs/3/attempt-1/exit.json", 2) == "/s/jobs/3/attempt-1/exit-2.json");
  CHECK(task_path("/s/jobs/3/attempt-1/shim.pid", 0) == "/s/jobs/3/attempt-1/shim-0.pid");
  CHECK(task_path("/s/a.b/record", 1) == "/s/a.b/record-1");
  CHECK(task_path("/s/.hidden", 1) == "/s/.hidden-1");
}

TEST_CASE("a state dir's filesystem: local ones are named as such, shared and unknown ones are not called local") {
  using gpuq::daemon::filesystem_kind;
  CHECK(filesystem_kind(0xEF53).name == "ext4");
  CHECK(filesystem_kind(0xEF53).local);
  CHECK(filesystem_kind(0x01021994).local);  // tmpfs
  CHECK(filesystem_kind(0x58465342).local);  // xfs
  CHECK_FALSE(filesystem_kind(0x6969).local);
  CHECK(filesystem_kind(0x6969).name == "nfs");
  CHECK_FALSE(filesystem_kind(0x0BD00BD0).local);  // lustre
  CHECK_FALSE(filesystem_kind(0x47504653).local);  // gpfs
  CHECK_FALSE(filesystem_kind(0x12345678).local);
  CHECK(filesystem_kind(0x12345678).name == "type 0x12345678");
  CHECK(filesystem_kind(static_cast<long>(static_cast<int>(0xFF534D42))).name == "cifs");  // sign-extended f_type
}

TEST_CASE("a rank's exit record lies where the job can write: one bigger than a rank's needs is not read") {
  const std::string path = "/tmp/gpuq-test-exit-" + std::to_string(::getpid()) + ".json";
  json padded = ok(5);
  padded["padding"] = std::string(gpuq::daemon::k_max_task_record, 'x');  // a valid record, too big
  std::ofstream(path) << padded.dump();
  CHECK(gpuq::daemon::read_exit_record(path, gpuq::daemon::k_max_task_record).contains("error"));
  CHECK(gpuq::daemon::read_exit_record(path)["ranks"][0]["exit_code"] == 0);  // a whole gang's may be larger
  std::ofstream(path, std::ios::trunc) << ok(5).dump();
  CHECK(gpuq::daemon::read_exit_record(path, gpuq::daemon::k_max_task_record)["ranks"][0]["exit_code"] == 0);
  std::remove(path.c_str());
}

TEST_CASE("a failure's class is taken from an exit record only when it is one gpuq gives, its line kept printable") {
  const std::string path = "/tmp/gpuq-test-class-" + std::to_string(::getpid()) + ".json";
  json rec = {{"ranks", json::array({{{"exit_code", 1}}})},
              {"first_failure", {{"rank", 0}, {"exit_code", 1}, {"class", "cuda_oom"},
                                 {"class_line", "CUDA out of memory\x1b[0m" + std::string(900, 'y')},
                                 {"message", "last"}}}};
  std::ofstream(path) << rec.dump();
  auto f = gpuq::daemon::read_exit_record(path)["first_failure"];
  CHECK(f["class"] == "cuda_oom");
  CHECK(f["class_line"].get<std::string>().rfind("CUDA out of memory[0m", 0) == 0);  // no escape byte
  CHECK(f["class_line"].get<std::string>().size() == 600);
  CHECK(f["message"] == "last");
  rec["first_failure"]["class"] = "made_up";
  std::ofstream(path, std::ios::trunc) << rec.dump();
  f = gpuq::daemon::read_exit_record(path)["first_failure"];
  CHECK_FALSE(f.contains("class"));
  CHECK_FALSE(f.contains("class_line"));
  std::remove(path.c_str());
}

TEST_CASE("a gang's Slurm job succeeds only when every rank's record says its rank succeeded") {
  // The batch script's last command (gpuq-shim --slurm-outcome): its status is the Slurm job's,
  // which --dependency=afterok reads. A timed-out or cancelled rank's supervisor exits 0 (srun
  // must not tear the others down), so srun's status cannot say it.
  const std::string dir = "/tmp/gpuq-test-outcome-" + std::to_string(::getpid());
  REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
  const std::string launch = dir + "/launch.json";
  std::ofstream(launch) << json{{"ranks", {{{"rank", 0}}, {{"rank", 1}}}},
                                {"exit_file", dir + "/exit.json"},
                                {"pid_file", dir + "/shim.pid"}}
                               .dump();
  auto write = [&](int rank, const json& record) { std::ofstream(dir + "/exit-" + std::to_string(rank) + ".json") << record.dump(); };
  using gpuq::supervisor::slurm_gang_outcome;
  json good = ok(5);
  good["timed_out"] = false;
  write(0, good);
  CHECK(slurm_gang_outcome(launch) == 1);  // rank 1 left no record
  write(1, good);
  CHECK(slurm_gang_outcome(launch) == 0);
  json timed_out = good;
  timed_out["timed_out"] = true;
  write(1, timed_out);
  CHECK(slurm_gang_outcome(launch) == 1);
  write(1, torn_down());
  CHECK(slurm_gang_outcome(launch) == 1);
  write(1, failed(7, 3));
  CHECK(slurm_gang_outcome(launch) == 1);
  json nonzero = good;
  nonzero["ranks"][0]["exit_code"] = 2;  // a record that names no failure, yet a rank that did not exit 0
  write(1, nonzero);
  CHECK(slurm_gang_outcome(launch) == 1);
  write(1, good);
  CHECK(slurm_gang_outcome(launch) == 0);
  std::ofstream(dir + "/exit-1.json") << "{not json";
  CHECK(slurm_gang_outcome(launch) == 1);
  CHECK(slurm_gang_outcome(dir + "/nonesuch.json") == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an outcome is read from an exit record once: every rank at 0 succeeds, the first failure gives the exit") {
  const Outcome ok = Outcome::from_record(json{{"ranks", {{{"rank", 0}, {"exit_code", 0}}, {{"rank", 1}, {"exit_code", 0}}}},
                                               {"started_at", 10.5}, {"ended_at", 20.25}});
  CHECK(ok.all_ok);
  CHECK(ok.exit_code == 0);
  CHECK_FALSE(ok.exit_signal);
  CHECK(ok.first_failure.is_null());
  CHECK_FALSE(ok.began_at);  // the executor's to give, where the attempt waited elsewhere
  CHECK(ok.ended_at == 20.25);
  CHECK_FALSE(ok.error);

  const Outcome killed = Outcome::from_record(
      json{{"ranks", {{{"rank", 0}, {"exit_code", 0}}, {{"rank", 1}, {"signal", 9}}}}, {"first_failure", {{"rank", 1}, {"signal", 9}}}});
  CHECK_FALSE(killed.all_ok);
  CHECK(killed.exit_signal == 9);
  CHECK_FALSE(killed.exit_code);
  CHECK(killed.first_failure["rank"] == 1);
}

TEST_CASE("an outcome's flags and words are kept only with the types gpuqd expects") {
  const Outcome o = Outcome::from_record(json{{"cancelled", true},
                                              {"timed_out", "yes"},  // not a boolean: absent
                                              {"withdrawn", true},
                                              {"final", true},
                                              {"error", "cancelled in Slurm (scancel), not through gpuq"},
                                              {"external_id", "slurm:42"},
                                              {"ended_at", "soon"},
                                              {"first_failure", "rank 1"},  // not an object: none
                                              {"ranks", {1, 2}}});          // not records: not all ok
  CHECK(o.cancelled);
  CHECK_FALSE(o.timed_out);
  CHECK(o.withdrawn);
  CHECK(o.final);
  CHECK(o.error == "cancelled in Slurm (scancel), not through gpuq");
  CHECK(o.external_id == "slurm:42");
  CHECK_FALSE(o.ended_at);
  CHECK(o.first_failure.is_null());
  CHECK_FALSE(o.all_ok);
  CHECK_FALSE(o.exit_code);
}

TEST_CASE("no record, or one that is no object, is an outcome saying so") {
  CHECK(Outcome::from_record(missing()).error == "the job's supervisor ended without recording an outcome");
  CHECK(Outcome::from_record(json::array()).error == "the job's supervisor ended without recording an outcome");
  CHECK_FALSE(Outcome::from_record(json{{"ranks", json::array()}}).all_ok);  // no rank recorded: nothing succeeded
  CHECK(Outcome::failed("disk full; not started").error == "disk full; not started");
}

TEST_CASE("the local executor places nothing itself, follows no running dependency, and has nothing to take back") {
  using gpuq::daemon::Executor;
  boost::asio::io_context io;
  int ended = 0;
  auto local = gpuq::daemon::make_local_executor(io, "/nonexistent/gpuq-shim", [&](std::int64_t) { ++ended; });
  CHECK_FALSE(local->places_work());
  const auto first = [](const gpuq::daemon::PendingJob&) -> std::optional<Executor::Attempt> { return std::nullopt; };
  CHECK_FALSE(local->place({gpuq::daemon::PendingJob{1}}, {}, first));  // gpuqd's scheduler places it
  CHECK_FALSE(local->follows(1));
  local->withdraw(1);  // asked of every executor where a running job's dependency will not succeed
  local->set_array_limit({1}, 2);
  io.run();
  CHECK(ended == 0);  // nothing ended: nothing of it was taken back
}
