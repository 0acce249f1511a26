// The M3AE-style medical VQA model: a vision encoder (ViT over pixels, or a
// projection of pre-extracted features), a RoBERTa-style text encoder,
// co-attention fusion and an answer classifier. Model code sees tensors only:
// it never talks to MPI or the runtime.
//
// Every parameter takes part in every forward, so each receives a gradient in
// every backward and per-parameter autograd hooks fire exactly once. (Rows of
// the token and position tables that a batch does not use receive zero rows in
// that gradient, as with any embedding.)
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/fusion.h"          // CoAttentionFusion
#include "model/head.h"            // VqaHead
#include "model/model_config.h"    // ModelConfig, model_config_preset
#include "model/text_encoder.h"    // TextEncoder
#include "model/vision_encoder.h"  // VisionTransformer, FeatureEncoder
#include "model/weight_copies.h"   // WeightCopies

namespace vqa::model {

// Standard deviation of the normal initialisation of Linear, Embedding and
// Conv2d weights, class tokens and position tables (BERT's and M3AE's).
constexpr double kInitStd = 0.02;

// The word embedding table [vocab_size, hidden], as named_parameters() names
// it. Only the token ids' lookup reads it (no tied output layer), so its
// gradient is zero in every row that a batch's ids do not name.
constexpr const char* kWordEmbeddingParameter = "text.token_embeddings.weight";

class M3AEImpl : public torch::nn::Module {
 public:
  // Validates the config (std::invalid_argument on a bad one) and builds the
  // model. Initialisation draws from torch's default generator in a fixed
  // order: the same torch::manual_seed gives identical parameters.
  explicit M3AEImpl(const ModelConfig& config);

  // images: float [B, 3, image_size, image_size], or with use_features
  //         float [B, T, feature_dim], T <= feature_tokens;
  // token_ids: int64 [B, L], L <= max_text_length, ids < vocab_size;
  // attention_mask: integer [B, L], 1 for a real token, 0 for padding; token 0
  //         (the classifier's text token) must be real.
  // text_padded: whether any attention_mask entry is 0, when the caller knows
  //         it from the host (false: no attention mask is built at all); left
  //         out, it is read from a mask on the CPU and assumed true for one on
  //         a device (reading it there would wait for the device).
  // Returns logits float [B, num_answers]. Token ids at padded positions do not
  // affect the logits.
  torch::Tensor forward(const torch::Tensor& images, const torch::Tensor& token_ids,
                        const torch::Tensor& attention_mask,
                        std::optional<bool> text_padded = std::nullopt);

  const ModelConfig& config() const { return config_; }

  // From here on, whenever autocast is on in `dtype` (bfloat16 or float16)
  // for the inputs' device, the forward computes with copies of the weights
  // in that dtype, refreshed at its start, instead of autocast's casts of
  // each (model/weight_copies.h); otherwise with the float32 parameters.
  // The gradients then arrive at the copies: only GradientSynchronizer
  // (train/gradient_sync.h, given weight_copy() of each parameter) hands
  // them to the parameters. Call once, after the model has its device.
  void use_weight_copies(at::ScalarType dtype);
  // The copy standing in for a parameter (as named_parameters() names it),
  // or an undefined tensor (no copies, or none for that parameter).
  torch::Tensor weight_copy(const std::string& name) const;
  // The copies, or nullptr before use_weight_copies.
  const WeightCopies* weight_copies() const { return weight_copies_.get(); }

 private:
  ModelConfig config_;
  // Exactly one of the two vision encoders is built; it is registered as "vision".
  VisionTransformer vision_transformer_{nullptr};
  FeatureEncoder feature_encoder_{nullptr};
  TextEncoder text_;
  CoAttentionFusion fusion_;
  VqaHead head_;
  std::shared_ptr<WeightCopies> weight_copies_;
};
TORCH_MODULE(M3AE);

// Number of scalar parameters, counting every registered parameter once.
int64_t parameter_count(const torch::nn::Module& module);

// The optimiser's learning-rate groups (M3AE: lr x1 for the encoders, x5 for
// the fusion, x50 for the head).
enum class ParameterGroup { kEncoder, kFusion, kHead };

struct NamedParameter {
  std::string name;  // as in model->named_parameters(), e.g. "fusion.text_layers.0.key.weight"
  torch::Tensor tensor;
  ParameterGroup group;
  bool weight_decay;  // false for biases and LayerNorm weights
};

// Every parameter of the model once, in model->named_parameters() order.
// Encoder: "vision" (ViT or feature projection) and "text" (with its
// embeddings); fusion: modality projections, type embeddings and co-attention
// layers; head: poolers and classifier.
std::vector<NamedParameter> model_parameter_groups(M3AE& model);

}  // namespace vqa::model
