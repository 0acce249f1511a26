// The VQA answer classifier over the fused sequences.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "model/model_config.h"  // ModelConfig

namespace vqa::model {

// tanh poolers on token 0 of each side, concatenated (2 x hidden), then
// Linear(2h, 2h) -> LayerNorm (head_layer_norm_eps) -> GELU -> Linear(2h, num_answers).
class VqaHeadImpl : public torch::nn::Module {
 public:
  explicit VqaHeadImpl(const ModelConfig& config);

  // text [B, Lt, hidden], image [B, Li, hidden]; returns logits [B, num_answers].
  torch::Tensor forward(const torch::Tensor& text, const torch::Tensor& image);

 private:
  torch::nn::Linear text_pooler_, image_pooler_;
  torch::nn::Linear dense_;
  torch::nn::LayerNorm norm_;
  torch::nn::Linear output_;
};
TORCH_MODULE(VqaHead);

}  // namespace vqa::model
