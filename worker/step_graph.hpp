// The training step's forward and backward passes replayed from a CUDA graph (`train.cuda_graph`).
// A small model's step on a GPU is bound by kernel launches and the autograd engine's host work,
// not by arithmetic: replaying a captured graph launches the whole step's kernels at once. The
// header is free of LibTorch; step_graph.cpp includes only the CUDA graph and stream headers.
#pragma once

#include <functional>
#include <memory>

namespace gpuq::worker {

// Records the work of a body once and runs it again on every replay. What the body reads must be
// in tensors whose storage stays put (static input buffers, parameters), and what it writes
// (gradients, the loss) lands each replay in the same storage that the capture gave it.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Records `body`; like CUDA stream capture, nothing of it runs until `replay`. On an exception
  // the capture is ended and nothing is recorded.
  virtual void capture(const std::function<void()>& body) = 0;
  // Runs what was captured.
  virtual void replay() = 0;
};

// A CUDA graph of GPU `device`. For the object's lifetime, work this thread launches on that GPU
// goes to a side stream (capture cannot use the default stream, and warm-up steps must run on the
// capture's stream so that cuBLAS's per-stream handles and workspaces exist before capture);
// work queued before is waited for first, and the side stream is waited for at the end.
// With `fail_capture` the capture waits for the device, which capture forbids, so it fails the way
// a capture of unsupported work does (--fail-capture). Throws where gpuq-worker was built without
// CUDA.
std::unique_ptr<StepGraph> make_cuda_step_graph(int device, bool fail_capture = false);

// Stands in for a CUDA graph without CUDA: each replay calls `before_replay` (the trainer clears
// the gradients there, which a real replay overwrites) and runs the body again. The trainer's
// data flow around a graph — static batches refilled, the loss read from the capture's output —
// then runs, and is tested, on the CPU (gpuq-worker --emulate-cuda-graph). With `fail_capture`
// the capture throws, as a CUDA capture does on work it cannot record (--fail-capture). It also
// throws unless `others_quiet()`: CUDA's global capture mode (PyTorch's default) fails a capture
// when another thread makes a CUDA call during it, so the trainer must hold its other threads (the
// host data's gathering thread) still, and the emulation checks that it did.
std::unique_ptr<StepGraph> make_emulated_step_graph(std::function<void()> before_replay,
                                                    std::function<bool()> others_quiet, bool fail_capture = false);

}  // namespace gpuq::worker
