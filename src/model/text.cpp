#include "model/text.h"

namespace vqa::model {

TextEncoderImpl::TextEncoderImpl(int64_t hidden, int64_t heads, int64_t ffn, int64_t layers,
                                 int64_t vocab_size, int64_t max_text_length, double dropout)
    : max_text_length_(max_text_length),
      token_embeddings_(torch::nn::EmbeddingOptions(vocab_size, hidden)),
      position_embeddings_(torch::nn::EmbeddingOptions(max_text_length, hidden)),
      embedding_norm_(torch::nn::LayerNormOptions({hidden}).eps(kBertLayerNormEps)),
      embedding_dropout_(torch::nn::DropoutOptions(dropout)) {
  register_module("token_embeddings", token_embeddings_);
  register_module("position_embeddings", position_embeddings_);
  register_module("embedding_norm", embedding_norm_);
  register_module("embedding_dropout", embedding_dropout_);
  for (int64_t i = 0; i < layers; ++i) {
    typed_layers_.emplace_back(hidden, heads, ffn, dropout);
    layers_->push_back(typed_layers_.back());
  }
  register_module("layers", layers_);
}

torch::Tensor TextEncoderImpl::forward(const torch::Tensor& token_ids,
                                       const torch::Tensor& key_bias) {
  TORCH_CHECK(token_ids.dim() == 2 && token_ids.size(1) <= max_text_length_,
              "token_ids must be [B, L <= ", max_text_length_, "], got ", token_ids.sizes());
  // Positions 0..L-1 are the first L rows of the table: a slice, no index tensor.
  const torch::Tensor positions =
      position_embeddings_->weight.slice(/*dim=*/0, /*start=*/0, /*end=*/token_ids.size(1));
  torch::Tensor x = embedding_dropout_(embedding_norm_(token_embeddings_(token_ids) + positions));
  for (auto& layer : typed_layers_) {
    x = layer(x, key_bias);
  }
  return x;
}

}  // namespace vqa::model
