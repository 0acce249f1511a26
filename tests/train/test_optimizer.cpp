// The learning-rate schedule, the optimiser's parameter groups and its fused update.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "model/m3ae.h"       // M3AE, model_config_preset
#include "train/optimizer.h"  // VqaOptimizer, linear_schedule_factor
#include "train/trainer.h"    // clip_gradient_norm

namespace {

// The tiny preset with a small vocabulary and 5 answers, seeded.
vqa::model::M3AE tiny_model() {
  auto config = vqa::model::model_config_preset("tiny");
  config.vocab_size = 30;
  config.num_answers = 5;
  torch::manual_seed(0);
  return vqa::model::M3AE(config);
}

TEST(Schedule, LinearWarmupThenLinearDecayToZero) {
  // 100 steps, 10 of warm-up: 0 at step 0, 0.5 at 5, 1 at 10, 0.5 at 55, 0 at 100.
  EXPECT_DOUBLE_EQ(vqa::train::linear_schedule_factor(0, 10, 100), 0.0);
  EXPECT_DOUBLE_EQ(vqa::train::linear_schedule_factor(5, 10, 100), 0.5);
  EXPECT_DOUBLE_EQ(vqa::train::linear_schedule_factor(10, 10, 100), 1.0);
  EXPECT_DOUBLE_EQ(vqa::train::linear_schedule_factor(55, 10, 100), 0.5);
  EXPECT_DOUBLE_EQ(vqa::train::linear_schedule_factor(100, 10, 100), 0.0);
  EXPECT_DOUBLE_EQ(vqa::train::linear_schedule_factor(150, 10, 100), 0.0);
  // No warm-up: starts at 1.
  EXPECT_DOUBLE_EQ(vqa::train::linear_schedule_factor(0, 0, 10), 1.0);
}

TEST(Optimizer, GroupsGetTheirMultipliersAndDecay) {
  vqa::model::M3AE model = tiny_model();
  vqa::train::OptimizerSettings settings;
  settings.lr = 1e-3;
  settings.total_steps = 100;
  settings.warmup_ratio = 0.1;
  vqa::train::VqaOptimizer optimizer(model, settings);
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  optimizer.step(/*step=*/10);  // end of warm-up: factor 1

  // Group lr / base lr must be 1, 5 or 50; weight decay 0.01 or 0 (exact: set, not computed).
  int64_t grouped = 0;
  for (auto& group : optimizer.adamw().param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const double multiplier = options.lr() / settings.lr;
    EXPECT_TRUE(std::abs(multiplier - 1) < 1e-12 || std::abs(multiplier - 5) < 1e-12 ||
                std::abs(multiplier - 50) < 1e-12)
        << multiplier;
    EXPECT_TRUE(options.weight_decay() == 0.01 || options.weight_decay() == 0.0);
    EXPECT_EQ(std::get<0>(options.betas()), 0.9);
    EXPECT_EQ(std::get<1>(options.betas()), 0.98);
    grouped += static_cast<int64_t>(group.params().size());
  }
  EXPECT_EQ(grouped, static_cast<int64_t>(model->parameters().size()));
  EXPECT_DOUBLE_EQ(optimizer.learning_rate(10), 1e-3);
  EXPECT_NEAR(optimizer.learning_rate(55), 0.5e-3, 1e-15);
}

// The fused CPU update against LibTorch's AdamW::step: two copies of one
// model with the same gradients, three steps with weight decay, three lr
// groups and warm-up, then one LibTorch step on both, which must find the
// fused optimiser's moments under its own keys.
// Tolerance: 2e-6 relative to the largest value of each tensor, as the two
// round differently (one fused expression against eight float32 operations).
TEST(Optimizer, FusedCpuStepMatchesLibTorchAdamW) {
  vqa::model::M3AE fused_model = tiny_model();
  vqa::model::M3AE torch_model = tiny_model();  // the same seed; copied below all the same
  {
    torch::NoGradGuard no_grad;
    auto source = fused_model->parameters();
    auto target = torch_model->parameters();
    for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
  }
  vqa::train::OptimizerSettings settings;
  settings.lr = 1e-3;
  settings.total_steps = 10;
  settings.warmup_ratio = 0.2;
  settings.weight_decay = 0.1;
  vqa::train::VqaOptimizer fused(fused_model, settings);
  settings.fused_cpu = false;
  vqa::train::VqaOptimizer reference(torch_model, settings);

  auto compare = [&](const char* when) {
    auto got = fused_model->named_parameters();
    auto want = torch_model->named_parameters();
    double worst = 0.0;
    for (const auto& item : want) {
      const auto& a = got[item.key()];
      const auto& b = item.value();
      const double scale = std::max(b.abs().max().item<double>(), 1e-12);
      worst = std::max(worst, (a - b).abs().max().item<double>() / scale);
      ASSERT_LT((a - b).abs().max().item<double>() / scale, 2e-6) << item.key() << " " << when;
    }
    std::printf("%s: largest relative difference %.3g\n", when, worst);
  };
  auto same_random_gradients = [&] {
    auto fused_parameters = fused_model->parameters();
    auto torch_parameters = torch_model->parameters();
    for (size_t i = 0; i < fused_parameters.size(); ++i) {
      const auto gradient = torch::randn_like(fused_parameters[i]);
      fused_parameters[i].mutable_grad() = gradient.clone();
      torch_parameters[i].mutable_grad() = gradient.clone();
    }
  };
  for (int64_t step = 1; step <= 3; ++step) {  // step 0 has lr 0 under warm-up
    same_random_gradients();
    fused.step(step);
    reference.step(step);
    compare(("step " + std::to_string(step)).c_str());
  }
  // LibTorch's own step on both, the fused side from the fused moments (at
  // the learning rates step 3 set).
  same_random_gradients();
  fused.adamw().step();
  reference.adamw().step();
  compare("LibTorch step after fused steps");
}

TEST(Clipping, ScalesTheGlobalNormDownAndLeavesSmallerNormsAlone) {
  auto a = torch::zeros({1}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.f});
  b.mutable_grad() = torch::tensor({4.f});  // global norm 5
  vqa::train::clip_gradient_norm({a, b}, /*max_norm=*/1.0);
  // 3/5 and 4/5, up to the 1e-6 guard in the denominator: 1e-6 absolute.
  EXPECT_NEAR(a.grad().item<float>(), 0.6f, 1e-6);
  EXPECT_NEAR(b.grad().item<float>(), 0.8f, 1e-6);
  vqa::train::clip_gradient_norm({a, b}, /*max_norm=*/10.0);
  EXPECT_NEAR(a.grad().item<float>(), 0.6f, 1e-6);
}

}  // namespace
