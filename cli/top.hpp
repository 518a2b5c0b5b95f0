// `gpuq top`: a live full-screen view of the GPUs and jobs, refreshed every second, `q` quits.
// top_screen() turns one snapshot into the screen's lines (pure, unit-tested); cmd_top (top.cpp)
// owns the terminal: alternate screen, raw keys, resizes, and restoring everything on exit.
#pragma once

#include <string>
#include <vector>

#include "common/protocol.hpp"

namespace gpuq::cli {

struct TopSnapshot {
  std::string socket;
  std::string error;  // non-empty: gpuqd could not be asked (the screen says so and retries)
  std::string daemon_version;
  common::GpusReply gpus;
  common::JobsReply jobs;  // active jobs plus recent finished ones (status)
};

// Exactly `height` lines (0: as many as the content needs) of exactly `width` columns, plain text (the loop adds the highlighting):
// a title, a summary, the GPUs table, then the jobs table (running, queued, recently ended).
std::vector<std::string> top_screen(const TopSnapshot& s, double now, std::size_t width, std::size_t height);

}  // namespace gpuq::cli
