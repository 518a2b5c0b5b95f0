// Live progress for `gpuq wait` and `gpuq submit --wait`: one line per job built from its last
// progress event (a bar when the fraction done is known, epoch/step, loss, samples/s, ETA).
// Pure functions of a JobInfo and the time, unit-tested; the redraw loop lives in commands.cpp.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/protocol.hpp"

namespace gpuq::cli {

// The fraction of the job done, from its progress event: step/total_steps, else
// epoch/epochs; none when the event carries neither total.
std::optional<double> fraction_done(const nlohmann::json& progress);

// A running job's progress: "[######------]  52%  epoch 3/10  step 1400  loss 0.412  2.1k samples/s
// ETA 3m10s  4m02s" (a bar `bar` wide when the fraction done is known; the last time is the runtime).
std::string progress_text(const common::JobInfo& job, double now, int bar);

// "12  mnist  [######------]  52%  epoch 3/10  step 1400  loss 0.412  2.1k samples/s  ETA 3m10s"
// for a running job; the state and reason (or result) for others. `width` bounds the line.
std::string progress_line(const common::JobInfo& job, double now, std::size_t width);

// What a live wait draws on a terminal of `rows` x `width`: a progress_line per job when they
// fit; else a summary of all of them ("16000 jobs  [###---] 25%  3990 succeeded  1 failed  8
// running  12001 queued  ETA 3m10s", the ETA from how fast jobs ended since `since`, when the
// wait began), then the running jobs' lines and the failed ones' as long as there are rows.
std::vector<std::string> wait_screen(const std::vector<common::JobInfo>& jobs, double now, double since,
                                     std::size_t width, std::size_t rows);

}  // namespace gpuq::cli
