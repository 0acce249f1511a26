#include "model/layers.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/version.h>

#include <cmath>
#include <stdexcept>

#include "model/autocast_state.h"  // autocast_enabled, autocast_dtype

// at::scaled_dot_product_attention came with LibTorch 2.0.
#if TORCH_VERSION_MAJOR >= 2
#define VQA_HAVE_SDPA 1
#endif

namespace vqa::model {

namespace {

// Large enough that exp() of it underflows to exactly 0 in fp32, small enough
// to stay finite in fp16 (unlike -inf, it cannot turn a row into NaN).
constexpr double kMaskedScore = -1e4;

// CLIP's QuickGELU: x * sigmoid(1.702 x).
constexpr double kQuickGeluScale = 1.702;

torch::nn::LayerNormOptions layer_norm_options(int64_t hidden, double eps) {
  return torch::nn::LayerNormOptions({hidden}).eps(eps);
}

// Whether autocast is on in bf16 for x's device (CPU or CUDA).
bool bf16_autocast_on(const torch::Tensor& x) {
  const c10::DeviceType device = x.device().type();
  return autocast_enabled(device) && autocast_dtype(device) == torch::kBFloat16;
}

}  // namespace

torch::Tensor attention_key_bias(const torch::Tensor& attention_mask, torch::ScalarType dtype) {
  TORCH_CHECK(attention_mask.dim() == 2, "attention_mask must be [B, L], got ",
              attention_mask.sizes());
  const torch::Tensor padded = attention_mask.eq(0).to(dtype);
  return (padded * kMaskedScore).unsqueeze(1).unsqueeze(2);
}

MultiHeadAttentionImpl::MultiHeadAttentionImpl(int64_t hidden, int64_t heads, double dropout)
    : heads_(heads), attention_dropout_(torch::nn::DropoutOptions(dropout)) {
  TORCH_CHECK(hidden % heads == 0, "hidden (", hidden, ") must be a multiple of heads (", heads,
              ")");
  in_weight_ = register_parameter("in_weight", torch::empty({3 * hidden, hidden}));
  query_bias_ = register_parameter("query_bias", torch::empty({hidden}));
  value_bias_ = register_parameter("value_bias", torch::empty({hidden}));
  {
    // torch::nn::Linear's own initialisation, in the order the separate q,
    // k (no bias) and v layers drew it before the output layer: a seeded
    // model draws the same numbers as with those layers (M3AE's
    // initialisation, which overwrites these, included).
    torch::NoGradGuard no_grad;
    const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
    for (int64_t row = 0; row < 3; ++row) {
      torch::nn::init::kaiming_uniform_(in_weight_.narrow(0, row * hidden, hidden), std::sqrt(5.0));
      if (row == 0) query_bias_.uniform_(-bound, bound);
      if (row == 2) value_bias_.uniform_(-bound, bound);
    }
  }
  output_ = register_module("output", torch::nn::Linear(hidden, hidden));
  register_module("attention_dropout", attention_dropout_);
}

torch::Tensor MultiHeadAttentionImpl::forward(const torch::Tensor& queries,
                                              const torch::Tensor& keys_values,
                                              const torch::Tensor& key_bias) {
  const int64_t batch = queries.size(0);
  const int64_t query_length = queries.size(1);
  const int64_t hidden = queries.size(2);
  const int64_t head_size = hidden / heads_;
#ifdef VQA_HAVE_SDPA
  const bool fused = fused_;
#else
  const bool fused = false;
#endif
  // [B, L, hidden] -> [B, heads, L, head_size]. The fused kernels take the
  // strided view as it is; for the explicit path it is made contiguous: CPU
  // matmul on the transposed view copies per batch and measured several times
  // slower than the copy it saves.
  const auto split_heads = [&](const torch::Tensor& x) {
    const torch::Tensor heads = x.view({batch, x.size(1), heads_, head_size}).transpose(1, 2);
    return fused ? heads : heads.contiguous();
  };
  // Apart, the rows are taken with one split: its backward is one cat of
  // the parts' gradients (row slices would each add a zero-filled full copy).
  torch::Tensor q, k, v;
  if (packed_ && queries.is_same(keys_values)) {
    const auto qkv =
        torch::linear(queries, in_weight_, packed_bias(/*with_query=*/true)).chunk(3, /*dim=*/-1);
    q = split_heads(qkv[0]);
    k = split_heads(qkv[1]);
    v = split_heads(qkv[2]);
  } else if (packed_) {
    const auto weights = in_weight_.split_with_sizes({hidden, 2 * hidden});
    q = split_heads(torch::linear(queries, weights[0], query_bias_));
    const auto kv = torch::linear(keys_values, weights[1], packed_bias(/*with_query=*/false))
                        .chunk(2, /*dim=*/-1);
    k = split_heads(kv[0]);
    v = split_heads(kv[1]);
  } else {
    const auto weights = in_weight_.split(hidden);
    q = split_heads(torch::linear(queries, weights[0], query_bias_));
    k = split_heads(torch::linear(keys_values, weights[1]));
    v = split_heads(torch::linear(keys_values, weights[2], value_bias_));
  }
#ifdef VQA_HAVE_SDPA
  if (fused) {
    const double dropout = is_training() ? attention_dropout_->options.p() : 0.0;
    // The mask must match q's dtype; M3AE builds it in the compute dtype
    // already, so the cast is only for a caller that did not.
    c10::optional<at::Tensor> mask;
    if (key_bias.defined()) {
      mask = key_bias.scalar_type() == q.scalar_type() ? key_bias : key_bias.to(q.scalar_type());
    }
    const torch::Tensor context =
        at::scaled_dot_product_attention(q, k, v, mask, dropout, /*is_causal=*/false);
    return apply_linear(output_, context.transpose(1, 2).reshape({batch, query_length, hidden}));
  }
#endif

  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(head_size));
  if (key_bias.defined()) {
    scores = scores + key_bias;
  }
  const torch::Tensor probabilities = attention_dropout_(torch::softmax(scores, /*dim=*/-1));
  const torch::Tensor context =
      torch::matmul(probabilities, v).transpose(1, 2).reshape({batch, query_length, hidden});
  return apply_linear(output_, context);
}

