// What the optimiser's files share (optimizer.cpp, adamw_steps.cpp,
// optimizer_shard.cpp): the key of LibTorch's state map, a parameter's state
// in it, the fused pass's coefficients and ZeRO-1's sharded state. Private to
// those files.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "train/adamw_update.h"  // AdamWCoefficients
#include "train/optimizer.h"     // VqaOptimizer, OptimizerSettings
#include "train/shard_layout.h"  // ShardBucket

// ATen's fused AdamW with CPU and CUDA kernels and found_inf: LibTorch 2.4 on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define VQA_ATEN_FUSED_ADAMW 1
#endif

namespace vqa::train {

// The key under which torch::optim::Optimizer keeps a parameter's state: the
// address of its TensorImpl, as a string in LibTorch 1.x and as a pointer in 2.x.
template <typename Key>
Key optimizer_state_key(const torch::Tensor& parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(parameter.unsafeGetTensorImpl());
    return key.str();
  } else {
    return static_cast<Key>(parameter.unsafeGetTensorImpl());
  }
}

// A parameter's AdamW state in LibTorch's map, created (zero moments) on first use.
torch::optim::AdamWParamState& adamw_state_of(torch::optim::AdamW& adamw,
                                              const torch::Tensor& parameter);

// The fused pass's coefficients for a group at step `step` (1-based):
// LibTorch's AdamW, or transformers' (the m3ae recipe).
AdamWCoefficients fused_coefficients(const torch::optim::AdamWOptions& options, int64_t step,
                                     bool transformers);

// ZeRO-1's state (VqaOptimizer::shard): a run of one parameter inside one
// bucket's owned range.
struct ShardSegment {
  int64_t bucket = 0;
  int64_t offset = 0;  // elements into the bucket's flat buffers
  int64_t length = 0;
  int64_t parameter_offset = 0;  // elements into the parameter
  size_t group = 0;              // index into adamw().param_groups()
  torch::Tensor parameter;
};

struct VqaOptimizer::ShardState {
  std::vector<ShardBucket> buckets;
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;  // per bucket: its owned range
  std::vector<ShardSegment> segments;              // in bucket order
  std::function<void(int64_t)> after_bucket;
  int64_t step = 0;           // optimiser steps taken (every parameter steps every step)
  torch::Tensor device_step;  // the same count on the device (ATen's fused AdamW reads it)
  bool took_loaded_state = false;
};

}  // namespace vqa::train
