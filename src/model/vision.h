// The image side's encoders. Both return [B, 1 + tokens, hidden] with a
// learned class token at position 0, which the head pools.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "model/layers.h"  // PreNormBlock

namespace vqa::model {

// A ViT over pixels, shaped like CLIP's visual transformer: patch embedding
// (a bias-free convolution with stride = kernel = patch_size), class token,
// learned positions, LayerNorm, pre-LayerNorm blocks, final LayerNorm.
class VisionTransformerImpl : public torch::nn::Module {
 public:
  VisionTransformerImpl(int64_t hidden, int64_t heads, int64_t ffn, int64_t layers,
                        int64_t image_size, int64_t patch_size);

  // images: float [B, 3, image_size, image_size], already normalised.
  // Returns [B, 1 + (image_size / patch_size)^2, hidden].
  torch::Tensor forward(const torch::Tensor& images);

 private:
  int64_t image_size_;
  torch::nn::Conv2d patch_embedding_;
  torch::Tensor class_token_;          // [hidden]
  torch::Tensor position_embeddings_;  // [1 + patches, hidden]
  torch::nn::LayerNorm input_norm_;
  torch::nn::ModuleList blocks_;
  std::vector<PreNormBlock> typed_blocks_;  // the same modules as blocks_, for typed calls
  torch::nn::LayerNorm output_norm_;
};
TORCH_MODULE(VisionTransformer);

// The vision encoder when the dataset holds pre-extracted features: a linear
// projection to hidden, a class token, learned positions and a LayerNorm (the
// features' scale is arbitrary; the fusion layers expect normalised input).
class FeatureEncoderImpl : public torch::nn::Module {
 public:
  FeatureEncoderImpl(int64_t hidden, int64_t feature_tokens, int64_t feature_dim);

  // features: float [B, T, feature_dim] with T <= feature_tokens.
  // Returns [B, 1 + T, hidden].
  torch::Tensor forward(const torch::Tensor& features);

 private:
  int64_t feature_tokens_;
  int64_t feature_dim_;
  torch::nn::Linear projection_;
  torch::Tensor class_token_;          // [hidden]
  torch::Tensor position_embeddings_;  // [1 + feature_tokens, hidden]
  torch::nn::LayerNorm norm_;
};
TORCH_MODULE(FeatureEncoder);

}  // namespace vqa::model
