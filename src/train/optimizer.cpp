#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace vqa::train {

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
  adamw_->step();
}

void VqaOptimizer::zero_grad() { adamw_->zero_grad(); }

}  // namespace vqa::train
