// The operators one CPU training step dispatches on one rank (batch 2, one
// thread, --grad-clip on), held by train_op_count, which counts them with
// RecordFunction callbacks: the `small` preset in float32, and the `base`
// preset (64 px, packed q, k and v) in float32 with LibTorch 1.13 and under
// bf16 CPU autocast with 2.6. train_profile's profiled vqa_train step of
// `small` must come within 25% of the small counts (its batches have other
// sizes). They depend on
// the LibTorch version (each decomposes operators its own way): the numbers
// below are per version, and a version without numbers has none held.
//
// To update them after a change that dispatches more or fewer operators:
// run `ctest -R '^train_op_count$' --output-on-failure`, copy the counts it
// prints into the row of the LibTorch version it ran with ({forward,
// backward, autograd nodes, after backward}), and the 1.13 row into
// docs/benchmarks.md ("Operators per step").
#pragma once

#include <torch/version.h>

#include <cstdint>

namespace vqa::testing {

struct StepOperatorCounts {
  int64_t forward = 0;         // aten operators of the forward with the loss
  int64_t backward = 0;        // aten operators of loss.backward()
  int64_t autograd_nodes = 0;  // autograd nodes loss.backward() ran
  // aten operators after backward: averaging, finite check, clipping, optimiser
  int64_t after_backward = 0;
  constexpr int64_t total() const { return forward + backward + after_backward; }
  constexpr bool operator==(const StepOperatorCounts& other) const {
    return forward == other.forward && backward == other.backward &&
           autograd_nodes == other.autograd_nodes && after_backward == other.after_backward;
  }
};

struct HeldOperatorCounts {
  const char* libtorch;         // the version they were counted with
  StepOperatorCounts separate;  // q, k and v projected apart (the CPU's default)
  StepOperatorCounts packed;    // --packed-attention: q, k and v in one GEMM
  StepOperatorCounts base;      // `base`, packed: float32 (1.13), bf16 autocast (2.6)
};

#if TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR == 13
inline constexpr bool kOperatorCountsHeld = true;
inline constexpr HeldOperatorCounts kHeldOperatorCounts{
    "1.13", {4944, 9955, 1129, 40}, {4656, 9359, 1037, 40}, {27193, 51825, 3032, 40}};
#elif TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 6
inline constexpr bool kOperatorCountsHeld = true;
inline constexpr HeldOperatorCounts kHeldOperatorCounts{
    "2.6", {2263, 4838, 833, 65}, {1963, 4174, 741, 65}, {25569, 43057, 3114, 65}};
#else
inline constexpr bool kOperatorCountsHeld = false;
inline constexpr HeldOperatorCounts kHeldOperatorCounts{"none", {}, {}, {}};
#endif

}  // namespace vqa::testing
