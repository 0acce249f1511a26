#include "train/optimizer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

namespace vqa::train {

namespace {

// The key under which torch::optim::Optimizer keeps a parameter's state: the
// address of its TensorImpl, as a string in LibTorch 1.x and as a pointer in 2.x.
template <typename Key>
Key optimizer_state_key(const torch::Tensor& parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(parameter.unsafeGetTensorImpl());
    return key.str();
  } else {
    return static_cast<Key>(parameter.unsafeGetTensorImpl());
  }
}

bool fusable(const torch::Tensor& tensor) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.scalar_type() == torch::kFloat32 &&
         tensor.is_contiguous() && !tensor.is_sparse();
}

// The loop GCC and Clang vectorise: no aliasing, and sqrt without errno
// (this file is compiled with -fno-math-errno, see CMakeLists.txt).
void adamw_update_range(float* __restrict parameter, const float* __restrict gradient,
                        float* __restrict exp_avg, float* __restrict exp_avg_sq, int64_t n,
                        const AdamWCoefficients c) {
  const float one_minus_beta1 = 1.0f - c.beta1;
  const float one_minus_beta2 = 1.0f - c.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gradient[i];
    const float m = exp_avg[i] * c.beta1 + one_minus_beta1 * g;
    const float v = exp_avg_sq[i] * c.beta2 + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
    parameter[i] = parameter[i] * c.decay - c.step_size * (m / denom);
  }
}

}  // namespace

void adamw_update_fused(float* parameter, const float* gradient, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamWCoefficients& c) {
  constexpr int64_t kGrain = 1 << 15;  // values per task: a few tens of microseconds
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    adamw_update_range(parameter + begin, gradient + begin, exp_avg + begin, exp_avg_sq + begin,
                       end - begin, c);
  });
}

double linear_schedule_factor(int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return static_cast<double>(step) / std::max<int64_t>(1, warmup);
  return std::max(0.0, static_cast<double>(total - step) / std::max<int64_t>(1, total - warmup));
}

VqaOptimizer::VqaOptimizer(model::M3AE& model, const OptimizerSettings& settings)
    : settings_(settings),
      warmup_steps_(static_cast<int64_t>(std::ceil(settings.warmup_ratio * settings.total_steps))) {
  // Six groups: {encoder, fusion, head} x {decay, no decay}.
  std::vector<std::vector<torch::Tensor>> tensors(6);
  for (auto& parameter : model::model_parameter_groups(model)) {
    const int group = static_cast<int>(parameter.group) * 2 + (parameter.weight_decay ? 0 : 1);
    tensors[group].push_back(parameter.tensor);
  }
  const double group_multiplier[3] = {1.0, settings.fusion_multiplier, settings.head_multiplier};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (int group = 0; group < 6; ++group) {
    if (tensors[group].empty()) continue;
    auto options = std::make_unique<torch::optim::AdamWOptions>(settings.lr);
    options->betas({0.9, 0.98})
        .eps(1e-8)
        .weight_decay(group % 2 == 0 ? settings.weight_decay : 0.0);
    groups.emplace_back(tensors[group], std::move(options));
    multipliers_.push_back(group_multiplier[group / 2]);
  }
  adamw_ = std::make_unique<torch::optim::AdamW>(
      groups, torch::optim::AdamWOptions(settings.lr).betas({0.9, 0.98}).eps(1e-8));
}

double VqaOptimizer::learning_rate(int64_t step) const {
  return settings_.lr * linear_schedule_factor(step, warmup_steps_, settings_.total_steps);
}

void VqaOptimizer::step(int64_t step) {
  const double lr = learning_rate(step);
  auto& groups = adamw_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    static_cast<torch::optim::AdamWOptions&>(groups[i].options()).lr(lr * multipliers_[i]);
  }
  if (settings_.fused_cpu && fused_step_possible()) {
    fused_step();
  } else {
    adamw_->step();
  }
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

// LibTorch's AdamW::step (amsgrad off), with the moments kept where it keeps
// them, so that either can take over from the other and checkpoints match.
void VqaOptimizer::fused_step() {
  torch::NoGradGuard no_grad;
  auto& states = adamw_->state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  for (auto& group : adamw_->param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    for (auto& parameter : group.params()) {
      const torch::Tensor& gradient = parameter.grad();
      if (!gradient.defined()) continue;
      const Key key = optimizer_state_key<Key>(parameter);
      auto found = states.find(key);
      if (found == states.end()) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
        found = states.emplace(key, std::move(fresh)).first;
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
      state.step(state.step() + 1);
      const double bias_correction1 = 1 - std::pow(beta1, state.step());
      const double bias_correction2 = 1 - std::pow(beta2, state.step());
      const AdamWCoefficients coefficients{
          static_cast<float>(1 - options.lr() * options.weight_decay()),
          static_cast<float>(beta1),
          static_cast<float>(beta2),
          static_cast<float>(options.lr() / bias_correction1),
          static_cast<float>(std::sqrt(bias_correction2)),
          static_cast<float>(options.eps())};
      adamw_update_fused(parameter.data_ptr<float>(), gradient.data_ptr<float>(),
                         state.exp_avg().data_ptr<float>(), state.exp_avg_sq().data_ptr<float>(),
                         parameter.numel(), coefficients);
    }
  }
}

}  // namespace vqa::train
