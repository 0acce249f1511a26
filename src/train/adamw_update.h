// The fused AdamW update: one pass over float32 values instead of LibTorch's
// eight tensor operations and two temporaries per tensor. In its own file
// because it is compiled with -fno-math-errno (src/train/CMakeLists.txt), the
// flag that lets the loop vectorise, and that file includes no more of
// LibTorch than ATen's parallel_for.
#pragma once

#include <cstdint>

namespace vqa::train {

// One AdamW step over n float32 values, in one pass:
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   u = step_size m / (sqrt(v) / sqrt_bias_correction2 + eps)
//   LibTorch's formula:      p = p decay - u
//   transformers' formula:   p = (p - u) decay       (decay_after_step)
// with decay = 1 - lr weight_decay; LibTorch: step_size = lr /
// bias_correction1; transformers: sqrt_bias_correction2 = 1 and step_size =
// lr sqrt(bias_correction2) / bias_correction1.
// Splits the range over LibTorch's intra-op threads.
struct AdamWCoefficients {
  float decay, beta1, beta2, step_size, sqrt_bias_correction2, eps;
  bool decay_after_step = false;
};
void adamw_update_fused(float* parameter, const float* gradient, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamWCoefficients& c);

}  // namespace vqa::train
