// M3AE's optimiser: AdamW (betas 0.9/0.98, eps 1e-8) with three learning-rate
// groups (encoders x1, fusion x5, head x50), no weight decay on biases and
// norm weights, and a linear warm-up then linear decay to 0, stepped every
// optimiser step.
//
// The parameter groups and the moments live in a torch::optim::AdamW, so
// checkpoints keep LibTorch's format. On the CPU the update itself is one
// fused pass per tensor (adamw_update_fused) instead of LibTorch's eight
// tensor operations and two temporaries per tensor: about 4x faster for the
// `small` preset on one core. Elsewhere, or with fused_cpu = false,
// torch::optim::AdamW::step runs.
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
  bool fused_cpu = true;    // false: LibTorch's AdamW::step on the CPU too
};

class VqaOptimizer {
 public:
  VqaOptimizer(model::M3AE& model, const OptimizerSettings& settings);

  // Sets every group's lr for optimiser step `step` (0-based), then steps
  // every parameter that has a gradient.
  void step(int64_t step);
  // The encoders' learning rate at `step` (the others are multiples of it).
  double learning_rate(int64_t step) const;

  torch::optim::AdamW& adamw() { return *adamw_; }

 private:
  bool fused_step_possible() const;
  void fused_step();

  OptimizerSettings settings_;
  int64_t warmup_steps_ = 0;
  std::vector<double> multipliers_;  // per parameter group
  std::unique_ptr<torch::optim::AdamW> adamw_;
};

// Linear warm-up over `warmup` steps from 0, then linear decay to 0 at
// `total` (the schedule of M3AE and of transformers' get_linear_schedule_with_warmup).
double linear_schedule_factor(int64_t step, int64_t warmup, int64_t total);

// One AdamW step of LibTorch's formula over n float32 values, in one pass:
//   p *= decay;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   p -= step_size m / (sqrt(v) / sqrt_bias_correction2 + eps)
// with decay = 1 - lr weight_decay and step_size = lr / bias_correction1.
// Splits the range over LibTorch's intra-op threads.
struct AdamWCoefficients {
  float decay, beta1, beta2, step_size, sqrt_bias_correction2, eps;
};
void adamw_update_fused(float* parameter, const float* gradient, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamWCoefficients& c);

}  // namespace vqa::train
