// One scheduling pass over a deep queue, alone: how much of gpuqd's CPU per job the pure
// scheduler takes as the queue grows. Not built by default: `ninja -C build gpuq-bench-schedule`,
// then `build/bin/gpuq-bench-schedule [N…]` (default 4000 16000 64000).
//
// Two queues of N one-GPU jobs behind 8 GPUs that running jobs hold:
//   deep       no limit: the pass stops at the first job (every GPU held and reserved);
//   throttled  one batch at its --max-running 8: the pass goes over every job and starts none.
// A job's end triggers one pass, so a pass's time divided by nothing is what each ended job costs.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "daemon/scheduler.hpp"

using namespace gpuq::daemon;

namespace {

double best_us(const std::vector<PendingJob>& queue, const BatchLimits& limits) {
  std::vector<GpuState> gpus;
  for (int g = 0; g < 8; ++g) gpus.push_back({g, 81920, 81920, 0, 1, true, k_never, -1});
  CpuSlots cpu;
  cpu.total = 16;
  double best = 1e18;
  for (int rep = 0; rep < 5; ++rep) {
    const int passes = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < passes; ++k) {
      const Plan plan = schedule(queue, gpus, 0, cpu, true, limits);  // the queue is copied, as gpuqd builds it
      if (!plan.start.empty()) std::abort();  // nothing can start: every GPU is held
    }
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                              passes);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {4000, 16000, 64000};
  std::printf("| queued jobs | deep: one pass | throttled: one pass | throttled, per queued job |\n|---|---|---|---|\n");
  for (int n : sizes) {
    std::vector<PendingJob> queue;
    for (int i = 0; i < n; ++i) {
      PendingJob j;
      j.id = 100 + i;
      j.gpus = 1;
      j.batch = 1;
      queue.push_back(j);
    }
    const double deep = best_us(queue, {});
    const double throttled = best_us(queue, {{1, {8, 8}}});
    std::printf("| %d | %.1f µs | %.0f µs | %.1f ns |\n", n, deep, throttled, throttled * 1000 / n);
  }
}
