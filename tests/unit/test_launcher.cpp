// Launch environment: torchrun's contract for ddp ranks, GPU visibility, user env precedence.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "common/paths.hpp"
#include "common/process.hpp"
#include "daemon/launcher.hpp"
#include "temp_dir.hpp"

using namespace gpuq::daemon;

namespace {
JobRecord ddp_job() {
  JobRecord j;
  j.id = 42;
  j.attempt = 2;
  j.run.gpus = {1, 3};
  j.run.master_port = 29555;
  j.spec.name = "gang";
  j.spec.command = {"python3", "train.py"};
  j.spec.mode = gpuq::common::Mode::ddp;
  j.spec.gpus = 2;
  j.spec.ranks = 2;
  j.spec.retries = 3;
  j.spec.cwd = "/work";
  j.spec.env = {{"HOME", "/spec-home"}, {"EXTRA", "1"}};
  return j;
}
}  // namespace

TEST_SUITE_BEGIN("launcher");

TEST_CASE("each ddp rank gets a consistent torchrun environment") {
  auto job = ddp_job();
  for (int rank = 0; rank < 2; ++rank) {
    auto env = rank_environment(job, {{"HOME", "/submitter"}, {"PATH", "/bin"}}, {"GPU-b", "GPU-d"}, "/s/jobs/42",
                                "/s/jobs/42/attempt-2", rank);
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["LOCAL_RANK"] == std::to_string(rank));
    CHECK(env["WORLD_SIZE"] == "2");
    CHECK(env["LOCAL_WORLD_SIZE"] == "2");
    CHECK(env["GROUP_RANK"] == "0");
    CHECK(env["ROLE_RANK"] == std::to_string(rank));
    CHECK(env["MASTER_ADDR"] == "127.0.0.1");
    CHECK(env["MASTER_PORT"] == "29555");
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "1");  // second attempt = first restart
    CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "3");
    CHECK(env["TORCHELASTIC_RUN_ID"] == "gpuq-42");
    CHECK(env["CUDA_VISIBLE_DEVICES"] == "1,3");
    CHECK(env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID");
    CHECK(env["GPUQ_GPU_UUIDS"] == "GPU-b,GPU-d");
    CHECK(env["GPUQ_EVENTS"] == "/s/jobs/42/attempt-2/events-" + std::to_string(rank) + ".jsonl");
    CHECK(env["GPUQ_JOB_ID"] == "42");
    CHECK(env["GPUQ_ATTEMPT"] == "2");
    CHECK(env["OMP_NUM_THREADS"] == "1");
    CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");     // the name torch read before 2.2
    CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");  // rank 0 hosts the store: no agent
    CHECK(env["HOME"] == "/spec-home");  // spec env wins over the submitter's
    CHECK(env["PATH"] == "/bin");
  }
}

TEST_CASE("a gang over two nodes: ranks lie in node order, as srun's block distribution lays them") {
  auto job = ddp_job();
  job.spec.gpus = job.spec.ranks = 4;
  job.spec.nodes = 2;
  for (int rank = 0; rank < 4; ++rank) {
    auto env = rank_environment(job, {}, {}, "/s/jobs/42", "/s/jobs/42/attempt-2", rank);
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["LOCAL_RANK"] == std::to_string(rank % 2));
    CHECK(env["GROUP_RANK"] == std::to_string(rank / 2));
    CHECK(env["WORLD_SIZE"] == "4");
    CHECK(env["LOCAL_WORLD_SIZE"] == "2");
    CHECK(env["GROUP_WORLD_SIZE"] == "2");
  }
}

TEST_CASE("independent jobs get no torchrun variables, and CPU jobs see no GPU") {
  JobRecord j;
  j.id = 1;
  j.attempt = 1;
  j.spec.command = {"true"};
  auto env = rank_environment(j, {{"OMP_NUM_THREADS", "8"}}, {}, "/j", "/j/attempt-1", 0);
  CHECK(env.count("RANK") == 0);
  CHECK(env.count("MASTER_PORT") == 0);
  CHECK(env["CUDA_VISIBLE_DEVICES"] == "");
  CHECK(env["OMP_NUM_THREADS"] == "8");
  CHECK(env.count("GPUQ_GPU_MEMORY_MB") == 0);  // no declared share: the whole GPU
  j.spec.gpus = 1;
  j.spec.shared = true;
  j.spec.gpu_memory_mb = 6000;
  j.run.gpus = {2};
  CHECK(rank_environment(j, {}, {"GPU-c"}, "/j", "/j/attempt-1", 0)["GPUQ_GPU_MEMORY_MB"] == "6000");
}

