// bfloat16 autocast for the forward pass on GPU (--bf16-autocast), restored
// on scope exit; a no-op when disabled.
#pragma once

#include <ATen/autocast_mode.h>

namespace vqa::train {

class AutocastScope {
 public:
  explicit AutocastScope(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
  }
  ~AutocastScope() {
    if (!enabled_) return;
    at::autocast::set_enabled(false);
    at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
};

}  // namespace vqa::train
