#include "model/text_encoder.h"

namespace vqa::model {

namespace {
// RoBERTa's padding_idx: the position row of padding, and the offset of the
// first real token's position (padding_idx + 1).
constexpr int64_t kRobertaPaddingIndex = 1;
}  // namespace

int64_t TextEncoderImpl::position_rows(const ModelConfig& config) {
  return config.max_text_length + (config.roberta_positions ? kRobertaPaddingIndex + 1 : 0);
}

TextEncoderImpl::TextEncoderImpl(const ModelConfig& config)
    : max_text_length_(config.max_text_length),
      roberta_positions_(config.roberta_positions),
      token_embeddings_(torch::nn::EmbeddingOptions(config.vocab_size, config.hidden)),
      position_embeddings_(torch::nn::EmbeddingOptions(position_rows(config), config.hidden)),
      embedding_norm_(torch::nn::LayerNormOptions({config.hidden}).eps(config.text_layer_norm_eps)),
      embedding_dropout_(torch::nn::DropoutOptions(config.dropout)) {
  register_module("token_embeddings", token_embeddings_);
  register_module("position_embeddings", position_embeddings_);
  if (config.text_token_type) {
    token_type_embeddings_ = torch::nn::Embedding(torch::nn::EmbeddingOptions(1, config.hidden));
    register_module("token_type_embeddings", token_type_embeddings_);
  }
  register_module("embedding_norm", embedding_norm_);
  register_module("embedding_dropout", embedding_dropout_);
  for (int64_t i = 0; i < config.text_layers; ++i) {
    typed_layers_.emplace_back(config.hidden, config.heads, config.ffn, config.dropout,
                               config.text_layer_norm_eps);
    layers_->push_back(typed_layers_.back());
  }
  register_module("layers", layers_);
}

torch::Tensor TextEncoderImpl::forward(const torch::Tensor& token_ids,
                                       const torch::Tensor& attention_mask,
                                       const torch::Tensor& key_bias) {
  TORCH_CHECK(token_ids.dim() == 2 && token_ids.size(1) <= max_text_length_,
              "token_ids must be [B, L <= ", max_text_length_, "], got ", token_ids.sizes());
  torch::Tensor x = token_embeddings_(token_ids);
  if (roberta_positions_) {
    // RoBERTa's create_position_ids_from_input_ids on the mask: padding_idx +
    // the running count of real tokens, padding_idx itself at padding.
    const torch::Tensor real = attention_mask.ne(0).to(torch::kLong);
    const torch::Tensor positions = real.cumsum(/*dim=*/1) * real + kRobertaPaddingIndex;
    x = x + position_embeddings_(positions);
  } else {
    // Positions 0..L-1 are the first L rows of the table: a slice, no index tensor.
    x = x + position_embeddings_->weight.slice(/*dim=*/0, /*start=*/0, /*end=*/token_ids.size(1));
  }
  if (token_type_embeddings_) x = x + token_type_embeddings_->weight[0];
  x = embedding_dropout_(embedding_norm_(x));
  for (auto& layer : typed_layers_) {
    x = layer(x, key_bias);
  }
  return x;
}

}  // namespace vqa::model
