// The model of the checkpoint fuzz target and its seed corpus: the `tiny`
// preset's architecture (every layer kind, one of each) at widths small
// enough that a whole checkpoint with its AdamW moments stays near 100 kB,
// so that libFuzzer mutates and reloads it thousands of times a minute.
#pragma once

#include "model/model_config.h"  // ModelConfig, model_config_preset, model_config_validate

namespace vqa::fuzz {

inline model::ModelConfig fuzz_checkpoint_model_config() {
  model::ModelConfig config = model::model_config_preset("tiny");
  config.hidden = 16;
  config.heads = 2;
  config.ffn = 32;
  config.image_size = 16;
  config.patch_size = 8;
  config.vocab_size = 32;
  config.max_text_length = 8;
  config.num_answers = 4;
  model::model_config_validate(config);
  return config;
}

}  // namespace vqa::fuzz
