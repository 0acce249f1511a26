// The base preset's structure (M3AE's) at a tiny size, for the tests of what
// follows M3AE's parameter names: the m3ae optimiser recipe, checkpoints.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "model/m3ae.h"          // M3AE
#include "model/model_config.h"  // model_config_preset

inline vqa::model::M3AE tiny_m3ae_model(uint64_t seed = 0) {
  auto config = vqa::model::model_config_preset("base");
  config.hidden = 16;
  config.heads = 2;
  config.ffn = 64;
  config.vision_layers = 1;
  config.text_layers = 1;
  config.fusion_layers = 1;
  config.image_size = 16;
  config.patch_size = 8;
  config.vocab_size = 30;
  config.max_text_length = 8;
  config.num_answers = 5;
  torch::manual_seed(seed);
  return vqa::model::M3AE(config);
}
