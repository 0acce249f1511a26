// The fp16 loss scaler (src/train/loss_scaler.h) step by step against the
// rule of PyTorch's GradScaler (torch.cuda.amp, _amp_update_scale_): start
// at 2^16; an overflow halves the scale and restarts the count; `interval`
// finite steps in a row double it. Scaling and unscaling by powers of two
// are exact, so every comparison is exact (tolerance 0).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "train/loss_scaler.h"

namespace {

using vqa::train::LossScaler;
using vqa::train::LossScalerOptions;

TEST(LossScaler, UnscalesExactlyAndFindsInfinitiesAndNaNs) {
  LossScaler scaler(torch::kCPU);
  EXPECT_EQ(scaler.current_scale(), 65536.0);
  const auto loss = torch::tensor(0.75f);
  EXPECT_EQ(scaler.scale(loss).item<float>(), 0.75f * 65536.0f);

  torch::manual_seed(0);
  const auto original = torch::randn({1000});
  auto gradient = original * 65536.0f;
  auto other = torch::randn({7}) * 65536.0f;
  const auto found = scaler.unscale_and_check({gradient, other});
  EXPECT_EQ(found.scalar_type(), torch::kBool);
  EXPECT_FALSE(found.item<bool>());
  EXPECT_TRUE(torch::equal(gradient, original));

  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto broken = torch::ones({100});
    broken[57] = bad;
    EXPECT_TRUE(scaler.unscale_and_check({torch::ones({3}), broken}).item<bool>()) << bad;
  }
  EXPECT_FALSE(scaler.unscale_and_check({}).item<bool>());
}

TEST(LossScaler, OverflowHalvesGrowthDoublesAfterTheInterval) {
  LossScalerOptions options;
  options.growth_interval = 3;
  LossScaler scaler(torch::kCPU, options);
  const auto finite = torch::tensor(false), overflow = torch::tensor(true);
  // GradScaler's rule written out: (found_inf, scale after, count after).
  struct Step {
    bool inf;
    double scale;
    int64_t count;
  };
  const std::vector<Step> steps = {
      {false, 65536, 1}, {false, 65536, 2}, {false, 131072, 0},  // grows at the 3rd
      {true, 65536, 0},                                          // overflow: halves
      {false, 65536, 1}, {true, 32768, 0},                       // the count restarts
      {false, 32768, 1}, {false, 32768, 2}, {false, 65536, 0},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    scaler.update(steps[i].inf ? overflow : finite);
    EXPECT_EQ(scaler.current_scale(), steps[i].scale) << "step " << i;
    EXPECT_EQ(scaler.growth_tracker(), steps[i].count) << "step " << i;
  }
  // The scale never grows past float32's range; the count restarts anyway.
  scaler.load(std::ldexp(1.0, 127), 2);
  scaler.update(finite);
  EXPECT_EQ(scaler.current_scale(), std::ldexp(1.0, 127));
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // load() restores a checkpoint's state.
  scaler.load(1024.0, 2);
  scaler.update(finite);
  EXPECT_EQ(scaler.current_scale(), 2048.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

}  // namespace
