// Transformer building blocks shared by the encoders and the fusion layers.
//
// Shapes: hidden states are [B, L, hidden]. A key bias is the additive
// attention bias of attention_key_bias(): [B, 1, 1, Lk], 0 for a real key and
// a large negative number for a padded one, or an undefined tensor when every
// key is real (no mask work at all).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model_config.h"  // Activation

namespace vqa::model {

// `layer` applied to x through ATen's linear, as PyTorch's nn.Linear: one
// GEMM with the bias added inside it (under autocast in the compute dtype,
// the bias cast like the weight). torch::nn::Linear's own forward, LibTorch's
// C++ functional linear, multiplies and then adds the bias in place: one
// more operator, and under autocast a float32 bias added to the rounded
// product. Every Linear of the model is applied through this.
inline torch::Tensor apply_linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

// attention_mask: integer or bool [B, L], non-zero for a real token.
// Returns the [B, 1, 1, L] additive bias in `dtype`.
torch::Tensor attention_key_bias(const torch::Tensor& attention_mask, torch::ScalarType dtype);

// Multi-head scaled dot-product attention of `queries` over `keys_values`.
// The key projection has no bias: softmax is invariant to a per-query
// constant, so a key bias always receives an exactly zero gradient.
// Parameters: in_weight [3 hidden, hidden] (q, k, v rows), query_bias and
// value_bias [hidden], output.weight and output.bias.
class MultiHeadAttentionImpl : public torch::nn::Module {
 public:
  MultiHeadAttentionImpl(int64_t hidden, int64_t heads, double dropout);

  // queries [B, Lq, hidden], keys_values [B, Lk, hidden], key_bias as above.
  // Returns [B, Lq, hidden].
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys_values,
                        const torch::Tensor& key_bias);

  // LibTorch 2.x's at::scaled_dot_product_attention (flash or memory-
  // efficient kernels on GPU) instead of the explicit matmul-softmax-matmul;
  // the default where it exists. The same function either way (a test
  // checks 1e-5), except for the dropout's random draws.
  static bool fused_attention_available();
  void set_fused_attention(bool fused);

  // Packed: one GEMM for q, k and v (self-attention), or one
  // for k and v (cross-attention). Separate: three GEMMs over views of the
  // same weight, arithmetic for arithmetic what separate Linear layers did.
  // Same parameters either way. --packed-attention auto packs on GPUs only:
  // on the CPU (OpenBLAS, one thread) it measured no faster (docs/design.md).
  void set_packed_projections(bool packed);

  // The tensors forward reads the parameters through, by their names in
  // this module's named_parameters() (WeightCopies points them at copies).
  std::vector<std::pair<std::string, torch::Tensor*>> parameter_members() {
    return {{"in_weight", &in_weight_}, {"query_bias", &query_bias_}, {"value_bias", &value_bias_}};
  }

 private:
  int64_t heads_;
  bool fused_ = fused_attention_available();
  bool packed_ = false;
  // The q, k and v weights as rows [0, h), [h, 2h), [2h, 3h) of one
  // parameter (nn.MultiheadAttention's in_proj_weight layout), so that no
  // call concatenates them. Biases for q and v only (see above on the key).
  torch::Tensor in_weight_, query_bias_, value_bias_;
  torch::Tensor key_bias_zeros_;  // the key's place in a packed bias; not a parameter
  torch::nn::Linear output_{nullptr};
  torch::nn::Dropout attention_dropout_;

  // [query_bias; 0; value_bias], or [0; value_bias] without the query.
  torch::Tensor packed_bias(bool with_query);
};
TORCH_MODULE(MultiHeadAttention);

// set_packed_projections on every MultiHeadAttention under `root`.
void set_packed_projections(torch::nn::Module& root, bool packed);

// The LayerNorm of the hidden states between blocks: a torch::nn::LayerNorm
// (same options, parameters and names) that, when set_bf16_hidden_states is
// on and bf16 autocast is on for its input's device, returns bf16 instead of
// autocast's float32, so that the residual sums stay bf16 and the next
// linear casts nothing. A bf16 input runs the bf16 kernel (mean and variance
// accumulated in float32) with the weight and bias cast through autocast's
// per-forward cache; a float32 one (an embedding sum) is normalised in
// float32, then cast. Off, in float32, fp16 or without autocast: plain LayerNorm.
class HiddenNormImpl : public torch::nn::LayerNormImpl {
 public:
  using torch::nn::LayerNormImpl::LayerNormImpl;
  torch::Tensor forward(const torch::Tensor& x);
  void set_bf16_hidden_states(bool on) { bf16_hidden_states_ = on; }

 private:
  bool bf16_hidden_states_ = false;
};
TORCH_MODULE(HiddenNorm);

// set_bf16_hidden_states on every HiddenNorm under `root`.
void set_bf16_hidden_states(torch::nn::Module& root, bool on);

// Linear(hidden, ffn) -> GELU (or QuickGELU) -> Linear(ffn, hidden).
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t hidden, int64_t ffn, Activation activation = Activation::kGelu);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Activation activation_;
  torch::nn::Linear up_, down_;
};
TORCH_MODULE(FeedForward);

// A ViT block with LayerNorm before each branch (CLIP's residual block).
class PreNormBlockImpl : public torch::nn::Module {
 public:
  PreNormBlockImpl(int64_t hidden, int64_t heads, int64_t ffn, double layer_norm_eps,
                   Activation activation);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  HiddenNorm attention_norm_, feed_forward_norm_;
  MultiHeadAttention attention_;
  FeedForward feed_forward_;
};
TORCH_MODULE(PreNormBlock);

// A BERT layer: LayerNorm after each residual sum.
class PostNormLayerImpl : public torch::nn::Module {
 public:
  PostNormLayerImpl(int64_t hidden, int64_t heads, int64_t ffn, double dropout,
                    double layer_norm_eps);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_bias);

 private:
  MultiHeadAttention attention_;
  HiddenNorm attention_norm_;
  FeedForward feed_forward_;
  HiddenNorm feed_forward_norm_;
  torch::nn::Dropout dropout_;
};
TORCH_MODULE(PostNormLayer);

// One side of M3AE's co-attention (METER's BertCrossLayer): self-attention,
// then cross-attention to the other modality, then the feed-forward block,
// each with a post-LayerNorm residual.
class CoAttentionLayerImpl : public torch::nn::Module {
 public:
  CoAttentionLayerImpl(int64_t hidden, int64_t heads, int64_t ffn, double dropout,
                       double layer_norm_eps);

  // x [B, Lx, hidden] attends to itself under x_key_bias and to other
  // [B, Lo, hidden] under other_key_bias. Returns [B, Lx, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& x_key_bias,
                        const torch::Tensor& other, const torch::Tensor& other_key_bias);

 private:
  MultiHeadAttention self_attention_;
  HiddenNorm self_attention_norm_;
  MultiHeadAttention cross_attention_;
  HiddenNorm cross_attention_norm_;
  FeedForward feed_forward_;
  HiddenNorm feed_forward_norm_;
  torch::nn::Dropout dropout_;
};
TORCH_MODULE(CoAttentionLayer);

}  // namespace vqa::model
