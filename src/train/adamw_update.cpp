#include "train/adamw_update.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace vqa::train {

namespace {

// The loop GCC and Clang vectorise: no aliasing, and sqrt without errno
// (this file is compiled with -fno-math-errno, see CMakeLists.txt). The
// formula is a template parameter, so that the loop has no branch.
template <bool kDecayAfterStep>
void adamw_update_range(float* __restrict parameter, const float* __restrict gradient,
                        float* __restrict exp_avg, float* __restrict exp_avg_sq, int64_t n,
                        const AdamWCoefficients c) {
  const float one_minus_beta1 = 1.0f - c.beta1;
  const float one_minus_beta2 = 1.0f - c.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gradient[i];
    const float m = exp_avg[i] * c.beta1 + one_minus_beta1 * g;
    const float v = exp_avg_sq[i] * c.beta2 + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
    if constexpr (kDecayAfterStep) {
      parameter[i] = (parameter[i] - c.step_size * (m / denom)) * c.decay;
    } else {
      parameter[i] = parameter[i] * c.decay - c.step_size * (m / denom);
    }
  }
}

}  // namespace

void adamw_update_fused(float* parameter, const float* gradient, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamWCoefficients& c) {
  constexpr int64_t kGrain = 1 << 15;  // values per task: a few tens of microseconds
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    if (c.decay_after_step) {
      adamw_update_range<true>(parameter + begin, gradient + begin, exp_avg + begin,
                               exp_avg_sq + begin, end - begin, c);
    } else {
      adamw_update_range<false>(parameter + begin, gradient + begin, exp_avg + begin,
                                exp_avg_sq + begin, end - begin, c);
    }
  });
}

}  // namespace vqa::train