TEST_CASE("the launch document has one entry per rank with its own log and events file") {
  auto job = ddp_job();
  auto doc = launch_document(job, {}, {"GPU-b", "GPU-d"}, "/s", 7.5);
  REQUIRE(doc["ranks"].size() == 2);
  CHECK(doc["ranks"][1]["log"] == "/s/jobs/42/attempt-2/rank-1.log");
  CHECK(doc["ranks"][1]["env"]["RANK"] == "1");
  CHECK(doc["grace_s"] == 7.5);
  CHECK(doc["exit_file"] == "/s/jobs/42/attempt-2/exit.json");
}

TEST_CASE("the launch document says whose environment the ranks start from and as whom they run") {
  auto job = ddp_job();
  const auto plain = launch_document(job, {}, {"GPU-b", "GPU-d"}, "/s", 7.5);
  CHECK_FALSE(plain.contains("inherit_env"));
  CHECK_FALSE(plain.contains("run_as"));
  CHECK(plain["ranks"][1]["env"]["MASTER_PORT"] == "29555");
  CHECK(plain["ranks"][1]["env"]["HOME"] == "/spec-home");

  // Another system runs the ranks (Slurm): it names the GPUs and the rendezvous, not gpuq.
  auto doc = launch_document(job, {}, {"GPU-b", "GPU-d"}, "/s", 7.5, 0, {}, {}, {true, nullptr});
  CHECK(doc["inherit_env"] == true);
  for (const auto& rank : doc["ranks"]) {
    for (const char* name : {"CUDA_VISIBLE_DEVICES", "GPUQ_GPU_UUIDS", "MASTER_ADDR", "MASTER_PORT"})
      CHECK_FALSE(rank["env"].contains(name));
    CHECK(rank["env"]["RANK"].is_string());  // the rest of gpuq's environment stays
  }

  // Lab mode: the job's owner, with their login variables over the spec's own.
  const gpuq::common::Account ada{1234, 1234, "ada", "/home/ada", "/bin/zsh", {1234, 27}};
  doc = launch_document(job, {}, {"GPU-b", "GPU-d"}, "/s", 7.5, 0, {}, {}, {false, &ada});
  CHECK(doc["run_as"] == nlohmann::json{{"uid", 1234}, {"gid", 1234}, {"groups", {1234, 27}}, {"user", "ada"}});
  CHECK_FALSE(doc.contains("inherit_env"));
  for (const auto& rank : doc["ranks"]) {
    CHECK(rank["env"]["HOME"] == "/home/ada");
    CHECK(rank["env"]["USER"] == "ada");
    CHECK(rank["env"]["LOGNAME"] == "ada");
    CHECK(rank["env"]["SHELL"] == "/bin/zsh");
    CHECK(rank["env"]["EXTRA"] == "1");
    CHECK(rank["env"]["MASTER_PORT"] == "29555");
  }
}

