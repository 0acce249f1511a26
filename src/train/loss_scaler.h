// Dynamic loss scaling for --precision fp16, as PyTorch's GradScaler does it
// (and M3AE's Lightning precision=16 through it): the loss is multiplied by
// the scale before backward, so that small float16 gradients do not flush to
// zero; after the allreduce the gradients are divided by it (before any
// clipping) and checked. A non-finite gradient anywhere (an overflow) skips
// the optimiser step and halves the scale; kGrowthInterval finite steps in a
// row double it. It starts at 2^16.
//
// The scale and the count of finite steps live on the model's device, so
// neither scaling nor the update waits for the host. The decision is made
// from the averaged gradients, which are the same on every rank, so every
// rank skips the same steps and keeps the same scale. The state goes into
// checkpoints (TrainState::loss_scale, loss_scale_growth).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace vqa::train {

struct LossScalerOptions {
  double initial_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // finite steps in a row before the scale grows
};

class LossScaler {
 public:
  LossScaler(const torch::Device& device, const LossScalerOptions& options = {});

  // loss x scale (float32), for backward.
  torch::Tensor scale(const torch::Tensor& loss) const;
  // Divides every gradient by the scale in place and returns a 0-dim bool
  // tensor on the device: true when any of them is not finite.
  torch::Tensor unscale_and_check(const std::vector<torch::Tensor>& gradients) const;
  // After a step: halves the scale and resets the count when `found_inf`,
  // else counts the step and grows the scale at the interval. Device
  // operations only.
  void update(const torch::Tensor& found_inf);

  // The state as numbers (reads the device: for logs and checkpoints).
  double current_scale() const;
  int64_t growth_tracker() const;
  void load(double scale, int64_t growth_tracker);
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  torch::Tensor scale_;           // float32, 0-dim, on the device
  torch::Tensor growth_tracker_;  // int64, 0-dim: finite steps since the last change
};

}  // namespace vqa::train
