// VqaOptimizer's unsharded AdamW steps over LibTorch's per-parameter states:
// the fused CPU pass (adamw_update_fused), transformers' formula in tensor
// operations, and ATen's fused multi-tensor AdamW on a GPU.
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "train/adamw_update.h"    // adamw_update_fused, AdamWCoefficients
#include "train/optimizer.h"       // VqaOptimizer
#include "train/optimizer_impl.h"  // adamw_state_of, fused_coefficients, VQA_ATEN_FUSED_ADAMW

namespace vqa::train {

namespace {

bool fusable(const torch::Tensor& tensor) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.scalar_type() == torch::kFloat32 &&
         tensor.is_contiguous() && !tensor.is_sparse();
}

// Calls step(options, parameter, gradient, state) for every parameter with a
// gradient, group by group, after counting the step in its state.
template <typename Step>
void for_each_parameter_step(torch::optim::AdamW& adamw, Step step) {
  torch::NoGradGuard no_grad;
  for (auto& group : adamw.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& parameter : group.params()) {
      const torch::Tensor& gradient = parameter.grad();
      if (!gradient.defined()) continue;
      auto& state = adamw_state_of(adamw, parameter);
      state.step(state.step() + 1);
      step(options, parameter, gradient, state);
    }
  }
}

}  // namespace

// A parameter's AdamW state in LibTorch's map, created (zero moments) on first use.
torch::optim::AdamWParamState& adamw_state_of(torch::optim::AdamW& adamw,
                                              const torch::Tensor& parameter) {
  auto& states = adamw.state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  const Key key = optimizer_state_key<Key>(parameter);
  auto found = states.find(key);
  if (found == states.end()) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
    found = states.emplace(key, std::move(fresh)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*found->second);
}

// The fused pass's coefficients for a group at step `step` (1-based):
// LibTorch's AdamW, or transformers' (the m3ae recipe).
AdamWCoefficients fused_coefficients(const torch::optim::AdamWOptions& options, int64_t step,
                                     bool transformers) {
  const auto [beta1, beta2] = options.betas();
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  AdamWCoefficients coefficients{};
  coefficients.decay = static_cast<float>(1 - options.lr() * options.weight_decay());
  coefficients.beta1 = static_cast<float>(beta1);
  coefficients.beta2 = static_cast<float>(beta2);
  coefficients.eps = static_cast<float>(options.eps());
  if (transformers) {
    coefficients.step_size =
        static_cast<float>(options.lr() * std::sqrt(bias_correction2) / bias_correction1);
    coefficients.sqrt_bias_correction2 = 1.0f;
    coefficients.decay_after_step = true;
  } else {
    coefficients.step_size = static_cast<float>(options.lr() / bias_correction1);
    coefficients.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  }
  return coefficients;
}

AtenAdamWCoefficients aten_fused_coefficients(bool transformers, double lr, double weight_decay,
                                              double eps, double beta2, int64_t step) {
  if (!transformers) return {lr, weight_decay, eps};
  const double decay = 1 - lr * weight_decay;
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  return {lr * decay, decay > 0 ? weight_decay / decay : 0.0, eps / std::sqrt(bias_correction2)};
}

bool VqaOptimizer::fused_step_possible() const {
  for (const auto& group : adamw_->param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& parameter : group.params()) {
      if (!fusable(parameter)) return false;
      if (parameter.grad().defined() && !fusable(parameter.grad())) return false;
    }
  }
  for (const auto& entry : adamw_->state()) {  // moments read from a checkpoint, say
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    if (!fusable(state.exp_avg()) || !fusable(state.exp_avg_sq())) return false;
  }
  return true;
}

// transformers.optimization.AdamW.step (correct_bias on), in its order.
void VqaOptimizer::transformers_step() {
  for_each_parameter_step(
      *adamw_, [](const torch::optim::AdamWOptions& options, torch::Tensor& parameter,
                  const torch::Tensor& gradient, torch::optim::AdamWParamState& state) {
        const auto [beta1, beta2] = options.betas();
        state.exp_avg().mul_(beta1).add_(gradient, 1 - beta1);
        state.exp_avg_sq().mul_(beta2).addcmul_(gradient, gradient, 1 - beta2);
        const auto denom = state.exp_avg_sq().sqrt().add_(options.eps());
        const double step_size = options.lr() * std::sqrt(1 - std::pow(beta2, state.step())) /
                                 (1 - std::pow(beta1, state.step()));
        parameter.addcdiv_(state.exp_avg(), denom, -step_size);
        if (options.weight_decay() > 0) {
          parameter.add_(parameter, -options.lr() * options.weight_decay());
        }
      });
}

