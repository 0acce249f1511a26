// A model's weights read from a checkpoint's archive by name, as torch::save
// wrote them, including checkpoints of the layout before each attention
// packed its query, key and value weights into one in_weight.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace vqa::train {

// Fills `module`'s parameters and buffers, and its children's, from
// `archive`; a tensor of another shape throws naming it (prefix + key). An
// attention saved with the old layout (children query, key and value, each
// a Linear with weight and bias) fills in_weight (their weights' rows in
// that order), query_bias and value_bias; legacy_attentions counts them.
void load_module_weights(torch::serialize::InputArchive& archive, torch::nn::Module& module,
                         const std::string& prefix, int64_t& legacy_attentions);

}  // namespace vqa::train
