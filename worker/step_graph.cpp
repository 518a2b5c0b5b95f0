// CUDA graph capture and replay of the training step (see step_graph.hpp), and its stand-in
// for the CPU.
#include "worker/step_graph.hpp"

#include <exception>
#include <optional>
#include <stdexcept>
#include <utility>

#ifdef GPUQ_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace gpuq::worker {

namespace {

#ifdef GPUQ_HAVE_CUDA
// Takes the default CUDA generator out of capture mode after a failed capture. capture_begin puts
// it in that mode and only a successful capture_end takes it out, so without this every random op
// after the failure (dropout in the eager steps that follow) throws. Since LibTorch 2.4 the mode
// lives in the generator's state, which is swapped for `before`, a clone taken before the capture;
// earlier versions end it on the generator itself.
template <class Generator>
auto end_generator_capture(Generator& gen, const Generator& before, int) -> decltype(gen.graphsafe_set_state(before)) {
  gen.graphsafe_set_state(before);
}
template <class Generator>
void end_generator_capture(Generator& gen, const Generator&, long) {
  gen.template get<at::CUDAGeneratorImpl>()->capture_epilogue();
}

class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(int device, bool fail_capture)
      : m_fail_capture(fail_capture),
        m_device(static_cast<c10::DeviceIndex>(device)),
        m_stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, m_device)) {
    // The parameters, optimiser state and data were made on the default stream.
    c10::cuda::device_synchronize();
    m_guard.emplace(m_stream);
  }
  ~CudaStepGraph() override {
    m_stream.synchronize();
    m_guard.reset();
  }
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;

  void capture(const std::function<void()>& body) override {
    // Memory the body allocates comes from a pool of the graph's own, so replays find their
    // intermediate tensors, gradients and loss where the capture put them.
    at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(m_device);
    const at::Generator before = generator.clone();
    m_graph.capture_begin();
    std::exception_ptr failure;
    try {
      body();
      if (m_fail_capture) c10::cuda::device_synchronize();  // test aid: forbidden during capture
    } catch (...) {
      failure = std::current_exception();
    }
    try {
      m_graph.capture_end();  // also after a failure: the stream must leave capture mode
    } catch (...) {
      end_generator_capture(generator, before, 0);
      if (!failure) failure = std::current_exception();
    }
    if (failure) std::rethrow_exception(failure);  // the body's error first: it names the cause
  }

  void replay() override { m_graph.replay(); }

 private:
  bool m_fail_capture;
  c10::DeviceIndex m_device;
  c10::cuda::CUDAStream m_stream;
  std::optional<c10::cuda::CUDAStreamGuard> m_guard;
  at::cuda::CUDAGraph m_graph;
};
#endif

class EmulatedStepGraph final : public StepGraph {
 public:
  EmulatedStepGraph(std::function<void()> before_replay, std::function<bool()> others_quiet, bool fail_capture)
      : m_before_replay(std::move(before_replay)), m_others_quiet(std::move(others_quiet)), m_fail_capture(fail_capture) {}

  void capture(const std::function<void()>& body) override {
    if (m_fail_capture) throw std::runtime_error("operation not permitted when stream is capturing (emulated)");
    if (!m_others_quiet())
      throw std::runtime_error(
          "operation not permitted when stream is capturing (emulated: another thread may make CUDA calls during the "
          "capture)");
    m_body = body;
  }

  void replay() override {
    if (!m_body) throw std::logic_error("StepGraph::replay before capture");
    m_before_replay();
    m_body();
  }

 private:
  std::function<void()> m_before_replay;
  std::function<bool()> m_others_quiet;
  bool m_fail_capture;
  std::function<void()> m_body;
};

}  // namespace

std::unique_ptr<StepGraph> make_cuda_step_graph([[maybe_unused]] int device, [[maybe_unused]] bool fail_capture) {
#ifdef GPUQ_HAVE_CUDA
  return std::make_unique<CudaStepGraph>(device, fail_capture);
#else
  throw std::runtime_error("gpuq-worker was built without CUDA: no CUDA graphs");
#endif
}

std::unique_ptr<StepGraph> make_emulated_step_graph(std::function<void()> before_replay,
                                                    std::function<bool()> others_quiet, bool fail_capture) {
  return std::make_unique<EmulatedStepGraph>(std::move(before_replay), std::move(others_quiet), fail_capture);
}

}  // namespace gpuq::worker