// LibTorch's AdamW::step (amsgrad off), or transformers' (the m3ae recipe),
// with the moments kept where LibTorch keeps them, so that either can take
// over from the other and checkpoints match.
void VqaOptimizer::fused_step() {
  const bool transformers = settings_.recipe == OptimizerRecipe::kM3ae;
  for_each_parameter_step(
      *adamw_, [transformers](const torch::optim::AdamWOptions& options, torch::Tensor& parameter,
                              const torch::Tensor& gradient, torch::optim::AdamWParamState& state) {
        const auto coefficients = fused_coefficients(options, state.step(), transformers);
        adamw_update_fused(parameter.data_ptr<float>(), gradient.data_ptr<float>(),
                           state.exp_avg().data_ptr<float>(), state.exp_avg_sq().data_ptr<float>(),
                           parameter.numel(), coefficients);
      });
}

// ATen's fused AdamW, one call per parameter group and step count: the
// moments stay in LibTorch's states (checkpoints unchanged), the step counts
// also on the device (the kernel reads them there), counted on both sides
// and taken back on the device at once when found_inf is true (as PyTorch's
// _fused_adamw does it); the host takes its count back when it learns of the
// skip (undo_step_count).
void VqaOptimizer::aten_fused_step(const torch::Tensor& found_inf) {
#ifdef VQA_ATEN_FUSED_ADAMW
  torch::NoGradGuard no_grad;
  const bool transformers = settings_.recipe == OptimizerRecipe::kM3ae;
  std::optional<at::Tensor> skip;
  if (found_inf.defined()) skip = found_inf.to(torch::kFloat32).reshape({});
  size_t index = 0;
  for (auto& group : adamw_->param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    // Parameters with a gradient, by their step count (one call per count;
    // all alike unless a parameter went without a gradient on some step).
    std::map<int64_t, std::array<std::vector<at::Tensor>, 5>> calls;
    for (auto& parameter : group.params()) {
      const size_t slot = index++;
      const torch::Tensor& gradient = parameter.grad();
      if (!gradient.defined()) continue;
      auto& state = adamw_state_of(*adamw_, parameter);
      if (device_steps_.size() <= slot) {
        device_steps_.resize(slot + 1);
        device_steps_for_.resize(slot + 1, nullptr);
      }
      if (device_steps_for_[slot] != state.exp_avg().unsafeGetTensorImpl()) {
        device_steps_[slot] =
            torch::full({}, static_cast<double>(state.step()),
                        torch::TensorOptions().dtype(torch::kFloat32).device(parameter.device()));
        device_steps_for_[slot] = state.exp_avg().unsafeGetTensorImpl();
      }
      state.step(state.step() + 1);
      auto& call = calls[state.step()];
      call[0].push_back(parameter);
      call[1].push_back(gradient);
      call[2].push_back(state.exp_avg());
      call[3].push_back(state.exp_avg_sq());
      call[4].push_back(device_steps_[slot]);
    }
    for (auto& [count, tensors] : calls) {
      const auto c = aten_fused_coefficients(transformers, options.lr(), options.weight_decay(),
                                             options.eps(), beta2, count);
      at::_foreach_add_(tensors[4], 1);
      at::_fused_adamw_(tensors[0], tensors[1], tensors[2], tensors[3], /*max_exp_avg_sqs=*/{},
                        tensors[4], c.lr, beta1, beta2, c.weight_decay, c.eps, /*amsgrad=*/false,
                        /*maximize=*/false, /*grad_scale=*/std::nullopt, skip);
      if (skip) {
        at::_foreach_sub_(tensors[4], std::vector<at::Tensor>(tensors[4].size(), *skip));
      }
    }
  }
#else
  (void)found_inf;
  TORCH_CHECK(false, "ATen's fused AdamW needs LibTorch 2.4 or later");
#endif
}

}  // namespace vqa::train
