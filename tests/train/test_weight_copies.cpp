// The forward computing with bf16 copies of the weights (--weight-copies,
// model/weight_copies.h) trains bit for bit as autocast's cast of each
// weight at every use does. Under mpirun (1 and 2 ranks, the real MPI
// communicator), a model of the base preset's structure at a tiny size
// trains 3 optimiser steps of 2 micro-steps each under bf16 CPU autocast,
// with and without the copies, with q, k and v packed, with ZeRO-1 and q,
// k and v apart, and with each step's second micro-step in float32: every
// micro-step's loss, every step's averaged gradients and every parameter
// after the last step are equal bit for bit (tolerance 0: the same
// roundings of the same values, the gradients of the copies widened once as
// the casts back widened them). Needs bf16 CPU autocast (LibTorch 2.4 on;
// with 1.13 these cases skip, and CI runs them in its LibTorch 2.6 stage).
// The multi-tensor add of mixed dtypes that later micro-steps use is
// checked on its own on every version.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <torch/version.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpu_autocast.h"          // CpuAutocast
#include "model/layers.h"          // set_packed_projections
#include "model/m3ae.h"            // M3AE
#include "model/weight_copies.h"   // add_tensors
#include "runtime/communicator.h"  // communicator_create
#include "runtime/distributed.h"   // distributed_rank_info
#include "tiny_m3ae.h"             // tiny_m3ae_model
#include "train/batches.h"         // vqa_loss
#include "train/gradient_sync.h"   // GradientSynchronizer
#include "train/optimizer.h"       // VqaOptimizer, aten_fused_adamw_available
#include "train/setup.h"           // trainable_parameters

namespace {

using vqa::testing::kCpuAutocastRunsTheModel;

constexpr int64_t kSteps = 3, kMicroSteps = 2, kBatch = 3, kLength = 8;

struct Run {
  std::vector<float> losses;  // every micro-step's
  std::vector<torch::Tensor>
      gradients;  // every step's averaged gradients, as the optimiser reads them
  std::vector<std::pair<std::string, torch::Tensor>> parameters;  // after the last step
  int64_t copies = 0;
};

struct Setting {
  bool copies;
  bool packed;
  bool shard;
  // Each step's second micro-step in float32 (no autocast): the forward uses
  // the float32 parameters, whose own gradient hooks take over.
  bool float32_second_micro = false;
};

Run train(const Setting& setting) {
  vqa::model::M3AE model = tiny_m3ae_model(/*seed=*/5);
  vqa::model::set_packed_projections(*model, setting.packed);
  if (setting.copies) model->use_weight_copies(at::kBFloat16);
  vqa::train::OptimizerSettings settings;
  settings.total_steps = 10;
  settings.aten_fused_on_cpu = vqa::train::aten_fused_adamw_available();
  vqa::train::VqaOptimizer optimizer(model, settings);
  auto comm = vqa::runtime::communicator_create(vqa::runtime::Backend::kMpi, torch::kCPU);
  vqa::train::GradientSyncOptions options;
  options.bucket_mb = 0.02;  // several buckets, each with copies and float32-only parameters
  options.shard = setting.shard;
  vqa::train::GradientSynchronizer gradients(vqa::train::trainable_parameters(model), *comm,
                                             options);
  if (setting.shard) {
    optimizer.shard(gradients.shard_layout(),
                    [&gradients](int64_t bucket) { gradients.gather_parameters(bucket); });
  }
  const auto& config = model->config();
  const int rank = vqa::runtime::distributed_rank_info().rank;
  torch::manual_seed(100 + rank);  // each rank's batches and dropout draws, the same in every run
  Run run;
  run.copies = model->weight_copies() ? model->weight_copies()->size() : 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    for (int64_t micro = 0; micro < kMicroSteps; ++micro) {
      if (micro == 0) gradients.wait_parameters();
      gradients.prepare_backward(/*sync=*/micro == kMicroSteps - 1);
      const auto images = torch::randn({kBatch, 3, config.image_size, config.image_size});
      const auto token_ids = torch::randint(config.vocab_size, {kBatch, kLength}, torch::kInt64);
      auto mask = torch::ones({kBatch, kLength}, torch::kInt64);
      mask.index_put_({1, torch::indexing::Slice(5)}, 0);
      const auto targets = torch::zeros({kBatch, config.num_answers})
                               .index_fill_(1, torch::tensor({static_cast<int64_t>(micro)}), 1.0);
      torch::Tensor loss;
      {
        vqa::testing::CpuAutocast autocast(!setting.float32_second_micro || micro == 0);
        loss = vqa::train::vqa_loss(model->forward(images, token_ids, mask), targets);
      }
      run.losses.push_back(loss.item<float>());
      (loss / static_cast<double>(kMicroSteps)).backward();
    }
    gradients.finish_backward();
    run.gradients.push_back(torch::cat(gradients.bucket_gradients()).clone());
    if (optimizer.masks_on_device()) {
      const auto found_inf = gradients.nonfinite_flag();
      gradients.clip_gradient_norm(1.0);
      optimizer.step(step, found_inf);
    } else {
      EXPECT_TRUE(gradients.gradients_finite());
      gradients.clip_gradient_norm(1.0);
      optimizer.step(step);
    }
  }
  gradients.wait_parameters();
  for (const auto& item : model->named_parameters()) {
    run.parameters.emplace_back(item.key(), item.value().detach().clone());
  }
  return run;
}

