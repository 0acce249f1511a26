// The learning-rate schedule, the optimiser's parameter groups and its fused update.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/m3ae.h"       // M3AE, model_config_preset
#include "tiny_m3ae.h"        // tiny_m3ae_model
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

// M3AE's set_schedule on M3AE's names: what it decays and which lr it gives,
// for parameters where its rules differ from the vqa-hpc recipe's.
TEST(Optimizer, M3aeRecipeGroupsByM3aeNames) {
  vqa::model::M3AE model = tiny_m3ae_model();
  vqa::train::OptimizerSettings settings;
  settings.recipe = vqa::train::OptimizerRecipe::kM3ae;
  settings.lr = 1e-3;
  settings.total_steps = 100;
  settings.warmup_ratio = 0.1;
  vqa::train::VqaOptimizer optimizer(model, settings);
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  optimizer.step(/*step=*/10);  // the end of warm-up: floor(0.1 x 100) = 10, factor 1
  EXPECT_DOUBLE_EQ(optimizer.learning_rate(10), 1e-3);
  EXPECT_DOUBLE_EQ(optimizer.learning_rate(5), 0.5e-3);
  auto group_of = [&](const std::string& name) {
    const auto* impl = model->named_parameters()[name].unsafeGetTensorImpl();
    for (auto& group : optimizer.adamw().param_groups()) {
      for (auto& p : group.params()) {
        if (p.unsafeGetTensorImpl() == impl) {
          const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
          return std::make_pair(o.lr() / settings.lr, o.weight_decay());
        }
      }
    }
    ADD_FAILURE() << name << " is in no group";
    return std::make_pair(0.0, -1.0);
  };
  const std::vector<std::tuple<std::string, double, double>> expected = {
      // modality_type_embeddings has no "multi_modal" in its name: lr x1.
      {"fusion.modality_type_embeddings.weight", 1, 0.01},
      {"fusion.text_layers.0.cross_attention.in_weight", 5, 0.01},  // query, key, value weights
      {"fusion.text_layers.0.feed_forward_norm.weight", 5, 0.0},    // ...output.LayerNorm.weight
      {"head.text_pooler.weight", 5, 0.01},                         // multi_modal_language_pooler
      {"head.dense.weight", 50, 0.01},                              // vqa_head.0
      {"head.norm.weight", 50, 0.01},                               // vqa_head.1.weight: decayed
      {"head.norm.bias", 50, 0.0},
      {"vision.input_norm.weight", 1, 0.01},  // CLIP's ln_pre.weight: decayed
      {"vision.position_embeddings", 1, 0.01},
      {"vision.blocks.0.attention.query_bias", 1, 0.0},  // in_proj_bias
      {"text.embedding_norm.weight", 1, 0.0},            // embeddings.LayerNorm.weight
      {"text.token_type_embeddings.weight", 1, 0.01},
  };
  for (const auto& [name, multiplier, decay] : expected) {
    const auto [got_multiplier, got_decay] = group_of(name);
    EXPECT_NEAR(got_multiplier, multiplier, 1e-12) << name;
    EXPECT_EQ(got_decay, decay) << name;
  }
}

// transformers' AdamW (correct_bias) step by step in double precision,
// written from its source independently of optimizer.cpp:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  denom = sqrt(v) + eps
//   p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / denom;  p -= lr wd p
struct ReferenceAdamW {
  torch::Tensor p, m, v;
  int64_t t = 0;
  void step(const torch::Tensor& g, double lr, double wd) {
    const double b1 = 0.9, b2 = 0.98, eps = 1e-8;
    ++t;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const auto denom = v.sqrt() + eps;
    p = p - lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)) * m / denom;
    p = p - lr * wd * p;
  }
};

// Both m3ae-recipe paths (the fused CPU pass and the tensor operations that
// run elsewhere) against that reference over 3 steps with warm-up, three lr
// groups and weight decay. Gradients of 1e-5 make eps matter (it sits
// outside the bias correction here, inside it in LibTorch's formula) and a
// large lr x decay makes the order of decay and step matter: LibTorch's
// formula misses by more than 1e-3. Tolerance: 2e-6 relative to each
// tensor's largest value (float32 against double).
TEST(Optimizer, M3aeRecipeFollowsTransformersAdamW) {
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused CPU pass" : "tensor operations");
    vqa::model::M3AE model = tiny_m3ae_model();
    vqa::train::OptimizerSettings settings;
    settings.recipe = vqa::train::OptimizerRecipe::kM3ae;
    settings.lr = 1e-2;
    settings.total_steps = 10;
    settings.warmup_ratio = 0.2;
    settings.weight_decay = 0.5;
    settings.fused_cpu = fused;
    vqa::train::VqaOptimizer optimizer(model, settings);
    std::map<std::string, ReferenceAdamW> reference;
    for (const auto& item : model->named_parameters()) {
      const auto p = item.value().detach().to(torch::kFloat64).clone();
      reference[item.key()] = {p, torch::zeros_like(p), torch::zeros_like(p)};
    }
    torch::manual_seed(1);
    double worst = 0.0;
    for (int64_t step = 1; step <= 3; ++step) {
      for (const auto& item : model->named_parameters()) {
        item.value().mutable_grad() = 1e-5 * torch::randn_like(item.value());
      }
      optimizer.step(step);
      // The lr (schedule x group multiplier) and decay each group stepped with.
      std::map<const void*, std::pair<double, double>> group;
      for (auto& g : optimizer.adamw().param_groups()) {
        const auto& o = static_cast<const torch::optim::AdamWOptions&>(g.options());
        for (auto& p : g.params()) group[p.unsafeGetTensorImpl()] = {o.lr(), o.weight_decay()};
      }
      for (const auto& item : model->named_parameters()) {
        const auto [lr, decay] = group[item.value().unsafeGetTensorImpl()];
        auto& r = reference[item.key()];
        r.step(item.value().grad().to(torch::kFloat64), lr, decay);
        const double scale = std::max(r.p.abs().max().item<double>(), 1e-12);
        const double error = (item.value().to(torch::kFloat64) - r.p).abs().max().item<double>();
        worst = std::max(worst, error / scale);
        ASSERT_LT(error / scale, 2e-6) << item.key() << " step " << step;
      }
    }
    std::printf(
        "m3ae recipe (%s) against transformers' formula: largest relative difference %.3g\n",
        fused ? "fused" : "tensor ops", worst);
  }
}

