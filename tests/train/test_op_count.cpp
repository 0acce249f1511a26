// How many operators LibTorch dispatches in one CPU training step of the
// `small` preset (forward with the loss, backward, the optimiser), counted
// with RecordFunction callbacks, the hook LibTorch's profiler uses. On a GPU
// each operator is at least one kernel launch, so the count is what the
// step's launch overhead scales with. The test holds the exact counts of
// each phase, with q, k and v projected apart and packed, for the LibTorch
// versions op_count_held.h has numbers for: a change that dispatches more
// fails here, and so does one that dispatches fewer until the held numbers
// follow it (so that a later rise cannot hide under an old ceiling).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/record_function.h>
#include <torch/version.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "model/layers.h"     // set_packed_projections
#include "model/m3ae.h"       // M3AE, model_config_preset
#include "op_count_held.h"    // StepOperatorCounts, kHeldOperatorCounts
#include "train/batches.h"    // vqa_loss
#include "train/optimizer.h"  // VqaOptimizer

namespace {

using vqa::testing::kHeldOperatorCounts;
using vqa::testing::kOperatorCountsHeld;
using vqa::testing::StepOperatorCounts;

std::atomic<int64_t> g_operators{0};  // aten operators (RecordScope::FUNCTION)
std::atomic<int64_t> g_products{0};   // of them, matrix products (mm, addmm, bmm, baddbmm)
std::atomic<int64_t> g_autograd{0};   // autograd nodes run by backward

bool is_matrix_product(const char* name) {
  for (const char* product : {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}) {
    if (std::strcmp(name, product) == 0) return true;
  }
  return false;
}

std::unique_ptr<at::ObserverContext> count_call(const at::RecordFunction& call) {
  if (call.scope() == at::RecordScope::FUNCTION) {
    ++g_operators;
    if (is_matrix_product(call.name())) ++g_products;
  }
  if (call.scope() == at::RecordScope::BACKWARD_FUNCTION) ++g_autograd;
  return nullptr;
}

struct CountedStep {
  StepOperatorCounts counts;
  int64_t forward_products = 0;  // matrix products in the forward
};

// One optimiser step of `config` on a batch of 2, with the callbacks
// counting each phase apart. The counts depend on the sizes: LibTorch 1.13's
// CPU batched products dispatch operators per matrix above a size (batch 4
// measured 23,142 operators against batch 2's 16,741).
CountedStep count_one_step(vqa::model::ModelConfig config, bool packed_attention) {
  config.num_answers = 16;
  torch::manual_seed(0);
  vqa::model::M3AE model(config);
  vqa::model::set_packed_projections(*model, packed_attention);
  vqa::train::OptimizerSettings settings;
  settings.total_steps = 10;
  vqa::train::VqaOptimizer optimizer(model, settings);

  const int64_t batch = 2, length = 12;
  const auto images = torch::randn({batch, 3, config.image_size, config.image_size});
  const auto token_ids = torch::randint(config.vocab_size, {batch, length}, torch::kInt64);
  auto mask = torch::ones({batch, length}, torch::kInt64);
  mask.index_put_({1, torch::indexing::Slice(8)}, 0);  // one shorter question
  const auto targets =
      torch::zeros({batch, config.num_answers}).index_fill_(1, torch::tensor({3}), 1.0);

  CountedStep step;
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(count_call));
  g_operators = 0;
  g_products = 0;
  const auto loss = vqa::train::vqa_loss(model->forward(images, token_ids, mask), targets);
  step.counts.forward = g_operators.exchange(0);
  step.forward_products = g_products.exchange(0);
  g_autograd = 0;
  loss.backward();
  step.counts.backward = g_operators.exchange(0);
  step.counts.autograd_nodes = g_autograd.exchange(0);
  optimizer.step(/*step=*/1);
  step.counts.optimizer = g_operators.exchange(0);
  at::removeCallback(handle);
  return step;
}

std::string describe(const StepOperatorCounts& c) {
  char line[200];
  std::snprintf(line, sizeof(line),
                "forward with loss %lld, backward %lld (%lld autograd nodes), optimiser %lld, "
                "total %lld",
                static_cast<long long>(c.forward), static_cast<long long>(c.backward),
                static_cast<long long>(c.autograd_nodes), static_cast<long long>(c.optimizer),
                static_cast<long long>(c.total()));
  return line;
}

