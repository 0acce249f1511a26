// Autocast of the forward pass on GPU (--precision bf16 or fp16), restored
// on scope exit; a no-op on the CPU and for float32.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include "model/autocast_state.h"  // autocast_enable, autocast_disable (LibTorch's version switch)

namespace vqa::train {

class AutocastScope {
 public:
  // dtype: at::kBFloat16 or at::kHalf to autocast, at::kFloat for none.
  // cache = false inside a CUDA graph's capture: autocast's cache of the
  // weights' casts would otherwise keep tensors of the capture alive past it
  // (PyTorch's torch.cuda.graph asks for cache_enabled=False likewise).
  AutocastScope(const torch::Device& device, at::ScalarType dtype, bool cache = true)
      : enabled_(device.is_cuda() && dtype != at::kFloat) {
    if (!enabled_) return;
    cache_before_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(cache);
    vqa::model::autocast_enable(at::kCUDA, dtype);
  }
  ~AutocastScope() {
    if (!enabled_) return;
    vqa::model::autocast_disable(at::kCUDA);
    at::autocast::clear_cache();
    at::autocast::set_autocast_cache_enabled(cache_before_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
  bool cache_before_ = true;
};

}  // namespace vqa::train
