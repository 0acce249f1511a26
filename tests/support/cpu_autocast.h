// bf16 autocast of the CPU's operators for a scope, as the trainer's
// AutocastScope does (on the CPU too where it can): the tests of the bf16
// step run on the CPU.
// LibTorch 2.4 on: 1.13's CPU autocast cannot run this model (its CPU
// LayerNorm refuses bf16 input with float32 weights).
#pragma once

#include <ATen/autocast_mode.h>

#include <stdexcept>

#include "model/autocast_state.h"  // autocast_enable, kCpuAutocastRunsTheModel

namespace vqa::testing {

using vqa::model::kCpuAutocastRunsTheModel;

class CpuAutocast {
 public:
  explicit CpuAutocast(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
#ifdef VQA_AUTOCAST_BY_DEVICE
    vqa::model::autocast_enable(at::kCPU, at::kBFloat16);
#else
    throw std::runtime_error("bf16 CPU autocast of the model needs LibTorch 2.4 or later");
#endif
  }
  ~CpuAutocast() {
    if (!enabled_) return;
#ifdef VQA_AUTOCAST_BY_DEVICE
    vqa::model::autocast_disable(at::kCPU);
    at::autocast::clear_cache();
#endif
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  bool enabled_;
};

}  // namespace vqa::testing
