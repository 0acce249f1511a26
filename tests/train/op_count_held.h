// The operators one CPU training step of the `small` preset dispatches
// (batch 2, float32, one thread), held by train_op_count, which counts them
// with RecordFunction callbacks, and by train_profile, whose profiled
// vqa_train step must come within 25% of them (its batches have other
// sizes). They depend on
// the LibTorch version (each decomposes operators its own way): the numbers
// below are per version, and a version without numbers has none held.
//
// To update them after a change that dispatches more or fewer operators:
// run `ctest -R '^train_op_count$' --output-on-failure`, copy the counts it
// prints into the row of the LibTorch version it ran with, and the 1.13 row
// into docs/benchmarks.md ("Operators per step").
#pragma once

#include <torch/version.h>

#include <cstdint>

namespace vqa::testing {

struct StepOperatorCounts {
  int64_t forward = 0;         // aten operators of the forward with the loss
  int64_t backward = 0;        // aten operators of loss.backward()
  int64_t autograd_nodes = 0;  // autograd nodes loss.backward() ran
  int64_t optimizer = 0;       // aten operators of one optimiser step
  constexpr int64_t total() const { return forward + backward + optimizer; }
  constexpr bool operator==(const StepOperatorCounts& other) const {
    return forward == other.forward && backward == other.backward &&
           autograd_nodes == other.autograd_nodes && optimizer == other.optimizer;
  }
};

struct HeldOperatorCounts {
  const char* libtorch;         // the version they were counted with
  StepOperatorCounts separate;  // q, k and v projected apart (the CPU's default)
  StepOperatorCounts packed;    // --packed-attention: q, k and v in one GEMM
};

#if TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR == 13
inline constexpr bool kOperatorCountsHeld = true;
inline constexpr HeldOperatorCounts kHeldOperatorCounts{
    "1.13", {4732, 9883, 1219, 2126}, {4716, 9431, 1127, 2126}};
#elif TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 6
inline constexpr bool kOperatorCountsHeld = true;
inline constexpr HeldOperatorCounts kHeldOperatorCounts{
    "2.6", {2289, 5036, 987, 2126}, {2289, 4516, 895, 2126}};
#else
inline constexpr bool kOperatorCountsHeld = false;
inline constexpr HeldOperatorCounts kHeldOperatorCounts{"none", {}, {}};
#endif

}  // namespace vqa::testing
