// The optimisers gpuq-worker trains with. An internal header of the worker's LibTorch TUs.
//
// LibTorch's own SGD, Adam and AdamW update one parameter at a time: Adam launches eight kernels
// per parameter tensor, so for a small model on a GPU the optimiser step is mostly launch
// overhead (an MLP with 6 tensors: ~50 launches, more than its forward and backward together).
// The multi-tensor versions here update every parameter of a device at once with ATen's
// `_foreach_` kernels, as PyTorch's `foreach` optimisers do: eight launches per step for Adam,
// whatever the number of tensors. They are LibTorch's optimisers otherwise: same options,
// per-parameter state, parameter groups, learning-rate setting and serialisation, so schedules
// and checkpoints work unchanged (and a checkpoint moves between the two kinds), and the same
// arithmetic (an integration test checks both give the same parameters).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/train_spec.hpp"

namespace gpuq::worker {

// The optimiser of `spec` over `params`: multi-tensor unless `spec.foreach` is false.
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const common::OptimizerSpec& spec,
                                                         std::vector<torch::Tensor> params);

// The optimiser's state in a form every LibTorch version reads alike, as model.pt holds the
// weights: a plain list of tensors (CPU) and a JSON description of it,
//   {"format": 1, "kind": "adam", "lr": [per group], "params": [per parameter in group order:
//    null (no state yet) or {"step": n, "tensors": ["exp_avg", "exp_avg_sq"]}]}
// LibTorch's own optimiser archive keys the state by TensorImpl addresses written as text, which
// 2.x misreads in a 1.x archive ("0x…" parsed as decimal), so it cannot carry a checkpoint across
// versions.
struct PortableOptimizerState {
  std::vector<torch::Tensor> tensors;
  nlohmann::json meta;
};
PortableOptimizerState export_optimizer_state(torch::optim::Optimizer& optimizer);
// Replaces `optimizer`'s state with `state`, each tensor on its parameter's device. Returns ""
// or, when the state does not belong to this optimiser and its parameters (another kind, count
// or shape), why; the optimiser is then left with no state.
std::string import_optimizer_state(torch::optim::Optimizer& optimizer, const PortableOptimizerState& state);

// Whether the per-parameter state that loading a LibTorch optimiser archive (checkpoints written
// before the portable format) gave `optimizer` belongs to its parameters: one entry per parameter
// at most, none empty, each moment or momentum buffer shaped like its parameter. LibTorch 2.x
// reads a 1.x archive into empty or misplaced states, on which a step would crash.
bool optimizer_state_fits(torch::optim::Optimizer& optimizer);

// Sets every parameter's gradient to none (as PyTorch's `zero_grad(set_to_none=True)`): nothing
// to launch, and the next backward writes gradients instead of adding to zeros.
void clear_gradients(const std::vector<torch::Tensor>& params);

// Divides every gradient by the fp16 loss scale, in place; returns whether any of them holds an
// inf or NaN (the step must then be skipped). On CUDA one fused kernel per device checks and
// unscales all gradients (what GradScaler.unscale_ uses); elsewhere one tensor at a time.
bool unscale_gradients(const std::vector<torch::Tensor>& params, double scale);

// Scales the gradients down so that their joint 2-norm is at most `max_norm`, as PyTorch's
// `clip_grad_norm_(foreach=True)`: one `_foreach_norm` and one `_foreach_mul_` per device, and the
// norm never leaves the device. LibTorch's `clip_grad_norm_` launches two kernels per tensor and
// returns the norm as a double, so the host waits for the GPU every step. `foreach` false uses it.
void clip_gradients(const std::vector<torch::Tensor>& params, double max_norm, bool foreach);

}  // namespace gpuq::worker
