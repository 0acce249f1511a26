#include "model/head.h"

#include "model/layers.h"  // apply_linear

namespace vqa::model {

VqaHeadImpl::VqaHeadImpl(const ModelConfig& config)
    : text_pooler_(torch::nn::LinearOptions(config.hidden, config.hidden)),
      image_pooler_(torch::nn::LinearOptions(config.hidden, config.hidden)),
      dense_(torch::nn::LinearOptions(2 * config.hidden, 2 * config.hidden)),
      norm_(torch::nn::LayerNormOptions({2 * config.hidden}).eps(config.head_layer_norm_eps)),
      output_(torch::nn::LinearOptions(2 * config.hidden, config.num_answers)) {
  register_module("text_pooler", text_pooler_);
  register_module("image_pooler", image_pooler_);
  register_module("dense", dense_);
  register_module("norm", norm_);
  register_module("output", output_);
}

torch::Tensor VqaHeadImpl::forward(const torch::Tensor& text, const torch::Tensor& image) {
  const torch::Tensor text_pooled =
      torch::tanh(apply_linear(text_pooler_, text.select(/*dim=*/1, /*index=*/0)));
  const torch::Tensor image_pooled =
      torch::tanh(apply_linear(image_pooler_, image.select(/*dim=*/1, /*index=*/0)));
  const torch::Tensor pooled = torch::cat({text_pooled, image_pooled}, /*dim=*/1);
  return apply_linear(output_, torch::gelu(norm_(apply_linear(dense_, pooled))));
}

}  // namespace vqa::model
