// The gradients between backward and the optimiser: the search for a
// non-finite one, the clip of their global norm, and a step whose skip was
// decided on the device, settled when the host learns of it.
#include <cstdio>
#include <string>

#include "runtime/check.h"  // fatal_user_error
#include "train/trainer.h"  // settle_deferred_skip, kMinLossScale, kExitNonFinite

namespace vqa::train {

std::string first_nonfinite_parameter(model::M3AE& model, bool check_values) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_parameters()) {
    const auto& tensor = check_values ? item.value() : item.value().grad();
    if (tensor.defined() && !torch::isfinite(tensor).all().item<bool>()) return item.key();
  }
  return "";
}

void clip_gradient_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) norms.push_back(parameter.grad().norm());
  }
  if (norms.empty()) return;
  const auto scale = (max_norm / (torch::stack(norms).norm() + 1e-6)).clamp_max(1.0);
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) parameter.grad().mul_(scale);
  }
}

std::string format_loss_scale(double scale) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", scale);
  return text;
}

int64_t settle_deferred_skip(TrainingParts& parts, DeferredSkip& deferred, int64_t& samples) {
  if (!deferred.flag.pending() || !deferred.flag.take()) return 0;
  const TrainConfig& config = parts.config;
  parts.optimizer.undo_step_count();
  samples -= deferred.samples;  // its loss never went in (masked on the device)
  const std::string where = "epoch " + std::to_string(deferred.epoch) + " optimiser step " +
                            std::to_string(deferred.step);
  if (parts.scaler) {
    // The scale now is what that step's overflow left (read only now, rarely).
    const double scale = parts.scaler->current_scale() / parts.scaler->options().backoff_factor;
    if (scale < kMinLossScale && config.nonfinite == NonFinite::kStop) {
      runtime::fatal_user_error("non-finite gradient at " + where + " even at loss scale " +
                                    format_loss_scale(scale) +
                                    ": not an fp16 overflow; stopping without a checkpoint of "
                                    "that step. Lower --lr, set --grad-clip, or --nonfinite skip",
                                kExitNonFinite);
    }
    parts.log.info("fp16 overflow at " + where + ": step skipped, loss scale " +
                   format_loss_scale(scale) + " -> " +
                   format_loss_scale(parts.scaler->current_scale()));
    return 1;
  }
  if (config.nonfinite == NonFinite::kStop) {
    runtime::fatal_user_error("non-finite gradient at " + where +
                                  " (found on the device, a step later; the weights never took "
                                  "it); stopping without a checkpoint of that step. Lower --lr, "
                                  "set --grad-clip, or --nonfinite skip",
                              kExitNonFinite);
  }
  parts.log.warn("non-finite gradient at " + where + ": step skipped");
  return 1;
}

}  // namespace vqa::train
