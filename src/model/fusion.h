// M3AE's co-attention fusion: each modality is projected to the fusion width
// and tagged with its modality-type embedding, then `layers` co-attention
// layers run on each side in lockstep, every layer reading both sides' outputs
// of the previous one.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "model/layers.h"        // CoAttentionLayer
#include "model/model_config.h"  // ModelConfig

namespace vqa::model {

class CoAttentionFusionImpl : public torch::nn::Module {
 public:
  // fusion_layers per side; sizes, dropout and fusion_layer_norm_eps from the config.
  explicit CoAttentionFusionImpl(const ModelConfig& config);

  // text [B, Lt, hidden] with text_key_bias (attention_key_bias of its
  // padding mask, honoured by text self-attention and by images attending to
  // text); image [B, Li, hidden], every image token real.
  // Returns {text, image}, shapes unchanged.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& text,
                                                  const torch::Tensor& text_key_bias,
                                                  const torch::Tensor& image);

 private:
  torch::nn::Linear text_projection_, image_projection_;
  // Row 0 tags text tokens, row 1 image tokens (M3AE's token type ids).
  torch::nn::Embedding modality_type_embeddings_;
  torch::nn::ModuleList text_layers_, image_layers_;
  std::vector<CoAttentionLayer> typed_text_layers_, typed_image_layers_;
};
TORCH_MODULE(CoAttentionFusion);

}  // namespace vqa::model
