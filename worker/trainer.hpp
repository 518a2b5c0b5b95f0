// gpuq-worker's trainer: builds the model, trains it alone or as one DDP rank, evaluates every
// epoch and reports progress and the final result as gpuq events. The header is free of LibTorch
// so only trainer.cpp pays its compile cost.
#pragma once

#include <string>

#include "common/train_spec.hpp"

namespace gpuq::worker {

struct RunOptions {
  common::TrainSpec spec;
  // The torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
  int rank = 0;
  int world = 1;
  // Launched as a rank (WORLD_SIZE set, as gpuqd and torchrun do): join a process group and
  // average gradients even when the gang has one rank, like DDP under torchrun --nproc 1.
  bool distributed = false;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string events;       // $GPUQ_EVENTS; empty = no events
  std::string dump_params;  // write the final parameters here (JSON array of floats), for tests
  std::string checkpoint_dir;  // $GPUQ_CHECKPOINT_DIR: checkpoints go here, and resume from here
  bool emulate_cuda_graph = false;  // train.cuda_graph without CUDA, for tests (make_emulated_step_graph)
  bool fail_capture = false;        // the graph's capture fails (emulated, or a real one on CUDA), for tests
};

// Returns the process exit code; errors are printed to stderr.
int train(const RunOptions& options);

// Which collective backends this build has, e.g. "gloo,nccl".
std::string available_backends();

}  // namespace gpuq::worker