TEST_CASE("a `cpus` job's ranks are pinned to their own share of the job's slots, mapped to cores") {
  auto job = ddp_job();  // 2 ranks
  job.spec.cpus = 2;
  job.run.cpu_slots = {2, 3, 4, 5};
  const std::vector<int> cores{0, 1, 8, 9, 10, 11};  // slot s -> cores[s % 6]
  CHECK(rank_cores(job, cores) == std::vector<std::vector<int>>{{8, 9}, {10, 11}});
  auto doc = launch_document(job, {{"OMP_NUM_THREADS", "64"}}, {"GPU-b", "GPU-d"}, "/s", 7.5, 0, cores);
  CHECK(doc["ranks"][0]["cpus"] == nlohmann::json({8, 9}));
  CHECK(doc["ranks"][1]["cpus"] == nlohmann::json({10, 11}));
  CHECK(doc["ranks"][1]["env"]["GPUQ_CPUS"] == "10-11");
  CHECK(doc["ranks"][1]["env"]["OMP_NUM_THREADS"] == "2");  // over the submitter's, and ddp's 1

  // The spec's own OMP_NUM_THREADS still wins.
  job.spec.env["OMP_NUM_THREADS"] = "3";
  CHECK(rank_environment(job, {}, {}, "/j", "/j/a", 0, {8, 9})["OMP_NUM_THREADS"] == "3");

  // Fewer slots than asked (a job wider than the pool): ranks wrap around and share them.
  job.run.cpu_slots = {0, 1, 2};
  CHECK(rank_cores(job, cores) == std::vector<std::vector<int>>{{0, 1}, {0, 8}});
  // More slots than cores (an oversubscribed pool): a rank's slots may land on one core.
  job.run.cpu_slots = {5, 11};
  job.spec.mode = gpuq::common::Mode::independent;
  CHECK(rank_cores(job, cores) == std::vector<std::vector<int>>{{11}});

  // Without `cpus`: no pinning, even with slots (a CPU job's default one per rank).
  job.spec.cpus = 0;
  CHECK(rank_cores(job, cores).empty());
  auto plain = launch_document(job, {}, {}, "/s", 7.5, 0, cores);
  CHECK_FALSE(plain["ranks"][0].contains("cpus"));
  CHECK_FALSE(plain["ranks"][0]["env"].contains("GPUQ_CPUS"));
}

TEST_CASE("a job without `cpus` gets its share of the cores as OMP_NUM_THREADS, unless it or its submitter set one") {
  gpuq::common::JobSpec s;
  s.gpus = 1;
  CHECK(omp_share(s, 16, 4, 80000) == 4);  // a quarter of the GPUs: a quarter of the cores
  s.gpus = 2;
  CHECK(omp_share(s, 16, 4, 80000) == 8);
  s.mode = gpuq::common::Mode::ddp, s.ranks = 2;
  CHECK(omp_share(s, 16, 4, 80000) == 4);  // per rank: one GPU each
  s = {};
  s.gpus = 1, s.shared = true, s.gpu_memory_mb = 20000;
  CHECK(omp_share(s, 16, 1, 80000) == 4);  // a quarter of the one GPU's memory: a quarter of its cores
  CHECK(omp_share(s, 2, 4, 80000) == 1);   // at least one
  s.gpus = 0;
  CHECK(omp_share(s, 16, 4, 80000) == 1);  // a CPU job holds one slot a rank
  s.cpus = 4;
  CHECK(omp_share(s, 16, 4, 80000) == 0);  // pinned: its own cores say (rank_environment)

  JobRecord job;
  job.id = 7, job.attempt = 1;
  job.spec.command = {"python3", "train.py"};
  job.spec.gpus = 1;
  job.run.gpus = {2};
  RunsAs runs;
  runs.omp_threads = 4;
  CHECK(launch_document(job, {}, {"GPU-c"}, "/s", 7.5, 0, {}, {}, runs)["ranks"][0]["env"]["OMP_NUM_THREADS"] == "4");
  CHECK(launch_document(job, {{"OMP_NUM_THREADS", "6"}}, {"GPU-c"}, "/s", 7.5, 0, {}, {},
                        runs)["ranks"][0]["env"]["OMP_NUM_THREADS"] == "6");  // the submitter's own
  job.spec.env["OMP_NUM_THREADS"] = "2";
  CHECK(launch_document(job, {}, {"GPU-c"}, "/s", 7.5, 0, {}, {}, runs)["ranks"][0]["env"]["OMP_NUM_THREADS"] == "2");
}

