// The image side's encoders. Both return [B, 1 + tokens, hidden] with a
// learned class token at position 0, which the head pools.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "model/layers.h"        // PreNormBlock
#include "model/model_config.h"  // ModelConfig

namespace vqa::model {

// A ViT over pixels, shaped like CLIP's visual transformer: patch embedding
// (a bias-free convolution with stride = kernel = patch_size), class token,
// learned positions, LayerNorm, pre-LayerNorm blocks, final LayerNorm on
// every token (M3AE's CLIP has no output projection). Sizes, the blocks'
// activation and the LayerNorm epsilon come from the config.
class VisionTransformerImpl : public torch::nn::Module {
 public:
  explicit VisionTransformerImpl(const ModelConfig& config);

  // images: float [B, 3, image_size, image_size], already normalised.
  // Returns [B, 1 + (image_size / patch_size)^2, hidden].
  torch::Tensor forward(const torch::Tensor& images);

 private:
  int64_t image_size_;
  torch::nn::Conv2d patch_embedding_;
  torch::Tensor class_token_;          // [hidden]
  torch::Tensor position_embeddings_;  // [1 + patches, hidden]
  HiddenNorm input_norm_;
  torch::nn::ModuleList blocks_;
  std::vector<PreNormBlock> typed_blocks_;  // the same modules as blocks_, for typed calls
  HiddenNorm output_norm_;
};
TORCH_MODULE(VisionTransformer);

// The vision encoder when the dataset holds pre-extracted features: a linear
// projection to hidden, a class token, learned positions and a LayerNorm (the
// features' scale is arbitrary; the fusion layers expect normalised input).
class FeatureEncoderImpl : public torch::nn::Module {
 public:
  explicit FeatureEncoderImpl(const ModelConfig& config);

  // features: float [B, T, feature_dim] with T <= feature_tokens.
  // Returns [B, 1 + T, hidden].
  torch::Tensor forward(const torch::Tensor& features);

 private:
  int64_t feature_tokens_;
  int64_t feature_dim_;
  torch::nn::Linear projection_;
  torch::Tensor class_token_;          // [hidden]
  torch::Tensor position_embeddings_;  // [1 + feature_tokens, hidden]
  HiddenNorm norm_;
};
TORCH_MODULE(FeatureEncoder);

}  // namespace vqa::model