// ATen's fused AdamW (the GPU path, at::_fused_adamw_, LibTorch 2.4 on),
// run on the CPU: for both recipes it matches the fused CPU pass (itself
// checked against LibTorch's AdamW and transformers' formula above) to 2e-6
// relative over 3 steps; a step whose device flag says "skip" leaves every
// parameter and moment exactly as it was, and after undo_step_count() the
// next step matches a run that never took the skipped one.
TEST(Optimizer, AtenFusedStepMatchesTheCpuPassAndSkipsOnTheDeviceFlag) {
  if (!vqa::train::aten_fused_adamw_available()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no at::_fused_adamw_ (2.4 on)";
  }
  for (const auto recipe :
       {vqa::train::OptimizerRecipe::kVqaHpc, vqa::train::OptimizerRecipe::kM3ae}) {
    SCOPED_TRACE(vqa::util::mode_name(recipe, vqa::train::kOptimizerRecipeNames));
    vqa::model::M3AE aten_model = tiny_m3ae_model();
    vqa::model::M3AE cpu_model = tiny_m3ae_model();
    {
      torch::NoGradGuard no_grad;
      auto source = aten_model->parameters();
      auto target = cpu_model->parameters();
      for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
    }
    vqa::train::OptimizerSettings settings;
    settings.recipe = recipe;
    settings.lr = 1e-2;
    settings.total_steps = 10;
    settings.warmup_ratio = 0.2;
    settings.weight_decay = 0.5;
    vqa::train::VqaOptimizer cpu(cpu_model, settings);
    settings.aten_fused_on_cpu = true;
    vqa::train::VqaOptimizer aten(aten_model, settings);
    EXPECT_TRUE(aten.masks_on_device());
    EXPECT_FALSE(cpu.masks_on_device());

    auto compare = [&](const std::string& when) {
      auto got = aten_model->named_parameters();
      for (const auto& item : cpu_model->named_parameters()) {
        const auto& want = item.value();
        const double scale = std::max(want.abs().max().item<double>(), 1e-12);
        ASSERT_LT((got[item.key()] - want).abs().max().item<double>() / scale, 2e-6)
            << item.key() << " " << when;
      }
    };
    torch::manual_seed(1);
    auto gradients = [&] {
      auto a = aten_model->parameters();
      auto c = cpu_model->parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        const auto gradient = 1e-3 * torch::randn_like(a[i]);
        a[i].mutable_grad() = gradient.clone();
        c[i].mutable_grad() = gradient.clone();
      }
    };
    for (int64_t step = 1; step <= 3; ++step) {
      gradients();
      aten.step(step, torch::tensor(false));
      cpu.step(step);
      compare("step " + std::to_string(step));
    }
    // Skipped on the device: nothing moves.
    std::vector<torch::Tensor> before;
    for (const auto& p : aten_model->parameters()) before.push_back(p.detach().clone());
    std::vector<torch::Tensor> moments_before;
    for (const auto& entry : aten.adamw().state()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
      moments_before.push_back(state.exp_avg().clone());
      moments_before.push_back(state.exp_avg_sq().clone());
    }
    gradients();
    aten_model->parameters()[0].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
    aten.step(4, torch::tensor(true));
    size_t k = 0;
    for (const auto& p : aten_model->parameters()) EXPECT_TRUE(torch::equal(p, before[k++]));
    k = 0;
    for (const auto& entry : aten.adamw().state()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
      EXPECT_TRUE(torch::equal(state.exp_avg(), moments_before[k++]));
      EXPECT_TRUE(torch::equal(state.exp_avg_sq(), moments_before[k++]));
    }
    aten.undo_step_count();
    gradients();
    aten.step(4, torch::tensor(false));
    cpu.step(4);
    compare("the step after a skipped one");
  }
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
