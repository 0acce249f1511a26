// Autocast of the forward pass (--precision bf16 or fp16) for a scope,
// restored on its exit: on a GPU in either dtype; on the CPU in bf16 where
// LibTorch's CPU autocast runs the model (2.4 on); float32 otherwise.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include "model/autocast_state.h"  // autocast_enable, autocast_disable, kCpuAutocastRunsTheModel

namespace vqa::train {

// Whether the forward on `device` computes under autocast in `dtype`
// (at::kBFloat16 or at::kHalf; at::kFloat: never). fp16 on the CPU does not:
// there the loss scaler runs around float32 compute.
inline bool autocast_runs(const torch::Device& device, at::ScalarType dtype) {
  if (dtype == at::kFloat) return false;
  if (device.is_cuda()) return true;
  return device.is_cpu() && dtype == at::kBFloat16 && model::kCpuAutocastRunsTheModel;
}

class AutocastScope {
 public:
  // dtype: at::kBFloat16 or at::kHalf to autocast, at::kFloat for none.
  // cache = false inside a CUDA graph's capture: autocast's cache of the
  // weights' casts would otherwise keep tensors of the capture alive past it
  // (PyTorch's torch.cuda.graph asks for cache_enabled=False likewise).
  AutocastScope(const torch::Device& device, at::ScalarType dtype, bool cache = true)
      : enabled_(autocast_runs(device, dtype)), device_type_(device.type()) {
    if (!enabled_) return;
    cache_before_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(cache);
    vqa::model::autocast_enable(device_type_, dtype);
  }
  ~AutocastScope() {
    if (!enabled_) return;
    vqa::model::autocast_disable(device_type_);
    at::autocast::clear_cache();
    at::autocast::set_autocast_cache_enabled(cache_before_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
  c10::DeviceType device_type_;
  bool cache_before_ = true;
};

}  // namespace vqa::train
