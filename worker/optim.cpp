// Multi-tensor SGD, Adam and AdamW on top of LibTorch's optimisers; see optim.hpp.
#include "worker/optim.hpp"

#include <torch/version.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>

namespace gpuq::worker {
namespace {

// LibTorch keys an optimiser's per-parameter state by the parameter's TensorImpl: the pointer
// itself (2.x), or the pointer as c10::guts::to_string prints it (1.x). Using the same key keeps
// LibTorch's save/load (checkpoints) working on the state these optimisers create.
template <class Map>
typename Map::key_type state_key(const Map& /*state*/, const torch::Tensor& p) {
  auto* impl = p.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream s;
    s << static_cast<const void*>(impl);
    return s.str();
  } else {
    return impl;
  }
}

// The parameters' gradients (those that have one), grouped by device, for multi-tensor kernels.
std::map<std::string, std::vector<torch::Tensor>> gradients_by_device(const std::vector<torch::Tensor>& params) {
  std::map<std::string, std::vector<torch::Tensor>> out;
  for (const auto& p : params)
    if (p.grad().defined()) out[p.grad().device().str()].push_back(p.grad());
  return out;
}

// The tensors of one multi-tensor call: ATen's fast path wants one device and dtype, and Adam's
// bias correction one step count.
struct Batch {
  std::vector<torch::Tensor> params, grads, first, second;  // first/second: the moments, or SGD's buffers
};
using BatchKey = std::tuple<std::string, int, std::int64_t>;

BatchKey batch_key(const torch::Tensor& p, std::int64_t step) {
  return {p.device().str(), static_cast<int>(p.scalar_type()), step};
}

// Adam (L2 weight decay added to the gradient) or AdamW (decoupled weight decay: the parameters
// shrink by lr·wd first), each step as LibTorch's Adam::step / AdamW::step computes it.
template <class Base, class Options, class State, bool Decoupled>
class MultiTensorAdam final : public Base {
 public:
  using Base::Base;

  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    for (auto& group : this->param_groups_)
      if (static_cast<const Options&>(group.options()).amsgrad()) return Base::step(std::move(closure));
    torch::Tensor loss;
    if (closure) {
      torch::AutoGradMode grad_mode(true);
      loss = closure();
    }
    torch::NoGradGuard no_grad;
    for (auto& group : this->param_groups_) {
      const auto& o = static_cast<const Options&>(group.options());
      std::map<BatchKey, Batch> batches;
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        TORCH_CHECK(!p.grad().is_sparse(), "multi-tensor Adam does not support sparse gradients");
        auto key = state_key(this->state_, p);
        auto it = this->state_.find(key);
        if (it == this->state_.end()) {
          auto fresh = std::make_unique<State>();
          fresh->step(0);
          fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          it = this->state_.emplace(std::move(key), std::move(fresh)).first;
        }
        auto& s = static_cast<State&>(*it->second);
        s.step(s.step() + 1);
        auto& b = batches[batch_key(p, s.step())];
        b.params.push_back(p);
        b.grads.push_back(p.grad());
        b.first.push_back(s.exp_avg());
        b.second.push_back(s.exp_avg_sq());
      }
      const auto [beta1, beta2] = o.betas();
      for (auto& [key, b] : batches) {
        const auto t = static_cast<double>(std::get<2>(key));
        const double correction1 = 1 - std::pow(beta1, t), correction2 = 1 - std::pow(beta2, t);
        auto grads = b.grads;
        if (o.weight_decay() != 0) {
          if constexpr (Decoupled)
            at::_foreach_mul_(b.params, 1 - o.lr() * o.weight_decay());
          else
            grads = at::_foreach_add(b.grads, b.params, o.weight_decay());
        }
        at::_foreach_mul_(b.first, beta1);
        at::_foreach_add_(b.first, grads, 1 - beta1);
        at::_foreach_mul_(b.second, beta2);
        at::_foreach_addcmul_(b.second, grads, grads, 1 - beta2);
        auto denominators = at::_foreach_sqrt(b.second);
        at::_foreach_div_(denominators, std::sqrt(correction2));
        at::_foreach_add_(denominators, o.eps());
        at::_foreach_addcdiv_(b.params, b.first, denominators, -o.lr() / correction1);
      }
    }
    return loss;
  }
};