torch::Tensor MultiHeadAttentionImpl::packed_bias(bool with_query) {
  // A constant zero kept with the module's device and dtype, made again only
  // when those change: no allocation per call.
  if (!key_bias_zeros_.defined() || key_bias_zeros_.device() != query_bias_.device() ||
      key_bias_zeros_.scalar_type() != query_bias_.scalar_type()) {
    key_bias_zeros_ = torch::zeros_like(query_bias_, torch::MemoryFormat::Contiguous).detach();
  }
  if (with_query) return torch::cat({query_bias_, key_bias_zeros_, value_bias_});
  return torch::cat({key_bias_zeros_, value_bias_});
}

bool MultiHeadAttentionImpl::fused_attention_available() {
#ifdef VQA_HAVE_SDPA
  return true;
#else
  return false;
#endif
}

void MultiHeadAttentionImpl::set_packed_projections(bool packed) { packed_ = packed; }

void set_packed_projections(torch::nn::Module& root, bool packed) {
  root.apply([packed](torch::nn::Module& module) {
    if (auto* attention = module.as<MultiHeadAttentionImpl>()) {
      attention->set_packed_projections(packed);
    }
  });
}

void MultiHeadAttentionImpl::set_fused_attention(bool fused) {
  if (fused && !fused_attention_available()) {
    throw std::invalid_argument(
        "fused attention needs LibTorch 2.0 or later (at::scaled_dot_product_attention)");
  }
  fused_ = fused;
}

torch::Tensor HiddenNormImpl::forward(const torch::Tensor& x) {
  if (!bf16_hidden_states_ || !bf16_autocast_on(x)) return torch::nn::LayerNormImpl::forward(x);
  if (x.scalar_type() != torch::kBFloat16) {
    return torch::nn::LayerNormImpl::forward(x).to(torch::kBFloat16);
  }
  // Autocast runs layer_norm in float32 (casting x up); it is kept out of
  // this call, and the affine parameters are cast as a linear's weights are:
  // once per forward, the gradient flowing back to the float32 parameter.
  const c10::DeviceType device = x.device().type();
  const torch::Tensor weight_bf16 = at::autocast::cached_cast(torch::kBFloat16, weight, device);
  const torch::Tensor bias_bf16 = at::autocast::cached_cast(torch::kBFloat16, bias, device);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return torch::layer_norm(x, options.normalized_shape(), weight_bf16, bias_bf16, options.eps());
}

void set_bf16_hidden_states(torch::nn::Module& root, bool on) {
  root.apply([on](torch::nn::Module& module) {
    if (auto* norm = module.as<HiddenNormImpl>()) norm->set_bf16_hidden_states(on);
  });
}

