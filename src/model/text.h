// The text encoder: RoBERTa-style token and position embeddings, an embedding
// LayerNorm, then post-LayerNorm BERT layers that never attend to padding.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "model/layers.h"  // PostNormLayer

namespace vqa::model {

class TextEncoderImpl : public torch::nn::Module {
 public:
  TextEncoderImpl(int64_t hidden, int64_t heads, int64_t ffn, int64_t layers, int64_t vocab_size,
                  int64_t max_text_length, double dropout);

  // token_ids: int64 [B, L] with L <= max_text_length and every id < vocab_size;
  // key_bias: attention_key_bias() of the padding mask. Positions are 0..L-1
  // (no RoBERTa offset: the table is ours, not a checkpoint's).
  // Returns [B, L, hidden]; rows at padded positions are computed but carry
  // nothing into real positions.
  torch::Tensor forward(const torch::Tensor& token_ids, const torch::Tensor& key_bias);

 private:
  int64_t max_text_length_;
  torch::nn::Embedding token_embeddings_;
  torch::nn::Embedding position_embeddings_;
  torch::nn::LayerNorm embedding_norm_;
  torch::nn::Dropout embedding_dropout_;
  torch::nn::ModuleList layers_;
  std::vector<PostNormLayer> typed_layers_;  // the same modules as layers_, for typed calls
};
TORCH_MODULE(TextEncoder);

}  // namespace vqa::model