void expect_same_run(const Setting& setting) {
  if (!kCpuAutocastRunsTheModel) {
    GTEST_SKIP() << "bf16 CPU autocast runs this model with LibTorch 2.4 or later (this is "
                 << TORCH_VERSION << "); CI's LibTorch 2.6 stage runs this case";
  }
  Setting without = setting;
  without.copies = false;
  Setting with = setting;
  with.copies = true;
  const Run cast = train(without);
  const Run copied = train(with);
  EXPECT_EQ(cast.copies, 0);
  EXPECT_GT(copied.copies, 0);
  ASSERT_EQ(cast.losses.size(), copied.losses.size());
  for (size_t i = 0; i < cast.losses.size(); ++i) {
    EXPECT_EQ(cast.losses[i], copied.losses[i]) << "micro-step " << i;
  }
  ASSERT_EQ(cast.gradients.size(), copied.gradients.size());
  for (size_t i = 0; i < cast.gradients.size(); ++i) {
    const auto differ = cast.gradients[i].ne(copied.gradients[i]);
    EXPECT_EQ(differ.sum().item<int64_t>(), 0)
        << "step " << i << ": gradients differ, the first at element "
        << (differ.any().item<bool>() ? differ.nonzero()[0][0].item<int64_t>() : -1)
        << ", largest difference "
        << (cast.gradients[i] - copied.gradients[i]).abs().max().item<double>();
  }
  ASSERT_EQ(cast.parameters.size(), copied.parameters.size());
  int64_t changed = 0;
  const Run initial = [] {
    Run run;
    for (const auto& item : tiny_m3ae_model(5)->named_parameters()) {
      run.parameters.emplace_back(item.key(), item.value().detach().clone());
    }
    return run;
  }();
  for (size_t i = 0; i < cast.parameters.size(); ++i) {
    const auto& [name, value] = cast.parameters[i];
    EXPECT_EQ(name, copied.parameters[i].first);
    EXPECT_TRUE(torch::equal(value, copied.parameters[i].second))
        << name << ": largest difference "
        << (value - copied.parameters[i].second).abs().max().item<double>();
    if (!torch::equal(value, initial.parameters[i].second)) ++changed;
  }
  // The runs trained: every parameter moved (AdamW moves each, weight decay or not).
  EXPECT_EQ(changed, static_cast<int64_t>(cast.parameters.size()));
}

TEST(WeightCopies, PackedTrainingMatchesAutocastsCastsBitForBit) {
  expect_same_run({true, /*packed=*/true, /*shard=*/false});
}

TEST(WeightCopies, ShardedTrainingWithQKVApartMatchesAutocastsCastsBitForBit) {
  expect_same_run({true, /*packed=*/false, /*shard=*/true});
}

TEST(WeightCopies, AFloat32MicroStepBetweenBf16OnesMatchesBitForBit) {
  expect_same_run({true, /*packed=*/true, /*shard=*/false, /*float32_second_micro=*/true});
}

