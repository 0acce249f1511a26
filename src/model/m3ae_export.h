// The model back under M3AE's names and layouts, the reverse of
// m3ae_import.h, for M3AE's own code: M3AETransformerSS of a VQA
// fine-tuning (loss_names {"vqa": 1}: no MLM, MIM or ITM heads) takes it
// with load_state_dict(strict=True) once data_prep/m3ae_from_safetensors.py
// has added CLIP's unused text-tower tensors, whose sizes are CLIP's and
// not the model's. The mapping is m3ae_parameter_sources'; besides it:
//  - in_weight as CLIP's attn.in_proj_weight, or split into BERT's separate
//    query, key and value weights; the q and v biases merged into in_proj_bias;
//  - zeros for the key biases the model lacks (CLIP's middle third of
//    in_proj_bias, BERT's attention.self.key.bias): softmax ignores them, so
//    M3AE computes the same function;
//  - RoBERTa's pooler (M3AE never calls it) as zeros, and
//    language_encoder.embeddings.position_ids (0, 1, ...; int64), a buffer
//    M3AE's transformers 4.6 keeps in the state_dict;
//  - the vision position table at the run's image size, as M3AE's
//    fine-tuned checkpoints hold it (no resizing back), and vqa_head.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

#include "model/m3ae.h"  // M3AE

namespace vqa::model {

// M3AE's tensors of `model`, by M3AE's name: float32 CPU copies (position_ids
// int64). Throws std::invalid_argument for a model over pre-extracted
// features, as m3ae_parameter_sources does.
std::map<std::string, torch::Tensor> m3ae_export_tensors(M3AE& model);

}  // namespace vqa::model
