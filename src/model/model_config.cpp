#include "model/model_config.h"

#include <sstream>
#include <stdexcept>

namespace vqa::model {

namespace {

// RoBERTa's BPE vocabulary: the text encoder of small and base reads the same
// token ids as M3AE's tokenizer.
constexpr int64_t kRobertaVocabSize = 50265;

void require_positive(int64_t value, const char* field) {
  if (value <= 0) {
    throw std::invalid_argument(std::string("model config: ") + field + " must be positive, got " +
                                std::to_string(value));
  }
}

}  // namespace

ModelConfig model_config_preset(const std::string& name) {
  ModelConfig config;
  config.preset = name;
  if (name == "tiny") {
    config.hidden = 64;
    config.heads = 2;
    config.ffn = 256;
    config.vision_layers = 1;
    config.text_layers = 1;
    config.fusion_layers = 1;
    config.image_size = 32;
    config.patch_size = 8;
    config.vocab_size = 1024;
    config.max_text_length = 32;
    config.num_answers = 10;
    // No dropout: tests compare outputs of repeated forwards bit for bit.
    config.dropout = 0.0;
  } else if (name == "small") {
    config.hidden = 256;
    config.heads = 4;
    config.ffn = 1024;
    config.vision_layers = 4;
    config.text_layers = 4;
    config.fusion_layers = 2;
    config.image_size = 96;
    config.patch_size = 16;
    config.vocab_size = kRobertaVocabSize;
    config.max_text_length = 64;
    config.num_answers = 100;
    // No dropout: LibTorch's CPU dropout draws a mask element by element and
    // measured ~20% of a one-thread step of this preset; its benchmarks time
    // the step, not regularisation. --dropout turns it back on.
    config.dropout = 0.0;
  } else if (name == "base") {
    // M3AE: CLIP ViT-B/16 without its last block at 384 px, RoBERTa-base, six
    // co-attention layers per side, weight-compatible with m3ae.ckpt (the
    // CLIP and RoBERTa details below; the sizes may be overridden for a small
    // model of the same structure). 512 positions: RoBERTa's 514-row table
    // less its two offset rows.
    config.hidden = 768;
    config.heads = 12;
    config.ffn = 3072;
    config.vision_layers = 11;
    config.text_layers = 12;
    config.fusion_layers = 6;
    config.image_size = 384;
    config.patch_size = 16;
    config.vocab_size = kRobertaVocabSize;
    config.max_text_length = 512;
    config.num_answers = 500;
    config.dropout = 0.1;
    config.vision_activation = Activation::kQuickGelu;
    config.text_layer_norm_eps = 1e-5;
    config.head_layer_norm_eps = 1e-5;
    config.roberta_positions = true;
    config.text_token_type = true;
  } else {
    throw std::invalid_argument("unknown model preset '" + name +
                                "' (valid presets: tiny, small, base)");
  }
  return config;
}

void model_config_validate(const ModelConfig& config) {
  require_positive(config.hidden, "hidden");
  require_positive(config.heads, "heads");
  require_positive(config.ffn, "ffn");
  require_positive(config.vision_layers, "vision_layers");
  require_positive(config.text_layers, "text_layers");
  require_positive(config.fusion_layers, "fusion_layers");
  require_positive(config.vocab_size, "vocab_size");
  require_positive(config.max_text_length, "max_text_length");
  require_positive(config.num_answers, "num_answers");
  if (config.hidden % config.heads != 0) {
    throw std::invalid_argument("model config: hidden (" + std::to_string(config.hidden) +
                                ") must be a multiple of heads (" + std::to_string(config.heads) +
                                ")");
  }
  if (config.use_features) {
    require_positive(config.feature_tokens, "feature_tokens");
    require_positive(config.feature_dim, "feature_dim");
  } else {
    require_positive(config.image_size, "image_size");
    require_positive(config.patch_size, "patch_size");
    if (config.image_size % config.patch_size != 0) {
      throw std::invalid_argument("model config: image_size (" + std::to_string(config.image_size) +
                                  ") must be a multiple of patch_size (" +
                                  std::to_string(config.patch_size) + ")");
    }
  }
  for (const double eps : {config.vision_layer_norm_eps, config.text_layer_norm_eps,
                           config.fusion_layer_norm_eps, config.head_layer_norm_eps}) {
    if (!(eps > 0.0)) {
      throw std::invalid_argument("model config: LayerNorm epsilons must be positive, got " +
                                  std::to_string(eps));
    }
  }
  if (config.dropout < 0.0 || config.dropout >= 1.0) {
    throw std::invalid_argument("model config: dropout must lie in [0, 1), got " +
                                std::to_string(config.dropout));
  }
}

const char* activation_name(Activation activation) {
  return activation == Activation::kQuickGelu ? "quick_gelu" : "gelu";
}

std::string model_config_describe(const ModelConfig& config) {
  std::ostringstream line;
  line << "preset=" << config.preset << " hidden=" << config.hidden << " heads=" << config.heads
       << " ffn=" << config.ffn << " vision_layers=" << config.vision_layers
       << " text_layers=" << config.text_layers << " fusion_layers=" << config.fusion_layers
       << " vocab_size=" << config.vocab_size << " max_text_length=" << config.max_text_length
       << " num_answers=" << config.num_answers << " dropout=" << config.dropout;
  if (config.use_features) {
    line << " input=features feature_tokens=" << config.feature_tokens
         << " feature_dim=" << config.feature_dim;
  } else {
    line << " input=pixels image_size=" << config.image_size << " patch_size=" << config.patch_size
         << " vision_activation=" << activation_name(config.vision_activation);
  }
  line << " layer_norm_eps(vision/text/fusion/head)=" << config.vision_layer_norm_eps << "/"
       << config.text_layer_norm_eps << "/" << config.fusion_layer_norm_eps << "/"
       << config.head_layer_norm_eps
       << " text_positions=" << (config.roberta_positions ? "roberta" : "plain")
       << " text_token_type=" << (config.text_token_type ? "true" : "false");
  if (config.bf16_hidden_states) line << " bf16_hidden_states=true";
  return line.str();
}

}  // namespace vqa::model
