// Every size of the VQA model in one struct. Presets fill it; the job's flags
// then override single fields, and model_config_validate() checks the result
// before a model is built.
#pragma once

#include <cstdint>
#include <string>

namespace vqa::model {

struct ModelConfig {
  std::string preset;  // "tiny" | "small" | "base", or whatever the job names a custom one
  int64_t hidden = 0;  // width of both encoders and of the fusion layers
  int64_t heads = 0;   // attention heads everywhere; hidden % heads == 0
  int64_t ffn = 0;     // feed-forward inner width (4 x hidden in every preset)
  int64_t vision_layers = 0;
  int64_t text_layers = 0;
  int64_t fusion_layers = 0;    // co-attention layers per side (text and image each get this many)
  int64_t image_size = 0;       // square input images, pixels
  int64_t patch_size = 0;       // image_size % patch_size == 0
  int64_t vocab_size = 0;       // must cover every token id of the dataset's tokenizer
  int64_t max_text_length = 0;  // size of the text position table: the longest token sequence
  int64_t num_answers = 0;      // K, the classifier's output width

  // When the dataset holds pre-extracted image features instead of pixels:
  // the vision encoder becomes a linear projection of [B, T, feature_dim]
  // with T <= feature_tokens (the size of its position table).
  bool use_features = false;
  int64_t feature_tokens = 0;
  int64_t feature_dim = 0;

  // Dropout on attention probabilities and residual branches of the text
  // encoder and the fusion layers (BERT's placement; the ViT has none, as in CLIP).
  double dropout = 0.0;
};

// The named preset: "tiny" (tests; milliseconds per CPU step), "small" (CPU
// benchmarks) or "base" (M3AE's sizes). Throws std::invalid_argument naming
// the unknown preset and the valid ones.
ModelConfig model_config_preset(const std::string& name);

// Throws std::invalid_argument naming the first field that cannot build a
// model (non-positive size, hidden not divisible by heads, image_size not a
// multiple of patch_size, features enabled without their sizes, ...).
void model_config_validate(const ModelConfig& config);

// One line for logs: "preset=small hidden=256 heads=4 ...".
std::string model_config_describe(const ModelConfig& config);

}  // namespace vqa::model