TEST_CASE("with `mem_bind`, each rank's entry names the NUMA nodes of its own cores") {
  auto job = ddp_job();  // 2 ranks
  job.spec.cpus = 2;
  job.spec.mem_bind = gpuq::common::MemBind::local;
  job.run.cpu_slots = {0, 1, 2, 3};
  const std::vector<int> cores{0, 1, 8, 9}, nodes{0, 0, 1, 1};
  auto doc = launch_document(job, {}, {}, "/s", 7.5, 0, cores, nodes);
  CHECK(doc["ranks"][0]["mem_bind"] == nlohmann::json({{"policy", "local"}, {"nodes", {0}}}));
  CHECK(doc["ranks"][1]["mem_bind"] == nlohmann::json({{"policy", "local"}, {"nodes", {1}}}));

  // A rank whose cores straddle two nodes is bound to both.
  job.run.cpu_slots = {1, 2, 0, 3};
  job.spec.mem_bind = gpuq::common::MemBind::prefer;
  doc = launch_document(job, {}, {}, "/s", 7.5, 0, cores, nodes);
  CHECK(doc["ranks"][0]["mem_bind"] == nlohmann::json({{"policy", "prefer"}, {"nodes", {0, 1}}}));

  // Nodes unknown (no sysfs, or fewer nodes than cores): no nodes, so the shim says it cannot bind.
  doc = launch_document(job, {}, {}, "/s", 7.5, 0, cores, {});
  CHECK(doc["ranks"][0]["mem_bind"]["nodes"].empty());
  CHECK(numa_nodes_of({0, 8}, cores, {0, -1, 1, 1}) == std::vector<int>{0, 1});
  CHECK(numa_nodes_of({1, 8}, cores, {0, -1, 1, 1}).empty());
  CHECK(numa_nodes_of({5}, cores, nodes).empty());  // a core outside the pool

  // No `mem_bind`, or no pinned cores: nothing for the shim to do.
  job.spec.mem_bind = gpuq::common::MemBind::none;
  CHECK_FALSE(launch_document(job, {}, {}, "/s", 7.5, 0, cores, nodes)["ranks"][0].contains("mem_bind"));
  job.spec.mem_bind = gpuq::common::MemBind::local;
  job.spec.cpus = 0;
  CHECK_FALSE(launch_document(job, {}, {}, "/s", 7.5, 0, cores, nodes)["ranks"][0].contains("mem_bind"));
}

TEST_CASE("a job's cores give back its slots under another CPU mask, and none for cores outside it") {
  JobRecord job;
  job.spec.mode = gpuq::common::Mode::ddp;
  job.spec.ranks = 2;
  job.spec.cpus = 1;
  job.run.cpu_slots = {0, 1};
  const std::vector<int> before{2, 3, 4, 5};  // launched under taskset -c 2-5: slots 0, 1 are cores 2, 3
  CHECK(job_cores(job, before) == std::vector<int>{2, 3});
  // Restarted under 0-5: slots 0 and 1 are now cores 0 and 1, but the job runs on 2 and 3.
  const std::vector<int> after{0, 1, 2, 3, 4, 5};
  CHECK(job_cores(job, after) != job_cores(job, before));
  CHECK(slots_on_cores({2, 3}, after, 6) == std::vector<int>{2, 3});
  // Restarted under 3-4: core 2 is outside the pool; core 3 is slot 0.
  CHECK(slots_on_cores({2, 3}, {3, 4}, 2) == std::vector<int>{0});
  // An oversubscribed pool (8 slots on 4 cores): every slot on the job's cores is held.
  CHECK(slots_on_cores({2, 3}, before, 8) == std::vector<int>{0, 1, 4, 5});
  CHECK(slots_on_cores({2, 3}, {}, 4).empty());
}

TEST_CASE("gpuqd's usable cores are this process's affinity mask") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  auto cores = usable_cores();
  CHECK(static_cast<int>(cores.size()) == CPU_COUNT(&set));
  for (int c : cores) CHECK(CPU_ISSET(c, &set));
  CHECK(std::is_sorted(cores.begin(), cores.end()));
}

TEST_CASE("executables resolve like execvp") {
  CHECK(resolve_executable("sh", "/nonexistent:/bin", "/") == "/bin/sh");
  CHECK(resolve_executable("/bin/sh", "", "/") == "/bin/sh");
  CHECK(resolve_executable("no-such-program-xyz", "/bin:/usr/bin", "/") == "");
  std::string plain = "/tmp/gpuq-unit-plain-" + std::to_string(::getpid());
  { std::ofstream(plain) << "data\n"; }
  CHECK(resolve_executable(plain, "", "/") == "");  // a regular file without execute bits
  ::unlink(plain.c_str());
}

