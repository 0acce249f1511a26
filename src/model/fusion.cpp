#include "model/fusion.h"

namespace vqa::model {

namespace {

constexpr int64_t kTextType = 0;
constexpr int64_t kImageType = 1;

}  // namespace

CoAttentionFusionImpl::CoAttentionFusionImpl(const ModelConfig& config)
    : text_projection_(torch::nn::LinearOptions(config.hidden, config.hidden)),
      image_projection_(torch::nn::LinearOptions(config.hidden, config.hidden)),
      modality_type_embeddings_(torch::nn::EmbeddingOptions(/*num_embeddings=*/2, config.hidden)) {
  const auto layer = [&config] {
    return CoAttentionLayer(config.hidden, config.heads, config.ffn, config.dropout,
                            config.fusion_layer_norm_eps);
  };
  register_module("text_projection", text_projection_);
  register_module("image_projection", image_projection_);
  register_module("modality_type_embeddings", modality_type_embeddings_);
  for (int64_t i = 0; i < config.fusion_layers; ++i) {
    typed_text_layers_.push_back(layer());
    text_layers_->push_back(typed_text_layers_.back());
    typed_image_layers_.push_back(layer());
    image_layers_->push_back(typed_image_layers_.back());
  }
  register_module("text_layers", text_layers_);
  register_module("image_layers", image_layers_);
}

std::pair<torch::Tensor, torch::Tensor> CoAttentionFusionImpl::forward(
    const torch::Tensor& text, const torch::Tensor& text_key_bias, const torch::Tensor& image) {
  const torch::Tensor& type_table = modality_type_embeddings_->weight;
  torch::Tensor x = apply_linear(text_projection_, text) + type_table[kTextType];
  torch::Tensor y = apply_linear(image_projection_, image) + type_table[kImageType];
  const torch::Tensor no_image_mask;  // every image token is real
  for (size_t i = 0; i < typed_text_layers_.size(); ++i) {
    torch::Tensor next_x = typed_text_layers_[i](x, text_key_bias, y, no_image_mask);
    torch::Tensor next_y = typed_image_layers_[i](y, no_image_mask, x, text_key_bias);
    x = std::move(next_x);
    y = std::move(next_y);
  }
  return {x, y};
}

}  // namespace vqa::model