// The copies stand in for the weights and biases of the linear layers, the
// patch convolution and the attentions' q/k/v parameters; not for
// LayerNorms, embeddings or position tables, which autocast does not cast.
// They are not parameters, and without autocast the forward uses the
// float32 parameters: its logits equal a model's without copies.
TEST(WeightCopies, StandInForTheCastWeightsOnlyAndOnlyUnderAutocast) {
  vqa::model::M3AE model = tiny_m3ae_model(/*seed=*/5);
  vqa::model::M3AE plain = tiny_m3ae_model(/*seed=*/5);
  const auto names_before = model->named_parameters().keys();
  model->use_weight_copies(at::kBFloat16);
  EXPECT_EQ(model->named_parameters().keys(), names_before);
  for (const char* name :
       {"head.output.weight", "head.output.bias", "fusion.text_layers.0.feed_forward.up.bias",
        "vision.patch_embedding.weight", "text.layers.0.attention.in_weight",
        "text.layers.0.attention.value_bias", "fusion.text_layers.0.feed_forward.up.weight"}) {
    const torch::Tensor copy = model->weight_copy(name);
    ASSERT_TRUE(copy.defined()) << name;
    EXPECT_EQ(copy.scalar_type(), torch::kBFloat16) << name;
    EXPECT_EQ(copy.sizes(), model->named_parameters()[name].sizes()) << name;
  }
  for (const char* name : {"text.token_embeddings.weight", "vision.position_embeddings",
                           "text.layers.0.attention_norm.weight"}) {
    EXPECT_TRUE(model->named_parameters().contains(name)) << name;
    EXPECT_FALSE(model->weight_copy(name).defined()) << name;
  }
  EXPECT_THROW(model->use_weight_copies(at::kBFloat16), std::logic_error);

  model->eval();
  plain->eval();
  torch::manual_seed(1);
  const auto images = torch::randn({2, 3, 16, 16});
  const auto token_ids = torch::randint(30, {2, 6}, torch::kInt64);
  const auto mask = torch::ones({2, 6}, torch::kInt64);
  EXPECT_TRUE(torch::equal(model->forward(images, token_ids, mask),
                           plain->forward(images, token_ids, mask)));
  if (!kCpuAutocastRunsTheModel) return;  // the float32 half of the case holds on 1.13 too
  torch::Tensor with_copies, with_casts;
  {
    vqa::testing::CpuAutocast autocast(true);
    with_copies = model->forward(images, token_ids, mask);
    with_casts = plain->forward(images, token_ids, mask);
  }
  EXPECT_TRUE(torch::equal(with_copies, with_casts));
  // And back to float32 afterwards.
  EXPECT_TRUE(torch::equal(model->forward(images, token_ids, mask),
                           plain->forward(images, token_ids, mask)));
}

// The buckets' multi-tensor add (later micro-steps' copy gradients into
// float32 slots): the sources of another dtype than their slot are widened
// into one buffer first, and the sums equal a per-tensor add_'s bit for bit
// (tolerance 0: widening bf16 or fp16 to float32 is exact, and the add is
// then the same float32 addition). Every LibTorch version.
TEST(WeightCopies, AddTensorsSumsMixedDtypesAsAddPerTensor) {
  torch::manual_seed(3);
  const auto flat = torch::randn({7 + 12 + 5 + 9});
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 4}, {5}, {9}};
  const std::vector<at::ScalarType> dtypes = {torch::kBFloat16, torch::kFloat32, torch::kHalf,
                                              torch::kBFloat16};
  std::vector<torch::Tensor> into, from, expected;
  int64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto numel = torch::ones(shapes[i]).numel();
    into.push_back(flat.narrow(0, offset, numel).view(shapes[i]));
    from.push_back(torch::randn(shapes[i]).to(dtypes[i]));
    expected.push_back(into.back().clone().add_(from.back()));
    offset += numel;
  }
  std::vector<torch::Tensor> from_values;  // the sources must not change
  for (const auto& tensor : from) from_values.push_back(tensor.clone());
  vqa::model::add_tensors(into, from);
  for (size_t i = 0; i < into.size(); ++i) {
    EXPECT_EQ(into[i].scalar_type(), torch::kFloat32) << i;
    EXPECT_TRUE(torch::equal(into[i], expected[i])) << "tensor " << i;
    EXPECT_TRUE(torch::equal(from[i], from_values[i])) << "source " << i << " changed";
  }
  // The slots are views of one buffer: the sums are in it.
  EXPECT_TRUE(torch::equal(flat.narrow(0, 7, 12).view({3, 4}), expected[1]));
  vqa::model::add_tensors({}, {});  // nothing to add: no error
  EXPECT_THROW(vqa::model::add_tensors(into, {from[0]}), c10::Error);

  // Slots of two dtypes, a wider source (float32 into bf16: added as add_
  // adds it, rounded once, not narrowed first), a transposed source and an
  // empty one.
  std::vector<torch::Tensor> mixed_into = {torch::randn({4, 3}).to(torch::kBFloat16),
                                           torch::randn({3, 4}), torch::randn({0}),
                                           torch::randn({5}).to(torch::kBFloat16)};
  const std::vector<torch::Tensor> mixed_from = {
      torch::randn({4, 3}), torch::randn({4, 3}).to(torch::kBFloat16).t(),
      torch::randn({0}).to(torch::kHalf), torch::randn({5}).to(torch::kBFloat16)};
  std::vector<torch::Tensor> mixed_expected;
  for (size_t i = 0; i < mixed_into.size(); ++i) {
    mixed_expected.push_back(mixed_into[i].clone().add_(mixed_from[i]));
  }
  vqa::model::add_tensors(mixed_into, mixed_from);
  for (size_t i = 0; i < mixed_into.size(); ++i) {
    EXPECT_EQ(mixed_into[i].scalar_type(), mixed_expected[i].scalar_type()) << i;
    EXPECT_TRUE(torch::equal(mixed_into[i], mixed_expected[i])) << "mixed tensor " << i;
  }
}

}  // namespace
