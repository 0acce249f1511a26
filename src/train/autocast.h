// bfloat16 autocast for the forward pass on GPU (--bf16-autocast), restored
// on scope exit; a no-op when disabled.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

// LibTorch 2.4 made the autocast calls take the device type and deprecated
// the CUDA-only set_enabled / set_autocast_gpu_dtype that 1.x has.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define VQA_AUTOCAST_BY_DEVICE 1
#endif

namespace vqa::train {

class AutocastScope {
 public:
  explicit AutocastScope(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
#ifdef VQA_AUTOCAST_BY_DEVICE
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
#else
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
#endif
  }
  ~AutocastScope() {
    if (!enabled_) return;
#ifdef VQA_AUTOCAST_BY_DEVICE
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#else
    at::autocast::set_enabled(false);
#endif
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
};

}  // namespace vqa::train
