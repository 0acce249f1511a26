// M3AE's optimiser: AdamW (betas 0.9/0.98, eps 1e-8) with three learning-rate
// groups (encoders x1, fusion x5, head x50), no weight decay on biases and
// norm weights, and a linear warm-up then linear decay to 0, stepped every
// optimiser step.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "model/m3ae.h"  // M3AE, model_parameter_groups

namespace vqa::train {

struct OptimizerSettings {
  double lr = 5e-5;
  double fusion_multiplier = 5.0;
  double head_multiplier = 50.0;
  double weight_decay = 0.01;
  double warmup_ratio = 0.1;
  int64_t total_steps = 1;  // optimiser steps over the whole run
};

class VqaOptimizer {
 public:
  VqaOptimizer(model::M3AE& model, const OptimizerSettings& settings);

  // Sets every group's lr for optimiser step `step` (0-based), then steps.
  void step(int64_t step);
  void zero_grad();
  // The encoders' learning rate at `step` (the others are multiples of it).
  double learning_rate(int64_t step) const;

  torch::optim::AdamW& adamw() { return *adamw_; }

 private:
  OptimizerSettings settings_;
  int64_t warmup_steps_ = 0;
  std::vector<double> multipliers_;  // per parameter group
  std::unique_ptr<torch::optim::AdamW> adamw_;
};

// Linear warm-up over `warmup` steps from 0, then linear decay to 0 at
// `total` (the schedule of M3AE and of transformers' get_linear_schedule_with_warmup).
double linear_schedule_factor(int64_t step, int64_t warmup, int64_t total);

}  // namespace vqa::train
