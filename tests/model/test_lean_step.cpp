// The step's lean forms hold the model's function: QuickGELU as one silu,
// q, k and v packed in one parameter (and M3AE's names mapped onto its rows),
// no copies of the heads for the fused kernels, no attention mask for a batch
// without padding. And the one switch on the LibTorch version for autocast's
// state reads back what it set.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "model/autocast_state.h"  // autocast_enable, autocast_enabled, autocast_dtype
#include "model/layers.h"          // MultiHeadAttention, FeedForward, attention_key_bias
#include "model/m3ae.h"            // M3AE, model_config_preset
#include "model/m3ae_import.h"     // m3ae_parameter_sources

namespace {

using vqa::model::Activation;
using vqa::model::FeedForward;
using vqa::model::M3AE;
using vqa::model::model_config_preset;
using vqa::model::MultiHeadAttention;
using vqa::model::MultiHeadAttentionImpl;

// Operators dispatched on this thread while it lives, by name.
class OperatorLog {
 public:
  OperatorLog() {
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& call)
                                       -> std::unique_ptr<at::ObserverContext> {
          if (call.scope() == at::RecordScope::FUNCTION) names().push_back(call.name());
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
    names().clear();
  }
  ~OperatorLog() { at::removeCallback(handle_); }
  int64_t total() const { return static_cast<int64_t>(names().size()); }
  int64_t count(const char* name) const {
    int64_t n = 0;
    for (const auto& seen : names()) n += seen == name ? 1 : 0;
    return n;
  }

 private:
  static std::vector<std::string>& names() {
    thread_local std::vector<std::string> seen;
    return seen;
  }
  at::CallbackHandle handle_;
};

// silu(1.702 x) / 1.702 against CLIP's x * sigmoid(1.702 x) on the same
// Linear outputs: float32 rounding apart only (largest difference measured
// 8.6e-5 relative to |value| + 1e-3, at values near zero).
TEST(LeanStep, QuickGeluIsOneSiluOfTheSameFunction) {
  torch::manual_seed(7);
  FeedForward feed_forward(/*hidden=*/64, /*ffn=*/3072, Activation::kQuickGelu);
  torch::NoGradGuard no_grad;
  const auto x = 2.0 * torch::randn({4, 16, 64});
  auto parameters = feed_forward->named_parameters();
  const auto inner = torch::linear(x, parameters["up.weight"], parameters["up.bias"]);
  const auto reference = torch::linear(inner * torch::sigmoid(1.702 * inner),
                                       parameters["down.weight"], parameters["down.bias"]);
  const auto out = feed_forward(x);
  const double largest = ((out - reference).abs() / (reference.abs() + 1e-3)).max().item<double>();
  std::cout << "QuickGELU: largest relative difference " << largest << "\n";
  EXPECT_TRUE(torch::allclose(out, reference, /*rtol=*/1e-5, /*atol=*/1e-6)) << largest;
}

// in_weight's rows are q, k and v in that order and the biases are q's and
// v's, packed (one GEMM) or not, self- and cross-attention, against the
// attention written out from the parameters.
TEST(LeanStep, PackedWeightRowsAreQueryKeyValue) {
  torch::manual_seed(8);
  const int64_t hidden = 32, heads = 4;
  MultiHeadAttention attention(hidden, heads, /*dropout=*/0.0);
  attention->set_fused_attention(false);
  torch::NoGradGuard no_grad;
  auto p = attention->named_parameters();
  p["query_bias"].normal_();
  p["value_bias"].normal_();
  const auto queries = torch::randn({2, 5, hidden});
  const auto keys = torch::randn({2, 7, hidden});
  const auto w = p["in_weight"];
  const auto reference = [&](const torch::Tensor& kv) {
    const auto split = [&](const torch::Tensor& x) {
      return x.view({x.size(0), x.size(1), heads, hidden / heads}).transpose(1, 2);
    };
    const auto q = split(torch::linear(queries, w.slice(0, 0, hidden), p["query_bias"]));
    const auto k = split(torch::linear(kv, w.slice(0, hidden, 2 * hidden)));
    const auto v = split(torch::linear(kv, w.slice(0, 2 * hidden), p["value_bias"]));
    const auto probabilities =
        torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(hidden / heads), -1);
    const auto context = torch::matmul(probabilities, v).transpose(1, 2).reshape(queries.sizes());
    return torch::linear(context, p["output.weight"], p["output.bias"]);
  };
  for (const bool packed : {true, false}) {
    attention->set_packed_projections(packed);
    for (const auto& kv : {queries, keys}) {
      const auto out = attention(queries, kv, torch::Tensor());
      EXPECT_TRUE(torch::allclose(out, reference(kv), 1e-5, 1e-6))
          << (packed ? "packed" : "separate") << (kv.is_same(queries) ? ", self" : ", cross")
          << ": largest difference " << (out - reference(kv)).abs().max().item<float>();
    }
  }
}