// SGD with momentum, dampening and Nesterov, as LibTorch's SGD::step computes it.
class MultiTensorSGD final : public torch::optim::SGD {
 public:
  using SGD::SGD;

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::Tensor loss;
    if (closure) {
      torch::AutoGradMode grad_mode(true);
      loss = closure();
    }
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      std::map<BatchKey, Batch> batches;
      for (auto& p : group.params())
        if (p.grad().defined()) {
          auto& b = batches[batch_key(p, 0)];
          b.params.push_back(p);
          b.grads.push_back(p.grad());
        }
      for (auto& [key, b] : batches) {
        auto steps = o.weight_decay() != 0 ? at::_foreach_add(b.grads, b.params, o.weight_decay()) : b.grads;
        if (o.momentum() != 0) {
          // A parameter's first step starts its buffer at the step itself; later ones decay it.
          std::vector<torch::Tensor> buffers(b.params.size()), decayed, incoming;
          for (std::size_t i = 0; i < b.params.size(); ++i) {
            auto key_of = state_key(state_, b.params[i]);
            auto it = state_.find(key_of);
            if (it == state_.end()) {
              auto fresh = std::make_unique<torch::optim::SGDParamState>();
              fresh->momentum_buffer(torch::clone(steps[i]).detach());
              buffers[i] = fresh->momentum_buffer();
              state_.emplace(std::move(key_of), std::move(fresh));
            } else {
              buffers[i] = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
              decayed.push_back(buffers[i]);
              incoming.push_back(steps[i]);
            }
          }
          if (!decayed.empty()) {
            at::_foreach_mul_(decayed, o.momentum());
            at::_foreach_add_(decayed, incoming, 1 - o.dampening());
          }
          steps = o.nesterov() ? at::_foreach_add(steps, buffers, o.momentum()) : buffers;
        }
        at::_foreach_add_(b.params, steps, -1 * o.lr());
      }
    }
    return loss;
  }
};

using MultiTensorAdamL2 =
    MultiTensorAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
using MultiTensorAdamW =
    MultiTensorAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>;

}  // namespace

std::unique_ptr<torch::optim::Optimizer> build_optimizer(const common::OptimizerSpec& o,
                                                         std::vector<torch::Tensor> params) {
  if (o.kind == "sgd") {
    auto options = torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay);
    if (o.foreach) return std::make_unique<MultiTensorSGD>(params, options);
    return std::make_unique<torch::optim::SGD>(params, options);
  }
  if (o.kind == "adamw") {
    auto options = torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay);
    if (o.foreach) return std::make_unique<MultiTensorAdamW>(params, options);
    return std::make_unique<torch::optim::AdamW>(params, options);
  }
  auto options = torch::optim::AdamOptions(o.lr).weight_decay(o.weight_decay);
  if (o.foreach) return std::make_unique<MultiTensorAdamL2>(params, options);
  return std::make_unique<torch::optim::Adam>(params, options);
}

bool unscale_gradients(const std::vector<torch::Tensor>& params, double scale) {
  torch::NoGradGuard no_grad;
  bool found = false;
  for (auto& [device, grads] : gradients_by_device(params)) {
    if (!grads.front().is_cuda()) {
      for (auto& grad : grads) {
        grad.mul_(1.0 / scale);
        found = found || !grad.isfinite().all().item<bool>();
      }
      continue;
    }
    const auto options = grads.front().options().dtype(torch::kFloat32);
    auto found_inf = torch::zeros({1}, options);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch::full({1}, 1.0 / scale, options));
    found = found_inf.item<float>() != 0 || found;
  }
  return found;
}

void clip_gradients(const std::vector<torch::Tensor>& params, double max_norm, bool foreach) {
  if (!foreach) {
    torch::nn::utils::clip_grad_norm_(params, max_norm);
    return;
  }
  torch::NoGradGuard no_grad;
  const auto by_device = gradients_by_device(params);
  if (by_device.empty()) return;
  const auto first = by_device.begin()->second.front().device();
  std::vector<torch::Tensor> norms;
  for (const auto& [device, grads] : by_device)
    for (auto& n : at::_foreach_norm(grads, 2)) norms.push_back(n.to(first));
  const auto total = torch::stack(norms).norm(2);
  const auto coef = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);  // LibTorch's epsilon
  for (const auto& [device, grads] : by_device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    at::_foreach_mul_(grads, coef.to(grads.front().device()));
#else
    const auto c = coef.to(grads.front().device());  // no Tensor overload of _foreach_mul_ before 2.1
    for (auto g : grads) g.mul_(c);
#endif
  }
}

namespace {

std::string kind_of(torch::optim::Optimizer& o) {
  if (dynamic_cast<torch::optim::AdamW*>(&o)) return "adamw";
  if (dynamic_cast<torch::optim::Adam*>(&o)) return "adam";
  if (dynamic_cast<torch::optim::SGD*>(&o)) return "sgd";
  return "";
}

// One parameter's state: its step (Adam) and its tensors by name, in a fixed order, undefined
// ones (no amsgrad, no momentum yet) included.
struct NamedState {
  std::int64_t step = 0;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

template <class AdamState>
NamedState adam_state(const AdamState& a) {
  return {a.step(), {{"exp_avg", a.exp_avg()}, {"exp_avg_sq", a.exp_avg_sq()}, {"max_exp_avg_sq", a.max_exp_avg_sq()}}};
}

NamedState named_state(const torch::optim::OptimizerParamState& s) {
  if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&s)) return adam_state(*a);
  if (const auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(&s)) return adam_state(*w);
  if (const auto* m = dynamic_cast<const torch::optim::SGDParamState*>(&s)) return {0, {{"momentum_buffer", m->momentum_buffer()}}};
  return {};
}

