// The text encoder: RoBERTa-style token and position embeddings (and, for
// M3AE's RoBERTa, its one token type), an embedding LayerNorm, then
// post-LayerNorm BERT layers that never attend to padding.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "model/layers.h"        // PostNormLayer
#include "model/model_config.h"  // ModelConfig

namespace vqa::model {

class TextEncoderImpl : public torch::nn::Module {
 public:
  // Sizes, dropout, the LayerNorm epsilon, the position rule and the token
  // type from the config (model_config.h).
  explicit TextEncoderImpl(const ModelConfig& config);

  // token_ids: int64 [B, L] with L <= max_text_length and every id < vocab_size;
  // attention_mask: integer [B, L], 1 for a real token (the real tokens of a
  // row come first); key_bias: attention_key_bias() of that mask.
  // Returns [B, L, hidden]; rows at padded positions are computed but carry
  // nothing into real positions.
  torch::Tensor forward(const torch::Tensor& token_ids, const torch::Tensor& attention_mask,
                        const torch::Tensor& key_bias);

  // Rows of the position table: max_text_length, plus RoBERTa's two offset rows.
  static int64_t position_rows(const ModelConfig& config);

 private:
  int64_t max_text_length_;
  bool roberta_positions_;
  torch::nn::Embedding token_embeddings_;
  torch::nn::Embedding position_embeddings_;
  torch::nn::Embedding token_type_embeddings_{nullptr};  // [1, hidden] when text_token_type
  HiddenNorm embedding_norm_;
  torch::nn::Dropout embedding_dropout_;
  torch::nn::ModuleList layers_;
  std::vector<PostNormLayer> typed_layers_;  // the same modules as layers_, for typed calls
};
TORCH_MODULE(TextEncoder);

}  // namespace vqa::model
