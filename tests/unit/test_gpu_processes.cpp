// The processes on the GPUs (daemon/gpu_processes.hpp): what one look makes of NVML's lists,
// driven with lists made here (as NVML would give them, each process already told as a job's or
// not): memory outside gpuq per GPU, each running job's peak, and the notes an out-of-memory
// failure gets about processes that came or grew beside it.
#include <doctest/doctest.h>

#include "daemon/gpu_processes.hpp"

using namespace gpuq::daemon;
using Seen = GpuProcesses::Seen;
using Lists = GpuProcesses::Lists;

namespace {

struct Bench {
  boost::asio::io_context io;
  Inventory inventory{std::move(*Inventory::create("fake:2:16000", std::nullopt))};
  std::vector<GpuProcesses::Running> running{{1, 0, {0}}, {2, 0, {1}}};
  int changed = 0;
  GpuProcesses watch{io, inventory, 1.0, [this] { return running; }, [this] { ++changed; }};
  void look(const Lists& seen) { watch.observe(seen, running); }
};

const auto no_owner = [](int) { return std::string(); };

}  // namespace

TEST_SUITE_BEGIN("gpu processes");

TEST_CASE("memory held outside gpuq is summed per GPU, and a change of it is said once") {
  Bench b;
  b.look({std::vector<Seen>{{100, 500, 1}, {200, 300, 0}, {201, 200, 0}}, std::vector<Seen>{{300, 1000, 2}}});
  CHECK(b.watch.foreign_mb() == std::map<int, std::int64_t>{{0, 500}});
  CHECK(b.changed == 1);
  b.look({std::vector<Seen>{{100, 900, 1}, {200, 300, 0}, {201, 200, 0}}, std::vector<Seen>{{300, 1000, 2}}});
  CHECK(b.changed == 1);  // the same outside memory: nothing to say
  CHECK(b.watch.with_foreign_note(4000, "waits") == "waits (held outside gpuq: 500 MiB on GPU 0)");
  CHECK(b.watch.with_foreign_note(0, "waits") == "waits");  // names no memory: the note is not its
  b.look({std::vector<Seen>{}, std::nullopt});
  CHECK(b.watch.foreign_mb().empty());
  CHECK(b.changed == 2);
}

TEST_CASE("a running job's peak is its processes' most on one GPU over all looks") {
  Bench b;
  CHECK_FALSE(b.watch.peak_mb(1));
  b.look({std::vector<Seen>{{100, 500, 1}, {101, 250, 1}}, std::vector<Seen>{}});
  CHECK(b.watch.peak_mb(1) == 750);
  b.look({std::vector<Seen>{{100, 100, 1}}, std::vector<Seen>{}});
  CHECK(b.watch.peak_mb(1) == 750);
  b.running.erase(b.running.begin());  // job 1 ended: its watch goes at the next look
  b.look({std::vector<Seen>{}, std::vector<Seen>{}});
  CHECK_FALSE(b.watch.peak_mb(1));
}

TEST_CASE("an out-of-memory failure is told of processes that came or grew on its GPUs, not those there all along") {
  Bench b;
  b.look({std::vector<Seen>{{100, 1000, 1}, {500, 2000, 0}, {501, 300, 0}}, std::vector<Seen>{{600, 5000, 0}}});
  b.look({std::vector<Seen>{{100, 3000, 1}, {500, 2000, 0}, {501, 4000, 0}, {502, 7000, 0}}, std::vector<Seen>{}});
  const auto notes = b.watch.oom_notes(1, {{0, 16000}, {1, 16000}}, [](int pid) { return pid == 502 ? std::string("eve") : ""; });
  CHECK(notes == std::vector<std::string>{"its processes held up to 3000 MiB of GPU 0's 16000 MiB",
                                          "pid 501 outside gpuq grew from 300 to 4000 MiB on GPU 0",
                                          "pid 502 of eve outside gpuq came to hold 7000 MiB on GPU 0"});
  CHECK(b.watch.oom_notes(9, {}, no_owner).empty());
}

TEST_CASE("a job watches at most k_max_watched_others processes outside gpuq, however many come") {
  Bench b;
  b.look({std::vector<Seen>{{100, 10, 1}}, std::vector<Seen>{}});
  std::vector<Seen> crowd{{100, 10, 1}};
  for (int pid = 1000; pid < 1100; ++pid) crowd.push_back({pid, 1, 0});
  b.look({crowd, std::vector<Seen>{}});
  const auto notes = b.watch.oom_notes(1, {}, no_owner);
  CHECK(notes.size() == 1 + GpuProcesses::k_max_watched_others);
  b.watch.forget(1);
  CHECK(b.watch.oom_notes(1, {}, no_owner).empty());
}

TEST_SUITE_END();