template <class AdamState>
std::unique_ptr<torch::optim::OptimizerParamState> make_adam_state(std::int64_t step,
                                                                   std::map<std::string, torch::Tensor>& t) {
  auto s = std::make_unique<AdamState>();
  s->step(step);
  if (t.count("exp_avg")) s->exp_avg(t["exp_avg"]);
  if (t.count("exp_avg_sq")) s->exp_avg_sq(t["exp_avg_sq"]);
  if (t.count("max_exp_avg_sq")) s->max_exp_avg_sq(t["max_exp_avg_sq"]);
  return s;
}

std::string import_state(torch::optim::Optimizer& optimizer, const PortableOptimizerState& in) {
  auto& state = optimizer.state();
  state.clear();
  const auto& meta = in.meta;
  const std::string kind = kind_of(optimizer);
  if (!meta.is_object() || meta.value("format", 0) != 1)
    return "its format is not 1 but " + (meta.is_object() && meta.contains("format") ? meta["format"].dump() : "missing");
  if (meta.value("kind", "") != kind) return "it is " + meta.value("kind", "") + " state, this optimiser is " + kind;
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) params.push_back(p);
  const auto& entries = meta.at("params");
  if (entries.size() != params.size())
    return "it has state for " + std::to_string(entries.size()) + " parameters, the model has " +
           std::to_string(params.size());
  std::size_t next = 0;
  std::string why;
  for (std::size_t i = 0; i < params.size() && why.empty(); ++i) {
    if (entries[i].is_null()) continue;
    std::map<std::string, torch::Tensor> named;
    for (const auto& name : entries[i].at("tensors")) {
      if (next == in.tensors.size()) {
        why = "it has fewer tensors than it describes";
        break;
      }
      const auto& t = in.tensors[next++];
      if (t.sizes() != params[i].sizes()) {
        why = "parameter " + std::to_string(i) + "'s " + name.get<std::string>() + " has another shape than the parameter";
        break;
      }
      named[name.get<std::string>()] = t.to(params[i].device());
    }
    const std::int64_t step = entries[i].value("step", std::int64_t{0});
    std::unique_ptr<torch::optim::OptimizerParamState> s;
    if (kind == "adam") s = make_adam_state<torch::optim::AdamParamState>(step, named);
    else if (kind == "adamw") s = make_adam_state<torch::optim::AdamWParamState>(step, named);
    else if (named.count("momentum_buffer")) {
      auto m = std::make_unique<torch::optim::SGDParamState>();
      m->momentum_buffer(named["momentum_buffer"]);
      s = std::move(m);
    }
    if (s) state[state_key(state, params[i])] = std::move(s);
  }
  if (why.empty() && next != in.tensors.size()) why = "it has more tensors than it describes";
  if (!why.empty()) {
    state.clear();
    return why;
  }
  if (const auto lrs = meta.value("lr", nlohmann::json::array()); lrs.size() == optimizer.param_groups().size())
    for (std::size_t g = 0; g < lrs.size(); ++g) optimizer.param_groups()[g].options().set_lr(lrs[g].get<double>());
  return "";
}

}  // namespace

PortableOptimizerState export_optimizer_state(torch::optim::Optimizer& optimizer) {
  PortableOptimizerState out;
  auto& state = optimizer.state();
  nlohmann::json lrs = nlohmann::json::array(), params = nlohmann::json::array();
  for (auto& group : optimizer.param_groups()) {
    lrs.push_back(group.options().get_lr());
    for (const auto& p : group.params()) {
      const auto it = state.find(state_key(state, p));
      if (it == state.end() || !it->second) {
        params.push_back(nullptr);
        continue;
      }
      const NamedState named = named_state(*it->second);
      nlohmann::json names = nlohmann::json::array();
      for (const auto& [name, t] : named.tensors) {
        if (!t.defined()) continue;
        names.push_back(name);
        out.tensors.push_back(t.detach().cpu());
      }
      params.push_back({{"step", named.step}, {"tensors", names}});
    }
  }
  out.meta = {{"format", 1}, {"kind", kind_of(optimizer)}, {"lr", lrs}, {"params", params}};
  return out;
}

std::string import_optimizer_state(torch::optim::Optimizer& optimizer, const PortableOptimizerState& in) {
  try {
    return import_state(optimizer, in);
  } catch (const std::exception& e) {  // a malformed description (nlohmann) or tensor (c10)
    optimizer.state().clear();
    return std::string("it is unreadable: ") + e.what();
  }
}

bool optimizer_state_fits(torch::optim::Optimizer& optimizer) {
  auto& state = optimizer.state();
  for (const auto& entry : state)
    if (!entry.second) return false;
  std::size_t owned = 0;
  for (auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      const auto it = state.find(state_key(state, p));
      if (it == state.end()) continue;
      ++owned;
      for (const auto& [name, t] : named_state(*it->second).tensors)
        if (t.defined() && t.sizes() != p.sizes()) return false;
    }
  return owned == state.size();
}

void clear_gradients(const std::vector<torch::Tensor>& params) {
  for (auto p : params)
    if (p.grad().defined()) p.mutable_grad().reset();
}

}  // namespace gpuq::worker