TEST_CASE("atomic writes replace the file whole") {
  std::string path = "/tmp/gpuq-unit-atomic-" + std::to_string(::getpid());
  REQUIRE(write_file_atomic(path, "first").ok());
  REQUIRE(write_file_atomic(path, "second").ok());
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "second");
  ::unlink(path.c_str());
  CHECK_FALSE(write_file_atomic("/nonexistent-dir/x", "y").ok());
}

TEST_CASE("create_file_once makes a file whole where there is none, and leaves what is there as it was") {
  const std::string path = "/tmp/gpuq-unit-once-" + std::to_string(::getpid());
  const auto text = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto made = gpuq::common::create_file_once(path, "first");
  REQUIRE(made.ok());
  CHECK(*made);
  made = gpuq::common::create_file_once(path, "second");
  REQUIRE(made.ok());
  CHECK_FALSE(*made);
  CHECK(text(path) == "first");
  ::unlink(path.c_str());
  // A dangling symlink at the name is something there: not followed, not replaced.
  const std::string target = path + "-target";
  REQUIRE(::symlink(target.c_str(), path.c_str()) == 0);
  made = gpuq::common::create_file_once(path, "third");
  REQUIRE(made.ok());
  CHECK_FALSE(*made);
  CHECK_FALSE(gpuq::common::path_exists(target));
  ::unlink(path.c_str());
  CHECK_FALSE(gpuq::common::path_exists(path + ".tmp." + std::to_string(::getpid())));  // no temporary left
  CHECK_FALSE(gpuq::common::create_file_once("/nonexistent-dir/x", "y").ok());          // an error, not "there"
}

TEST_CASE("a process is identified by pid and start time, so a reused pid does not match") {
  auto st = process_start_time(::getpid());
  REQUIRE(st.has_value());
  CHECK(is_alive({::getpid(), *st}));
  CHECK_FALSE(is_alive({::getpid(), *st + 1}));
  CHECK_FALSE(is_alive({0x3fffffff, 1}));

  // A process that has exited is not alive while its parent has not collected it (a zombie).
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT) == 0);  // exited, not reaped
  const auto child_start = process_start_time(child);
  REQUIRE(child_start.has_value());
  CHECK_FALSE(is_alive({child, *child_start}));
  ::waitpid(child, nullptr, 0);
}

TEST_CASE("free ports are real and avoid ports already handed out") {
  int a = pick_free_port({});
  REQUIRE(a > 0);
  int b = pick_free_port({a});
  CHECK(b > 0);
  CHECK(b != a);
}

TEST_SUITE_END();

TEST_CASE("a supervisors' server that ends without answering is tried once more, then rests") {
  // A gpuq-shim that ends at once, as a server that died (or an older gpuq-shim without --serve)
  // would, counting its starts. The start fails (gpuqd then execs the supervisor) after one more
  // server was tried; the next start within k_rest_s tries none.
  gpuq::testing::TempDir dir("gpuq-server");
  const std::string shim = dir.path + "/gpuq-shim", starts = dir.path + "/starts";
  std::ofstream(shim) << "#!/bin/sh\necho \"$1\" >> " << starts << "\nexit 2\n";
  REQUIRE(::chmod(shim.c_str(), 0755) == 0);
  SupervisorServer server(shim);
  auto started = server.start("/nonexistent/attempt-1");
  REQUIRE_FALSE(started);
  CHECK(started.error().code == gpuq::ErrorCode::unavailable);
  CHECK(started.error().message.find("supervisors' server") != std::string::npos);
  CHECK(server.pid() == 0);
  auto lines = [&] {
    std::ifstream in(starts);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return all;
  };
  CHECK(lines() == "--serve\n--serve\n");
  CHECK_FALSE(server.start("/nonexistent/attempt-2"));
  CHECK(lines() == "--serve\n--serve\n");
}