// As op_count_held.h writes them: {forward, backward, autograd nodes, optimiser}.
std::string initializer(const StepOperatorCounts& c) {
  return "{" + std::to_string(c.forward) + ", " + std::to_string(c.backward) + ", " +
         std::to_string(c.autograd_nodes) + ", " + std::to_string(c.optimizer) + "}";
}

// The `small` preset's step, separate and packed, counted once for the tests below.
struct SmallCounts {
  CountedStep separate, packed;
};
const SmallCounts& small_counts() {
  static const SmallCounts counts = [] {
    torch::set_num_threads(1);
    SmallCounts c;
    c.separate = count_one_step(vqa::model::model_config_preset("small"), /*packed=*/false);
    c.packed = count_one_step(vqa::model::model_config_preset("small"), /*packed=*/true);
    std::printf("LibTorch %s, operators per step of the small preset:\n", TORCH_VERSION);
    std::printf("  separate q, k, v: %s\n", describe(c.separate.counts).c_str());
    std::printf("  packed q, k, v:   %s\n", describe(c.packed.counts).c_str());
    std::printf("  as op_count_held.h holds them: %s, %s\n", initializer(c.separate.counts).c_str(),
                initializer(c.packed.counts).c_str());
    return c;
  }();
  return counts;
}

TEST(OperatorCount, OneSmallCpuStepDispatchesExactlyTheHeldCounts) {
  const auto& counts = small_counts();
  // The callbacks see every phase (a broken hook counts nothing).
  for (const auto* step : {&counts.separate, &counts.packed}) {
    EXPECT_GT(step->counts.forward, 100);
    EXPECT_GT(step->counts.backward, 100);
    EXPECT_GT(step->counts.autograd_nodes, 100);
    EXPECT_GT(step->counts.optimizer, 100);
  }
  if (!kOperatorCountsHeld) {
    GTEST_SKIP() << "no operator counts held for LibTorch " << TORCH_VERSION
                 << " (tests/train/op_count_held.h holds 1.13 and 2.6): printed only";
  }
  const std::string update =
      std::string(
          "\nIf the change is meant, hold the new counts: in tests/train/op_count_held.h, "
          "the LibTorch ") +
      kHeldOperatorCounts.libtorch + " row becomes {\"" + kHeldOperatorCounts.libtorch + "\", " +
      initializer(counts.separate.counts) + ", " + initializer(counts.packed.counts) +
      "} (and docs/benchmarks.md, \"Operators per step\", says the same numbers).";
  EXPECT_TRUE(counts.separate.counts == kHeldOperatorCounts.separate)
      << "separate q, k, v: counted " << describe(counts.separate.counts) << "; held "
      << describe(kHeldOperatorCounts.separate) << update;
  EXPECT_TRUE(counts.packed.counts == kHeldOperatorCounts.packed)
      << "packed q, k, v: counted " << describe(counts.packed.counts) << "; held "
      << describe(kHeldOperatorCounts.packed) << update;
}

// Packing computes q, k and v with one matrix product where separate
// projections take three (k and v: one for two in cross-attention), on every
// LibTorch version; whether the whole forward dispatches fewer operators
// depends on the version (the concatenations and the chunk cost operators
// too): the held counts say it.
TEST(OperatorCount, PackedAttentionSavesTheProjectionProducts) {
  const auto config = vqa::model::model_config_preset("small");
  // Self-attention: every vision and text layer and each co-attention
  // layer's first half, on both sides; cross-attention: the second half.
  const int64_t self_attention =
      config.vision_layers + config.text_layers + 2 * config.fusion_layers;
  const int64_t cross_attention = 2 * config.fusion_layers;
  const auto& counts = small_counts();
  std::printf("matrix products in the forward: separate %lld, packed %lld\n",
              static_cast<long long>(counts.separate.forward_products),
              static_cast<long long>(counts.packed.forward_products));
  EXPECT_EQ(counts.packed.forward_products,
            counts.separate.forward_products - 2 * self_attention - cross_attention);
}

}  // namespace