FeedForwardImpl::FeedForwardImpl(int64_t hidden, int64_t ffn, Activation activation)
    : activation_(activation),
      up_(torch::nn::LinearOptions(hidden, ffn)),
      down_(torch::nn::LinearOptions(ffn, hidden)) {
  register_module("up", up_);
  register_module("down", down_);
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  const torch::Tensor inner = apply_linear(up_, x);
  if (activation_ == Activation::kQuickGelu) {
    // x * sigmoid(1.702 x) as silu(1.702 x) / 1.702: the same function, one
    // activation kernel instead of sigmoid and a product (and a shorter
    // backward); within a few ulps of the old formula (tests hold it).
    return apply_linear(down_, torch::silu(inner * kQuickGeluScale) / kQuickGeluScale);
  }
  return apply_linear(down_, torch::gelu(inner));
}

PreNormBlockImpl::PreNormBlockImpl(int64_t hidden, int64_t heads, int64_t ffn,
                                   double layer_norm_eps, Activation activation)
    : attention_norm_(layer_norm_options(hidden, layer_norm_eps)),
      feed_forward_norm_(layer_norm_options(hidden, layer_norm_eps)),
      attention_(hidden, heads, /*dropout=*/0.0),
      feed_forward_(hidden, ffn, activation) {
  register_module("attention_norm", attention_norm_);
  register_module("attention", attention_);
  register_module("feed_forward_norm", feed_forward_norm_);
  register_module("feed_forward", feed_forward_);
}

torch::Tensor PreNormBlockImpl::forward(const torch::Tensor& x) {
  const torch::Tensor normed = attention_norm_(x);
  const torch::Tensor after_attention =
      x + attention_(normed, normed, /*key_bias=*/torch::Tensor());
  return after_attention + feed_forward_(feed_forward_norm_(after_attention));
}

PostNormLayerImpl::PostNormLayerImpl(int64_t hidden, int64_t heads, int64_t ffn, double dropout,
                                     double layer_norm_eps)
    : attention_(hidden, heads, dropout),
      attention_norm_(layer_norm_options(hidden, layer_norm_eps)),
      feed_forward_(hidden, ffn),
      feed_forward_norm_(layer_norm_options(hidden, layer_norm_eps)),
      dropout_(torch::nn::DropoutOptions(dropout)) {
  register_module("attention", attention_);
  register_module("attention_norm", attention_norm_);
  register_module("feed_forward", feed_forward_);
  register_module("feed_forward_norm", feed_forward_norm_);
  register_module("dropout", dropout_);
}

torch::Tensor PostNormLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& key_bias) {
  const torch::Tensor attended = attention_norm_(x + dropout_(attention_(x, x, key_bias)));
  return feed_forward_norm_(attended + dropout_(feed_forward_(attended)));
}

CoAttentionLayerImpl::CoAttentionLayerImpl(int64_t hidden, int64_t heads, int64_t ffn,
                                           double dropout, double layer_norm_eps)
    : self_attention_(hidden, heads, dropout),
      self_attention_norm_(layer_norm_options(hidden, layer_norm_eps)),
      cross_attention_(hidden, heads, dropout),
      cross_attention_norm_(layer_norm_options(hidden, layer_norm_eps)),
      feed_forward_(hidden, ffn),
      feed_forward_norm_(layer_norm_options(hidden, layer_norm_eps)),
      dropout_(torch::nn::DropoutOptions(dropout)) {
  register_module("self_attention", self_attention_);
  register_module("self_attention_norm", self_attention_norm_);
  register_module("cross_attention", cross_attention_);
  register_module("cross_attention_norm", cross_attention_norm_);
  register_module("feed_forward", feed_forward_);
  register_module("feed_forward_norm", feed_forward_norm_);
  register_module("dropout", dropout_);
}

torch::Tensor CoAttentionLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& x_key_bias,
                                            const torch::Tensor& other,
                                            const torch::Tensor& other_key_bias) {
  const torch::Tensor self_attended =
      self_attention_norm_(x + dropout_(self_attention_(x, x, x_key_bias)));
  const torch::Tensor cross_attended = cross_attention_norm_(
      self_attended + dropout_(cross_attention_(self_attended, other, other_key_bias)));
  return feed_forward_norm_(cross_attended + dropout_(feed_forward_(cross_attended)));
}

}  // namespace vqa::model
