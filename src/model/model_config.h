// Every size of the VQA model in one struct. Presets fill it; the job's flags
// then override single fields, and model_config_validate() checks the result
// before a model is built.
#pragma once

#include <cstdint>
#include <string>

namespace vqa::model {

// The activation of the vision blocks' MLP: exact GELU, or CLIP's QuickGELU
// x * sigmoid(1.702 x), which CLIP (and so M3AE's vision encoder) was trained with.
enum class Activation { kGelu, kQuickGelu };

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

  // What makes the base preset weight-compatible with M3AE (m3ae.ckpt); tiny
  // and small keep the first values (their runs and tests are unchanged).
  Activation vision_activation = Activation::kGelu;  // base: kQuickGelu (CLIP)
  double vision_layer_norm_eps = 1e-5;               // CLIP's
  double text_layer_norm_eps = 1e-12;                // base: 1e-5 (roberta-base)
  double fusion_layer_norm_eps = 1e-12;              // M3AE's BertCrossLayer (BertConfig default)
  double head_layer_norm_eps = 1e-12;                // base: 1e-5 (M3AE's nn.LayerNorm in vqa_head)
  // RoBERTa's positions: a real token's position is 1 + its rank among the
  // real tokens (1-based), padding sits at row 1 (padding_idx), and the table
  // has max_text_length + 2 rows; false: positions 0..L-1 of a
  // max_text_length-row table.
  bool roberta_positions = false;
  // A token-type embedding [1, hidden] added to every text token (RoBERTa's
  // token_type_embeddings with its single type).
  bool text_token_type = false;

  // Under bf16 autocast, the hidden states between blocks stay bf16: the
  // encoders' and fusion layers' LayerNorms (float32 statistics) return bf16
  // instead of autocast's float32 (HiddenNorm, layers.h). No effect in
  // float32, fp16 or without autocast. Off by default: measured with LibTorch
  // 2.6 (bf16 CPU autocast), the base step dispatches 8 operators more (the
  // LayerNorms' parameter casts outweigh the activations' casts saved) and
  // 200 steps' losses stray further from float32's than the standard policy's.
  bool bf16_hidden_states = false;
};

const char* activation_name(Activation activation);  // "gelu" | "quick_gelu"

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
