#include "train/loss_scaler.h"

namespace vqa::train {

LossScaler::LossScaler(const torch::Device& device, const LossScalerOptions& options)
    : options_(options),
      scale_(torch::full({}, options.initial_scale,
                         torch::TensorOptions().dtype(torch::kFloat32).device(device))),
      growth_tracker_(
          torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device))) {}

torch::Tensor LossScaler::scale(const torch::Tensor& loss) const {
  return loss.to(torch::kFloat32) * scale_;
}

torch::Tensor LossScaler::unscale_and_check(const std::vector<torch::Tensor>& gradients) const {
  torch::NoGradGuard no_grad;
  const auto inverse = scale_.reciprocal();
  std::vector<torch::Tensor> sums;
  for (const auto& gradient : gradients) {
    gradient.mul_(inverse);
    // A finite sum proves every value finite; finite values whose sum
    // overflows float32 (past 3.4e38, after unscaling) count as an overflow too.
    sums.push_back(gradient.sum());
  }
  if (sums.empty()) return torch::zeros({}, scale_.options().dtype(torch::kBool));
  return torch::logical_not(torch::isfinite(torch::stack(sums))).any();
}

void LossScaler::update(const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  const auto counted = growth_tracker_ + 1;
  const auto interval_done = counted >= options_.growth_interval;
  const auto larger = scale_ * options_.growth_factor;
  // As GradScaler: the count restarts at the interval, and the scale grows
  // only to a finite value.
  const auto grown =
      torch::where(interval_done.logical_and(torch::isfinite(larger)), larger, scale_);
  // In place: a CUDA graph (--cuda-graph) multiplies the loss by this very
  // tensor at every replay, so its storage must stay the same.
  scale_.copy_(torch::where(found_inf, scale_ * options_.backoff_factor, grown));
  growth_tracker_.copy_(torch::where(found_inf.logical_or(interval_done),
                                     torch::zeros_like(growth_tracker_), counted));
}

double LossScaler::current_scale() const { return scale_.item<double>(); }

int64_t LossScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void LossScaler::load(double scale, int64_t growth_tracker) {
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

}  // namespace vqa::train
