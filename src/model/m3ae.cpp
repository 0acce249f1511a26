#include "model/m3ae.h"

#include <stdexcept>
#include <unordered_set>

#include "model/autocast_state.h"  // autocast_enabled, autocast_dtype
#include "model/layers.h"          // attention_key_bias, set_bf16_hidden_states

namespace vqa::model {

namespace {

// "bias", or a module's own named bias ("query_bias" of an attention).
bool is_bias(const std::string& name) {
  const std::string suffix = "bias";
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// BERT's rule: LayerNorm weight 1 and bias 0, every other bias 0, everything
// else (Linear, Embedding and Conv2d weights, class tokens, position tables)
// N(0, kInitStd). Modules are visited in registration order, so the draws are
// reproducible under torch::manual_seed.
void initialize_parameters(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  // apply() visits the module itself without needing a shared_ptr to it, so
  // this works from inside the constructor.
  model.apply(torch::nn::Module::ModuleApplyFunction([](torch::nn::Module& module) {
    const bool is_layer_norm = module.as<torch::nn::LayerNorm>() != nullptr;
    for (auto& parameter : module.named_parameters(/*recurse=*/false)) {
      if (is_bias(parameter.key())) {
        parameter.value().zero_();
      } else if (is_layer_norm) {
        parameter.value().fill_(1.0);
      } else {
        parameter.value().normal_(/*mean=*/0.0, /*std=*/kInitStd);
      }
    }
  }));
}

// The dtype the attention scores are computed in: autocast's for the
// inputs' device when it is on there, else the inputs' own (a model converted
// to half keeps its scores in half).
torch::ScalarType compute_dtype(const torch::Tensor& inputs) {
  const c10::DeviceType device = inputs.device().type();
  return autocast_enabled(device) ? autocast_dtype(device) : inputs.scalar_type();
}

ParameterGroup group_of_child(const std::string& child) {
  if (child == "vision" || child == "text") {
    return ParameterGroup::kEncoder;
  }
  if (child == "fusion") {
    return ParameterGroup::kFusion;
  }
  if (child == "head") {
    return ParameterGroup::kHead;
  }
  // A new top-level module must be given a learning-rate group here.
  throw std::logic_error("model_parameter_groups: no group for top-level module '" + child + "'");
}

}  // namespace

M3AEImpl::M3AEImpl(const ModelConfig& config)
    // Validated before any member is built from it.
    : config_((model_config_validate(config), config)),
      text_(config),
      fusion_(config),
      head_(config) {
  if (config.use_features) {
    feature_encoder_ = FeatureEncoder(config);
    register_module("vision", feature_encoder_);
  } else {
    vision_transformer_ = VisionTransformer(config);
    register_module("vision", vision_transformer_);
  }
  register_module("text", text_);
  register_module("fusion", fusion_);
  register_module("head", head_);
  initialize_parameters(*this);
  set_bf16_hidden_states(*this, config.bf16_hidden_states);
}

torch::Tensor M3AEImpl::forward(const torch::Tensor& images, const torch::Tensor& token_ids,
                                const torch::Tensor& attention_mask,
                                std::optional<bool> text_padded) {
  TORCH_CHECK(token_ids.dim() == 2 && attention_mask.sizes() == token_ids.sizes(),
              "attention_mask ", attention_mask.sizes(), " must match token_ids ",
              token_ids.sizes());
  TORCH_CHECK(images.size(0) == token_ids.size(0), "batch sizes differ: images ", images.sizes(),
              ", token_ids ", token_ids.sizes());
  if (weight_copies_) weight_copies_->select_for_forward(images.device());
  const torch::Tensor image_tokens =
      config_.use_features ? feature_encoder_(images) : vision_transformer_(images);
  // A mask on the host is read here at no cost; one on a device is not (that
  // would wait for the device), so there the caller says, or a bias is built.
  if (!text_padded && attention_mask.is_cpu()) {
    text_padded = attention_mask.eq(0).any().item<bool>();
  }
  // Built once for the step's 2 x fusion + text layers masked attentions,
  // in the dtype they compute in; none at all when nothing is padded.
  const torch::Tensor text_key_bias =
      text_padded.value_or(true) ? attention_key_bias(attention_mask, compute_dtype(images))
                                 : torch::Tensor();
  const torch::Tensor text_tokens = text_(token_ids, attention_mask, text_key_bias);
  const auto [fused_text, fused_image] = fusion_(text_tokens, text_key_bias, image_tokens);
  return head_(fused_text, fused_image);
}

void M3AEImpl::use_weight_copies(at::ScalarType dtype) {
  if (weight_copies_) throw std::logic_error("use_weight_copies: the model has copies already");
  weight_copies_ = std::make_shared<WeightCopies>(*this, dtype);
}

torch::Tensor M3AEImpl::weight_copy(const std::string& name) const {
  return weight_copies_ ? weight_copies_->copy_of(name) : torch::Tensor();
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& parameter : module.parameters(/*recurse=*/true)) {
    count += parameter.numel();
  }
  return count;
}

std::vector<NamedParameter> model_parameter_groups(M3AE& model) {
  std::unordered_set<const void*> no_decay;
  model->apply(torch::nn::Module::ModuleApplyFunction([&](torch::nn::Module& module) {
    const bool is_layer_norm = module.as<torch::nn::LayerNorm>() != nullptr;
    for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
      if (is_layer_norm || is_bias(parameter.key())) {
        no_decay.insert(parameter.value().unsafeGetTensorImpl());
      }
    }
  }));
  std::vector<NamedParameter> groups;
  for (const auto& parameter : model->named_parameters(/*recurse=*/true)) {
    const std::string& name = parameter.key();
    const ParameterGroup group = group_of_child(name.substr(0, name.find('.')));
    const bool weight_decay = no_decay.count(parameter.value().unsafeGetTensorImpl()) == 0;
    groups.push_back({name, parameter.value(), group, weight_decay});
  }
  return groups;
}

}  // namespace vqa::model
