// Tests of the VQA model: shapes, parameter counts against hand formulas, the
// padding mask, gradient coverage, learning-rate groups, deterministic
// initialisation and a tiny overfitting run.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/version.h>
#include <tuple>

#include "model/layers.h"  // MultiHeadAttention, attention_key_bias
#include "model/m3ae.h"    // M3AE, ModelConfig, parameter_count, model_parameter_groups

namespace vqa::model {
namespace {

struct Batch {
  torch::Tensor images;  // or features
  torch::Tensor token_ids;
  torch::Tensor attention_mask;
  torch::Tensor labels;
};

// Random inputs for `config`; row b keeps its first `real_lengths[b]`
// tokens real and pads the rest (cycling through the listed lengths).
Batch random_batch(const ModelConfig& config, int64_t batch, int64_t text_length,
                   std::vector<int64_t> real_lengths = {}) {
  Batch b;
  if (config.use_features) {
    b.images = torch::randn({batch, config.feature_tokens, config.feature_dim});
  } else {
    b.images = torch::randn({batch, 3, config.image_size, config.image_size});
  }
  b.token_ids = torch::randint(config.vocab_size, {batch, text_length}, torch::kLong);
  b.attention_mask = torch::ones({batch, text_length}, torch::kLong);
  for (int64_t row = 0; row < batch && !real_lengths.empty(); ++row) {
    const int64_t real = real_lengths[row % real_lengths.size()];
    b.attention_mask[row].slice(/*dim=*/0, /*start=*/real).fill_(0);
  }
  b.labels = torch::randint(config.num_answers, {batch}, torch::kLong);
  return b;
}

ModelConfig tiny_features_config() {
  ModelConfig config = model_config_preset("tiny");
  config.use_features = true;
  config.feature_tokens = 12;
  config.feature_dim = 48;
  return config;
}

// The parameter count from the architecture's formulas, written independently
// of the modules. Key projections carry no bias (see layers.h).
int64_t expected_parameter_count(const ModelConfig& c) {
  const int64_t h = c.hidden;
  const int64_t attention = 4 * h * h + 3 * h;
  const int64_t feed_forward = 2 * h * c.ffn + c.ffn + h;
  const int64_t norm = 2 * h;
  const int64_t encoder_layer = attention + feed_forward + 2 * norm;  // ViT block or BERT layer
  const int64_t co_attention_layer = 2 * attention + feed_forward + 3 * norm;

  int64_t vision = 0;
  if (c.use_features) {
    // projection, class token, positions, LayerNorm
    vision = c.feature_dim * h + h + h + (1 + c.feature_tokens) * h + norm;
  } else {
    const int64_t patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
    // bias-free patch conv, class token, positions, input and output LayerNorms, blocks
    vision = 3 * c.patch_size * c.patch_size * h + h + (1 + patches) * h + 2 * norm +
             c.vision_layers * encoder_layer;
  }
  // RoBERTa's positions have two more rows; its one token type is one more.
  const int64_t position_rows = c.max_text_length + (c.roberta_positions ? 2 : 0);
  const int64_t text = c.vocab_size * h + position_rows * h + (c.text_token_type ? h : 0) + norm +
                       c.text_layers * encoder_layer;
  const int64_t fusion = 2 * (h * h + h) + 2 * h + 2 * c.fusion_layers * co_attention_layer;
  const int64_t head = 2 * (h * h + h) + (2 * h * 2 * h + 2 * h) + 2 * (2 * h) +
                       (2 * h * c.num_answers + c.num_answers);
  return vision + text + fusion + head;
}

TEST(ModelConfig, UnknownPresetThrowsNamingItAndTheValidOnes) {
  try {
    model_config_preset("huge");
    FAIL() << "no exception for an unknown preset";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'huge'"), std::string::npos) << message;
    EXPECT_NE(message.find("tiny, small, base"), std::string::npos) << message;
  }
}

TEST(ModelConfig, ValidateRejectsHiddenNotDivisibleByHeads) {
  ModelConfig config = model_config_preset("tiny");
  config.heads = 3;
  EXPECT_THROW(model_config_validate(config), std::invalid_argument);
  EXPECT_THROW(M3AE{config}, std::invalid_argument);
}

TEST(ModelConfig, DescribeNamesEverySize) {
  const std::string line = model_config_describe(model_config_preset("small"));
  std::cout << line << "\n";
  for (const char* field : {"preset=small", "hidden=256", "heads=4", "ffn=1024", "vision_layers=4",
                            "text_layers=4", "fusion_layers=2", "image_size=96", "patch_size=16"}) {
    EXPECT_NE(line.find(field), std::string::npos) << field << " missing from: " << line;
  }
}

TEST(M3AE, PixelInputGivesLogitsOfBatchByAnswers) {
  torch::manual_seed(0);
  const ModelConfig config = model_config_preset("tiny");
  M3AE model(config);
  const Batch b = random_batch(config, /*batch=*/3, /*text_length=*/7, {7, 4, 1});
  const torch::Tensor logits = model->forward(b.images, b.token_ids, b.attention_mask);
  EXPECT_EQ(logits.sizes(), (torch::IntArrayRef{3, config.num_answers}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

TEST(M3AE, FeatureInputGivesLogitsOfBatchByAnswers) {
  torch::manual_seed(0);
  const ModelConfig config = tiny_features_config();
  M3AE model(config);
  const Batch b = random_batch(config, /*batch=*/2, /*text_length=*/5, {5, 2});
  const torch::Tensor logits = model->forward(b.images, b.token_ids, b.attention_mask);
  EXPECT_EQ(logits.sizes(), (torch::IntArrayRef{2, config.num_answers}));
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

TEST(M3AE, WrongImageSizeIsRejected) {
  const ModelConfig config = model_config_preset("tiny");
  M3AE model(config);
  const Batch b = random_batch(config, /*batch=*/2, /*text_length=*/4);
  EXPECT_THROW(model->forward(torch::zeros({2, 3, 16, 16}), b.token_ids, b.attention_mask),
               c10::Error);
}

TEST(M3AE, TinyParameterCountMatchesHandCount) {
  // hidden 64, ffn 256: attention 4*64^2 + 3*64 = 16576, feed-forward
  // 2*64*256 + 256 + 64 = 33088, encoder layer 16576 + 33088 + 4*64 = 49920,
  // co-attention layer 2*16576 + 33088 + 6*64 = 66624.
  // vision: 3*8*8*64 + 64 + 17*64 + 4*64 + 49920 = 63616
  // text:   1024*64 + 32*64 + 2*64 + 49920 = 117632
  // fusion: 2*(64*64 + 64) + 2*64 + 2*66624 = 141696
  // head:   2*(64*64 + 64) + (128*128 + 128) + 2*128 + (128*10 + 10) = 26378
  constexpr int64_t kTinyParameters = 63616 + 117632 + 141696 + 26378;  // 349322
  const ModelConfig config = model_config_preset("tiny");
  M3AE model(config);
  std::cout << "tiny: " << parameter_count(*model) << " parameters\n";
  EXPECT_EQ(parameter_count(*model), kTinyParameters);
  EXPECT_EQ(expected_parameter_count(config), kTinyParameters);

  const ModelConfig features = tiny_features_config();
  EXPECT_EQ(parameter_count(*M3AE(features)), expected_parameter_count(features));
}

// base is built once (~1.3 GB of fp32 parameters, a few seconds of init on
// one thread) because its count is the one the job's users compare with M3AE.
TEST(M3AE, SmallAndBaseParameterCountsMatchFormula) {
  for (const char* preset : {"small", "base"}) {
    const ModelConfig config = model_config_preset(preset);
    const auto start = std::chrono::steady_clock::now();
    const int64_t count = parameter_count(*M3AE(config));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << preset << ": " << count << " parameters (built in " << seconds << " s)\n";
    EXPECT_EQ(count, expected_parameter_count(config)) << preset;
  }
}

// The base preset's M3AE details that tiny and small do not have.
TEST(M3AE, BasePresetIsShapedLikeM3ae) {
  const ModelConfig base = model_config_preset("base");
  EXPECT_EQ(base.vision_activation, Activation::kQuickGelu);
  EXPECT_EQ(base.vision_layer_norm_eps, 1e-5);
  EXPECT_EQ(base.text_layer_norm_eps, 1e-5);
  EXPECT_EQ(base.fusion_layer_norm_eps, 1e-12);
  EXPECT_EQ(base.head_layer_norm_eps, 1e-5);
  EXPECT_TRUE(base.roberta_positions);
  EXPECT_TRUE(base.text_token_type);
  EXPECT_EQ(base.vision_layers, 11);  // CLIP's last block dropped
  const ModelConfig tiny = model_config_preset("tiny");
  EXPECT_EQ(tiny.vision_activation, Activation::kGelu);
  EXPECT_FALSE(tiny.roberta_positions);
}

// RoBERTa's position rule: a right-padded row and the same row with more
// padding give the same logits (positions come from the real tokens only,
// padding sits at row 1), and the first real token reads row 2.
TEST(M3AE, RobertaPositionsCountRealTokens) {
  torch::manual_seed(3);
  ModelConfig config = model_config_preset("tiny");
  config.roberta_positions = true;
  config.text_token_type = true;
  config.vision_activation = Activation::kQuickGelu;
  M3AE model(config);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(model->named_parameters()["text.position_embeddings.weight"].size(0),
            config.max_text_length + 2);
  Batch b = random_batch(config, /*batch=*/2, /*text_length=*/6, {4, 4});
  const torch::Tensor short_logits = model->forward(b.images, b.token_ids, b.attention_mask);
  // The same questions with four more padded columns.
  const auto pad = torch::zeros({2, 4}, torch::kLong);
  const torch::Tensor long_logits = model->forward(b.images, torch::cat({b.token_ids, pad}, 1),
                                                   torch::cat({b.attention_mask, pad}, 1));
  EXPECT_TRUE(torch::allclose(short_logits, long_logits, /*rtol=*/1e-5, /*atol=*/1e-6));
  // Row 2 matters (the first real token), row 0 does not (never read).
  // A handle of its own (sharing the parameter's storage): named_parameters()
  // returns a temporary dict, so a reference into it would dangle.
  torch::Tensor table = model->named_parameters()["text.position_embeddings.weight"];
  table[0].fill_(100.0);
  EXPECT_TRUE(torch::allclose(model->forward(b.images, b.token_ids, b.attention_mask), short_logits,
                              1e-5, 1e-6));
  table[2].fill_(1.0);
  EXPECT_FALSE(torch::allclose(model->forward(b.images, b.token_ids, b.attention_mask),
                               short_logits, 1e-5, 1e-6));
}

// LibTorch 2.x's fused attention against the explicit one, self- and
// cross-attention, with padded keys: within 1e-5 (float32 on the CPU; the
// two sum in different orders). On LibTorch 1.x there is no fused path.
TEST(Attention, FusedEqualsExplicitWithPaddedKeys) {
  if (!MultiHeadAttentionImpl::fused_attention_available()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION
                 << " has no at::scaled_dot_product_attention (it came with 2.0)";
  }
  torch::manual_seed(4);
  MultiHeadAttention attention(/*hidden=*/32, /*heads=*/4, /*dropout=*/0.0);
  torch::NoGradGuard no_grad;
  const auto queries = torch::randn({3, 5, 32});
  const auto keys = torch::randn({3, 7, 32});
  auto mask = torch::ones({3, 7}, torch::kLong);
  mask[0].slice(0, 4).fill_(0);  // rows with 4, 7 and 1 real keys
  mask[2].slice(0, 1).fill_(0);
  const auto bias = attention_key_bias(mask, torch::kFloat32);
  for (const auto& [name, kv, key_bias] :
       {std::make_tuple("cross, padded", keys, bias),
        std::make_tuple("self, no mask", queries, torch::Tensor())}) {
    attention->set_fused_attention(true);
    const auto fused = attention(queries, kv, key_bias);
    attention->set_fused_attention(false);
    const auto explicit_ = attention(queries, kv, key_bias);
    EXPECT_TRUE(torch::allclose(fused, explicit_, /*rtol=*/1e-5, /*atol=*/1e-5)) << name;
    std::cout << name << ": largest difference " << (fused - explicit_).abs().max().item<float>()
              << "\n";
  }
}

// The packed projections (one GEMM for q, k, v; one for k, v across) give
// the separate projections' outputs and gradients within 1e-5, with padded
// keys, and the model's parameter names do not change.
TEST(Attention, PackedProjectionsEqualSeparateOnes) {
  torch::manual_seed(5);
  MultiHeadAttention attention(/*hidden=*/32, /*heads=*/4, /*dropout=*/0.0);
  attention->set_fused_attention(false);  // the same attention kernel for both
  const auto queries = torch::randn({3, 5, 32});
  const auto keys = torch::randn({3, 7, 32});
  auto mask = torch::ones({3, 7}, torch::kLong);
  mask[0].slice(0, 4).fill_(0);
  const auto bias = attention_key_bias(mask, torch::kFloat32);
  std::vector<std::string> names_before;
  for (const auto& item : attention->named_parameters()) names_before.push_back(item.key());
  for (const auto& [name, kv, key_bias] :
       {std::make_tuple("cross, padded", keys, bias),
        std::make_tuple("self, no mask", queries, torch::Tensor())}) {
    SCOPED_TRACE(name);
    std::vector<torch::Tensor> outputs, gradients;
    for (const bool packed : {true, false}) {
      attention->set_packed_projections(packed);
      attention->zero_grad();
      const auto out = attention(queries, kv, key_bias);
      (out * out).sum().backward();
      outputs.push_back(out.detach());
      std::vector<torch::Tensor> grads;
      for (const auto& parameter : attention->parameters())
        grads.push_back(parameter.grad().flatten());
      gradients.push_back(torch::cat(grads));
    }
    EXPECT_TRUE(torch::allclose(outputs[0], outputs[1], /*rtol=*/1e-5, /*atol=*/1e-5));
    EXPECT_TRUE(torch::allclose(gradients[0], gradients[1], /*rtol=*/1e-5, /*atol=*/1e-5));
    std::cout << name << ": largest difference, outputs "
              << (outputs[0] - outputs[1]).abs().max().item<float>() << ", gradients "
              << (gradients[0] - gradients[1]).abs().max().item<float>() << "\n";
  }
  std::vector<std::string> names_after;
  for (const auto& item : attention->named_parameters()) names_after.push_back(item.key());
  EXPECT_EQ(names_before, names_after);
}

// The loader cuts the text to the batch's longest question
// (LoaderOptions::trim_text_padding): the logits of the cut batch equal the
// padded batch's within 1e-5 (float rounding: shorter reductions), for plain
// and RoBERTa positions.
TEST(M3AE, TrimmedPaddingGivesTheSameLogits) {
  for (const bool roberta : {false, true}) {
    SCOPED_TRACE(roberta ? "roberta positions" : "plain positions");
    torch::manual_seed(6);
    ModelConfig config = model_config_preset("tiny");
    config.roberta_positions = roberta;
    config.text_token_type = roberta;
    M3AE model(config);
    torch::NoGradGuard no_grad;
    Batch b = random_batch(config, /*batch=*/4, /*text_length=*/20, {5, 3, 7, 1});
    const auto padded = model->forward(b.images, b.token_ids, b.attention_mask);
    const auto trimmed = model->forward(b.images, b.token_ids.narrow(1, 0, 7).contiguous(),
                                        b.attention_mask.narrow(1, 0, 7).contiguous());
    EXPECT_TRUE(torch::allclose(padded, trimmed, /*rtol=*/1e-5, /*atol=*/1e-5))
        << (padded - trimmed).abs().max().item<float>();
  }
}

TEST(M3AE, PaddedTokenIdsDoNotChangeLogits) {
  torch::manual_seed(1);
  const ModelConfig config = model_config_preset("tiny");
  M3AE model(config);
  torch::NoGradGuard no_grad;
  Batch b = random_batch(config, /*batch=*/4, /*text_length=*/10, {10, 6, 3, 1});
  const torch::Tensor logits = model->forward(b.images, b.token_ids, b.attention_mask);

  const torch::Tensor padded = b.attention_mask.eq(0);
  const torch::Tensor other_ids =
      torch::randint(config.vocab_size, b.token_ids.sizes(), torch::kLong);
  const torch::Tensor repadded_ids = torch::where(padded, other_ids, b.token_ids);
  ASSERT_FALSE(torch::equal(repadded_ids, b.token_ids));
  const torch::Tensor repadded_logits = model->forward(b.images, repadded_ids, b.attention_mask);
  // Padded keys get weight exp(-1e4) == 0 exactly in fp32, so the only
  // differences allowed are rounding: 1e-6 absolute on logits of size ~1.
  EXPECT_TRUE(torch::allclose(repadded_logits, logits, /*rtol=*/0.0, /*atol=*/1e-6))
      << (repadded_logits - logits).abs().max();

  // The check can fail: changing a real token of row 1 must move its logits
  // (by far more than the 1e-6 above).
  torch::Tensor changed_ids = b.token_ids.clone();
  changed_ids[1][2] = (b.token_ids[1][2].item<int64_t>() + 1) % config.vocab_size;
  const torch::Tensor changed_logits = model->forward(b.images, changed_ids, b.attention_mask);
  EXPECT_GT((changed_logits[1] - logits[1]).abs().max().item<double>(), 1e-4);
}

void expect_every_parameter_gets_a_gradient(const ModelConfig& config) {
  torch::manual_seed(2);
  M3AE model(config);
  const Batch b = random_batch(config, /*batch=*/4, /*text_length=*/8, {8, 5});
  const torch::Tensor loss = torch::nn::functional::cross_entropy(
      model->forward(b.images, b.token_ids, b.attention_mask), b.labels);
  loss.backward();
  for (const auto& parameter : model->named_parameters()) {
    const torch::Tensor& grad = parameter.value().grad();
    ASSERT_TRUE(grad.defined()) << parameter.key() << " got no gradient";
    // Strictly non-zero: no parameter may be dead (embedding tables count as
    // alive when the rows the batch uses get a gradient).
    EXPECT_GT(grad.abs().max().item<double>(), 0.0) << parameter.key() << " gradient is all zero";
  }
}

TEST(M3AE, EveryParameterGetsANonZeroGradientFromPixels) {
  expect_every_parameter_gets_a_gradient(model_config_preset("tiny"));
}

TEST(M3AE, EveryParameterGetsANonZeroGradientFromFeatures) {
  expect_every_parameter_gets_a_gradient(tiny_features_config());
}

TEST(ParameterGroups, CoverEveryParameterOnceInRegistrationOrder) {
  M3AE model(model_config_preset("tiny"));
  const auto groups = model_parameter_groups(model);
  const auto named = model->named_parameters();
  ASSERT_EQ(groups.size(), named.size());
  std::set<const void*> seen;
  int64_t grouped_count = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    EXPECT_EQ(groups[i].name, named[i].key());
    EXPECT_TRUE(groups[i].tensor.is_same(named[i].value())) << groups[i].name;
    EXPECT_TRUE(seen.insert(groups[i].tensor.unsafeGetTensorImpl()).second) << groups[i].name;
    grouped_count += groups[i].tensor.numel();
  }
  EXPECT_EQ(grouped_count, parameter_count(*model));
}

TEST(ParameterGroups, ModulesLandInTheirLearningRateGroups) {
  M3AE model(model_config_preset("tiny"));
  std::map<ParameterGroup, int64_t> tensors_per_group;
  for (const auto& p : model_parameter_groups(model)) {
    ++tensors_per_group[p.group];
    const std::string top = p.name.substr(0, p.name.find('.'));
    if (top == "head") {
      EXPECT_EQ(p.group, ParameterGroup::kHead) << p.name;
    } else if (top == "fusion") {
      EXPECT_EQ(p.group, ParameterGroup::kFusion) << p.name;
    } else {
      EXPECT_TRUE(top == "vision" || top == "text") << p.name;
      EXPECT_EQ(p.group, ParameterGroup::kEncoder) << p.name;
    }
  }
  // Spot checks by name, so that a renamed module cannot slip into a group silently.
  const auto groups = model_parameter_groups(model);
  const auto group_of = [&](const std::string& name) {
    for (const auto& p : groups) {
      if (p.name == name) return p.group;
    }
    throw std::runtime_error("no parameter named " + name);
  };
  EXPECT_EQ(group_of("head.text_pooler.weight"), ParameterGroup::kHead);
  EXPECT_EQ(group_of("head.output.bias"), ParameterGroup::kHead);
  EXPECT_EQ(group_of("fusion.modality_type_embeddings.weight"), ParameterGroup::kFusion);
  EXPECT_EQ(group_of("fusion.image_projection.weight"), ParameterGroup::kFusion);
  EXPECT_EQ(group_of("text.token_embeddings.weight"), ParameterGroup::kEncoder);
  EXPECT_EQ(group_of("vision.patch_embedding.weight"), ParameterGroup::kEncoder);
  EXPECT_EQ(tensors_per_group.size(), 3u);
}

TEST(ParameterGroups, BiasesAndLayerNormWeightsHaveNoWeightDecay) {
  M3AE model(model_config_preset("tiny"));
  std::set<const void*> layer_norm_parameters;
  for (const auto& module : model->modules()) {
    if (module->as<torch::nn::LayerNorm>() != nullptr) {
      for (const auto& p : module->parameters()) {
        layer_norm_parameters.insert(p.unsafeGetTensorImpl());
      }
    }
  }
  ASSERT_FALSE(layer_norm_parameters.empty());
  int64_t decayed = 0;
  for (const auto& p : model_parameter_groups(model)) {
    const bool is_bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    const bool is_layer_norm = layer_norm_parameters.count(p.tensor.unsafeGetTensorImpl()) > 0;
    EXPECT_EQ(p.weight_decay, !(is_bias || is_layer_norm)) << p.name;
    decayed += p.weight_decay ? 1 : 0;
  }
  EXPECT_GT(decayed, 0);
}

TEST(M3AE, SameSeedGivesIdenticalParameters) {
  const ModelConfig config = model_config_preset("tiny");
  torch::manual_seed(42);
  M3AE first(config);
  torch::manual_seed(42);
  M3AE second(config);
  torch::manual_seed(43);
  M3AE other_seed(config);
  const auto a = first->named_parameters();
  const auto b = second->named_parameters();
  const auto c = other_seed->named_parameters();
  bool any_differs_with_other_seed = false;
  for (size_t i = 0; i < a.size(); ++i) {
    // Bitwise equality: the same draws in the same order.
    EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << a[i].key();
    any_differs_with_other_seed |= !torch::equal(a[i].value(), c[i].value());
  }
  EXPECT_TRUE(any_differs_with_other_seed);
}

TEST(M3AE, InitialisationFollowsBert) {
  torch::manual_seed(3);
  M3AE model(model_config_preset("small"));
  for (const auto& p : model_parameter_groups(model)) {
    const torch::Tensor& t = p.tensor;
    if (p.name.find("norm.weight") != std::string::npos) {
      EXPECT_TRUE(torch::equal(t, torch::ones_like(t))) << p.name;
    } else if (!p.weight_decay) {
      EXPECT_TRUE(torch::equal(t, torch::zeros_like(t))) << p.name;
    } else if (t.numel() >= 10000) {
      // Sample std of >= 10^4 N(0, 0.02) draws: within 5% of 0.02.
      EXPECT_NEAR(t.std().item<double>(), kInitStd, 0.05 * kInitStd) << p.name;
    }
  }
}

TEST(M3AE, TinyModelOverfitsASmallBatch) {
  torch::manual_seed(4);
  const ModelConfig config = model_config_preset("tiny");
  M3AE model(config);
  const Batch b = random_batch(config, /*batch=*/8, /*text_length=*/6, {6, 3});
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(/*lr=*/1e-3));
  double first_loss = 0.0;
  double last_loss = 0.0;
  constexpr int kSteps = 60;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        model->forward(b.images, b.token_ids, b.attention_mask), b.labels);
    loss.backward();
    optimizer.step();
    (step == 0 ? first_loss : last_loss) = loss.item<double>();
  }
  std::cout << "overfit: loss " << first_loss << " -> " << last_loss << " in " << kSteps
            << " Adam steps\n";
  // Starting near ln(10) = 2.3, memorising 8 examples must cut the loss at least 20-fold.
  EXPECT_LT(last_loss, first_loss / 20.0);
}

}  // namespace
}  // namespace vqa::model