// M3AE's separate q, k and v weights (RoBERTa, METER's layers) fill in_weight's
// rows in that order; CLIP's packed in_proj_weight fills it whole, and its
// in_proj_bias gives the q and v biases their rows.
TEST(LeanStep, M3aeNamesMapOntoPackedRows) {
  M3AE model(model_config_preset("tiny"));
  const int64_t h = model->config().hidden;
  std::map<std::string, std::vector<vqa::model::M3aeSource>> sources;
  for (const auto& [name, source] : vqa::model::m3ae_parameter_sources(model)) {
    sources[name].push_back(source);
  }
  const auto text = sources.at("text.layers.0.attention.in_weight");
  ASSERT_EQ(text.size(), 3u);
  const char* parts[] = {"query", "key", "value"};
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(text[i].name, std::string("language_encoder.encoder.layer.0.attention.self.") +
                                parts[i] + ".weight");
    EXPECT_EQ(text[i].into_begin, i * h);
    EXPECT_EQ(text[i].into_end, (i + 1) * h);
  }
  const auto cross = sources.at("fusion.image_layers.0.cross_attention.in_weight");
  ASSERT_EQ(cross.size(), 3u);
  EXPECT_EQ(cross[1].name, "multi_modal_vision_layers.0.crossattention.self.key.weight");
  EXPECT_EQ(cross[1].into_begin, h);
  const auto clip = sources.at("vision.blocks.0.attention.in_weight");
  ASSERT_EQ(clip.size(), 1u);
  EXPECT_EQ(clip[0].name, "vision_encoder.visual.transformer.resblocks.0.attn.in_proj_weight");
  EXPECT_EQ(clip[0].into_begin, -1);
  const auto value_bias = sources.at("vision.blocks.0.attention.value_bias");
  EXPECT_EQ(value_bias[0].row_begin, 2 * h);
  EXPECT_EQ(sources.at("text.layers.0.attention.query_bias")[0].name,
            "language_encoder.encoder.layer.0.attention.self.query.bias");
}

// A batch without padding builds no key bias and adds none to any score:
// fewer operators (the mask's ops and one add per masked attention), the
// same logits bit for bit.
TEST(LeanStep, NoPaddingMeansNoMask) {
  torch::manual_seed(9);
  const auto config = model_config_preset("tiny");
  M3AE model(config);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto images = torch::randn({2, 3, config.image_size, config.image_size});
  const auto ids = torch::randint(config.vocab_size, {2, 6});
  const auto mask = torch::ones({2, 6}, torch::kLong);
  int64_t unmasked = 0, masked = 0;
  torch::Tensor logits_unmasked, logits_masked;
  {
    OperatorLog log;
    logits_unmasked = model(images, ids, mask);
    unmasked = log.total();
  }
  {
    OperatorLog log;
    logits_masked = model(images, ids, mask, /*text_padded=*/true);
    masked = log.total();
  }
  std::cout << "operators: " << unmasked << " without a mask, " << masked << " with one\n";
  EXPECT_TRUE(torch::equal(logits_unmasked, logits_masked));
  const int64_t masked_attentions = config.text_layers + 2 * config.fusion_layers;
  EXPECT_GE(masked - unmasked, masked_attentions);
}

// On the fused path (LibTorch 2.x) the heads go to the kernel as strided
// views: no copy of q, k or v.
TEST(LeanStep, FusedAttentionCopiesNoHeads) {
  if (!MultiHeadAttentionImpl::fused_attention_available()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused attention";
  }
  torch::manual_seed(10);
  MultiHeadAttention attention(/*hidden=*/32, /*heads=*/4, /*dropout=*/0.0);
  attention->set_fused_attention(true);
  torch::NoGradGuard no_grad;
  const auto queries = torch::randn({2, 5, 32});
  for (const bool packed : {true, false}) {
    attention->set_packed_projections(packed);
    OperatorLog log;
    attention(queries, queries, torch::Tensor());
    EXPECT_EQ(log.count("aten::contiguous") + log.count("aten::clone"), 0)
        << (packed ? "packed" : "separate");
  }
}

// autocast_enable / autocast_disable and the state they leave, read back
// through autocast_enabled and autocast_dtype, per device type: on the CPU
// it is what the model reads (the key bias's dtype, HiddenNorm).
TEST(LeanStep, AutocastStateReadsBackWhatWasSet) {
  using vqa::model::autocast_dtype;
  using vqa::model::autocast_enabled;
  ASSERT_FALSE(autocast_enabled(c10::DeviceType::CPU));
  vqa::model::autocast_enable(c10::DeviceType::CPU, torch::kBFloat16);
  EXPECT_TRUE(autocast_enabled(c10::DeviceType::CPU));
  EXPECT_EQ(autocast_dtype(c10::DeviceType::CPU), torch::kBFloat16);
  EXPECT_FALSE(autocast_enabled(c10::DeviceType::CUDA)) << "the CPU's switch only";
  EXPECT_FALSE(autocast_enabled(c10::DeviceType::Meta)) << "neither CPU nor CUDA";
  vqa::model::autocast_disable(c10::DeviceType::CPU);
  EXPECT_FALSE(autocast_enabled(c10::DeviceType::CPU));
  EXPECT_EQ(autocast_dtype(c10::DeviceType::CPU), torch::kBFloat16) << "kept when off";
  // CUDA's state is set and read without a GPU (nothing runs under it).
  vqa::model::autocast_enable(c10::DeviceType::CUDA, torch::kHalf);
  EXPECT_TRUE(autocast_enabled(c10::DeviceType::CUDA));
  EXPECT_EQ(autocast_dtype(c10::DeviceType::CUDA), torch::kHalf);
  EXPECT_FALSE(autocast_enabled(c10::DeviceType::CPU));
  vqa::model::autocast_disable(c10::DeviceType::CUDA);
  EXPECT_FALSE(autocast_enabled(c10::DeviceType::CUDA));
}

}  // namespace
