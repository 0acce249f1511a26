#include "model/vision_encoder.h"

namespace vqa::model {

namespace {

// Prepends the class token to every sequence of the batch and adds the first
// 1 + tokens rows of the position table.
torch::Tensor add_class_token_and_positions(const torch::Tensor& tokens,
                                            const torch::Tensor& class_token,
                                            const torch::Tensor& position_embeddings) {
  const int64_t batch = tokens.size(0);
  const torch::Tensor class_tokens = class_token.view({1, 1, -1}).expand({batch, 1, -1});
  const torch::Tensor sequence = torch::cat({class_tokens, tokens}, /*dim=*/1);
  return sequence + position_embeddings.slice(/*dim=*/0, /*start=*/0, /*end=*/sequence.size(1));
}

}  // namespace

VisionTransformerImpl::VisionTransformerImpl(const ModelConfig& config)
    : image_size_(config.image_size),
      // No bias: the LayerNorm right after it would cancel a constant shift anyway.
      patch_embedding_(torch::nn::Conv2dOptions(/*in_channels=*/3, config.hidden, config.patch_size)
                           .stride(config.patch_size)
                           .bias(false)),
      input_norm_(torch::nn::LayerNormOptions({config.hidden}).eps(config.vision_layer_norm_eps)),
      output_norm_(torch::nn::LayerNormOptions({config.hidden}).eps(config.vision_layer_norm_eps)) {
  const int64_t hidden = config.hidden;
  const int64_t grid = config.image_size / config.patch_size;
  const int64_t patches = grid * grid;
  register_module("patch_embedding", patch_embedding_);
  class_token_ = register_parameter("class_token", torch::zeros({hidden}));
  position_embeddings_ =
      register_parameter("position_embeddings", torch::zeros({1 + patches, hidden}));
  register_module("input_norm", input_norm_);
  for (int64_t i = 0; i < config.vision_layers; ++i) {
    typed_blocks_.emplace_back(hidden, config.heads, config.ffn, config.vision_layer_norm_eps,
                               config.vision_activation);
    blocks_->push_back(typed_blocks_.back());
  }
  register_module("blocks", blocks_);
  register_module("output_norm", output_norm_);
}

torch::Tensor VisionTransformerImpl::forward(const torch::Tensor& images) {
  TORCH_CHECK(images.dim() == 4 && images.size(1) == 3 && images.size(2) == image_size_ &&
                  images.size(3) == image_size_,
              "images must be [B, 3, ", image_size_, ", ", image_size_, "], got ", images.sizes());
  // [B, hidden, grid, grid] -> [B, grid * grid, hidden]
  const torch::Tensor patches = patch_embedding_(images).flatten(/*start_dim=*/2).transpose(1, 2);
  torch::Tensor x =
      input_norm_(add_class_token_and_positions(patches, class_token_, position_embeddings_));
  for (auto& block : typed_blocks_) {
    x = block(x);
  }
  return output_norm_(x);
}

FeatureEncoderImpl::FeatureEncoderImpl(const ModelConfig& config)
    : feature_tokens_(config.feature_tokens),
      feature_dim_(config.feature_dim),
      projection_(torch::nn::LinearOptions(config.feature_dim, config.hidden)),
      norm_(torch::nn::LayerNormOptions({config.hidden}).eps(config.vision_layer_norm_eps)) {
  const int64_t hidden = config.hidden;
  const int64_t feature_tokens = config.feature_tokens;
  register_module("projection", projection_);
  class_token_ = register_parameter("class_token", torch::zeros({hidden}));
  position_embeddings_ =
      register_parameter("position_embeddings", torch::zeros({1 + feature_tokens, hidden}));
  register_module("norm", norm_);
}

torch::Tensor FeatureEncoderImpl::forward(const torch::Tensor& features) {
  TORCH_CHECK(features.dim() == 3 && features.size(1) <= feature_tokens_ &&
                  features.size(2) == feature_dim_,
              "features must be [B, T <= ", feature_tokens_, ", ", feature_dim_, "], got ",
              features.sizes());
  return norm_(add_class_token_and_positions(apply_linear(projection_, features), class_token_,
                                             position_embeddings_));
}

}  // namespace vqa::model
