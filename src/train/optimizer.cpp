// VqaOptimizer's parameter groups under the two recipes, the learning-rate
// schedule, and step(), which hands each step to one of the AdamW updates
// (adamw_steps.cpp, or optimizer_shard.cpp under ZeRO-1).
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/m3ae_import.h"     // m3ae_parameter_sources: M3AE's names for the m3ae recipe
#include "train/optimizer_impl.h"  // VqaOptimizer::ShardState, VQA_ATEN_FUSED_ADAMW

namespace vqa::train {

namespace {

// M3AE's set_schedule rules on M3AE's parameter names.
bool m3ae_is_head(const std::string& name) {
  for (const char* head :
       {"mlm_head", "mim_head", "itm_head", "vqa_head", "cls_head", "irtr_head"}) {
    if (name.find(head) != std::string::npos) return true;
  }
  return false;
}
bool m3ae_no_decay(const std::string& name) {
  for (const char* part : {"bias", "LayerNorm.bias", "LayerNorm.weight", "norm.bias", "norm.weight",
                           "norm1.bias", "norm1.weight", "norm2.bias", "norm2.weight"}) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

// Group index {encoder, fusion, head} x {decay, no decay} of every
// parameter, under the recipe.
std::vector<std::pair<torch::Tensor, int>> grouped_parameters(model::M3AE& model,
                                                              OptimizerRecipe recipe) {
  std::vector<std::pair<torch::Tensor, int>> grouped;
  if (recipe == OptimizerRecipe::kVqaHpc) {
    for (auto& parameter : model::model_parameter_groups(model)) {
      grouped.emplace_back(parameter.tensor, static_cast<int>(parameter.group) * 2 +
                                                 (parameter.weight_decay ? 0 : 1));
    }
    return grouped;
  }
  auto parameters = model->named_parameters();
  // A parameter filled from several of M3AE's tensors (BERT's query, key and
  // value weights packed into one in_weight) is listed once per tensor: it
  // joins its group once, and every tensor must name the same group.
  std::map<std::string, int> group_of;
  for (const auto& [name, source] : model::m3ae_parameter_sources(model)) {
    const std::string& m3ae = source.name;
    const bool head = m3ae_is_head(m3ae);
    const bool multi_modal = m3ae.find("multi_modal") != std::string::npos;
    const int part = head ? 2 : multi_modal ? 1 : 0;
    const int group = part * 2 + (m3ae_no_decay(m3ae) ? 1 : 0);
    const auto [known, added] = group_of.emplace(name, group);
    if (added) {
      grouped.emplace_back(parameters[name], group);
    } else if (known->second != group) {
      throw std::logic_error("the m3ae recipe puts parts of " + name + " in two groups (from " +
                             m3ae + ")");
    }
  }
  return grouped;
}

}  // namespace

double linear_schedule_factor(int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return static_cast<double>(step) / std::max<int64_t>(1, warmup);
  return std::max(0.0, static_cast<double>(total - step) / std::max<int64_t>(1, total - warmup));
}

bool aten_fused_adamw_available() {
#ifdef VQA_ATEN_FUSED_ADAMW
  return true;
#else
  return false;
#endif
}

VqaOptimizer::VqaOptimizer(model::M3AE& model, const OptimizerSettings& settings)
    : settings_(settings) {
  // transformers' schedules take int(ratio x steps); ours rounds up, so that
  // any positive ratio warms up.
  const double warmup = settings.warmup_ratio * static_cast<double>(settings.total_steps);
  warmup_steps_ = static_cast<int64_t>(
      settings.recipe == OptimizerRecipe::kM3ae ? std::floor(warmup) : std::ceil(warmup));
  // Six groups: {encoder, fusion, head} x {decay, no decay}.
  std::vector<std::vector<torch::Tensor>> tensors(6);
  for (auto& [tensor, group] : grouped_parameters(model, settings.recipe)) {
    tensors[group].push_back(tensor);
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
  const auto parameters = model->parameters();
  const bool gpu = !parameters.empty() && parameters.front().device().is_cuda();
  on_device_path_ = aten_fused_adamw_available() && (gpu || settings.aten_fused_on_cpu);
}

VqaOptimizer::~VqaOptimizer() = default;

bool VqaOptimizer::masks_on_device() const { return on_device_path_; }

void VqaOptimizer::undo_step_count() {
  if (shard_) {
    shard_->step = std::max<int64_t>(0, shard_->step - 1);
    return;
  }
  for (auto& entry : adamw_->state()) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*entry.second);
    state.step(std::max<int64_t>(0, state.step() - 1));
  }
}

int64_t VqaOptimizer::state_bytes() const {
  int64_t bytes = 0;
  if (shard_) {
    for (const auto& moments : {shard_->exp_avg, shard_->exp_avg_sq}) {
      for (const auto& tensor : moments) bytes += static_cast<int64_t>(tensor.nbytes());
    }
  }
  for (const auto& entry : adamw_->state()) {
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    if (state.exp_avg().defined()) bytes += static_cast<int64_t>(state.exp_avg().nbytes());
    if (state.exp_avg_sq().defined()) bytes += static_cast<int64_t>(state.exp_avg_sq().nbytes());
  }
  return bytes;
}

double VqaOptimizer::learning_rate(int64_t step) const {
  return settings_.lr * linear_schedule_factor(step, warmup_steps_, settings_.total_steps);
}

void VqaOptimizer::step(int64_t step, const torch::Tensor& found_inf) {
  const double lr = learning_rate(step);
  auto& groups = adamw_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    static_cast<torch::optim::AdamWOptions&>(groups[i].options()).lr(lr * multipliers_[i]);
  }
  TORCH_CHECK(!found_inf.defined() || on_device_path_,
              "a device skip flag needs the ATen fused AdamW path");
  if (shard_) {
    sharded_step(found_inf);
  } else if (on_device_path_) {
    aten_fused_step(found_inf);
  } else if (settings_.fused_cpu && fused_step_possible()) {
    fused_step();
  } else if (settings_.recipe == OptimizerRecipe::kM3ae) {
    transformers_step();
  } else {
    adamw_->step();
  }
}

}  // namespace vqa::train
