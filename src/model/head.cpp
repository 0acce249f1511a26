#include "model/head.h"

#include "model/layers.h"  // kBertLayerNormEps

namespace vqa::model {

VqaHeadImpl::VqaHeadImpl(int64_t hidden, int64_t num_answers)
    : text_pooler_(torch::nn::LinearOptions(hidden, hidden)),
      image_pooler_(torch::nn::LinearOptions(hidden, hidden)),
      dense_(torch::nn::LinearOptions(2 * hidden, 2 * hidden)),
      norm_(torch::nn::LayerNormOptions({2 * hidden}).eps(kBertLayerNormEps)),
      output_(torch::nn::LinearOptions(2 * hidden, num_answers)) {
  register_module("text_pooler", text_pooler_);
  register_module("image_pooler", image_pooler_);
  register_module("dense", dense_);
  register_module("norm", norm_);
  register_module("output", output_);
}

torch::Tensor VqaHeadImpl::forward(const torch::Tensor& text, const torch::Tensor& image) {
  const torch::Tensor text_pooled = torch::tanh(text_pooler_(text.select(/*dim=*/1, /*index=*/0)));
  const torch::Tensor image_pooled =
      torch::tanh(image_pooler_(image.select(/*dim=*/1, /*index=*/0)));
  const torch::Tensor pooled = torch::cat({text_pooled, image_pooled}, /*dim=*/1);
  return output_(torch::gelu(norm_(dense_(pooled))));
}

}  // namespace vqa::model
