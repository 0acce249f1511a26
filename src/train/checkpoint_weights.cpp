#include "train/checkpoint_weights.h"

#include <sstream>
#include <stdexcept>
#include <vector>

namespace vqa::train {

namespace {

// `key` of an attention in the old layout: in_weight from the children
// query, key and value; query_bias and value_bias from query's and value's
// bias. False when the archive has no such children.
bool read_legacy_attention(torch::serialize::InputArchive& archive, const std::string& key,
                           torch::Tensor& saved) {
  const auto child_tensor = [&](const char* child, const char* name, torch::Tensor& into) {
    torch::serialize::InputArchive part;
    return archive.try_read(child, part) && part.try_read(name, into);
  };
  if (key == "in_weight") {
    std::vector<torch::Tensor> rows(3);
    const char* children[] = {"query", "key", "value"};
    for (int i = 0; i < 3; ++i) {
      if (!child_tensor(children[i], "weight", rows[i])) return false;
    }
    saved = torch::cat(rows, 0);
    return true;
  }
  if (key == "query_bias") return child_tensor("query", "bias", saved);
  if (key == "value_bias") return child_tensor("value", "bias", saved);
  return false;
}

}  // namespace

void load_module_weights(torch::serialize::InputArchive& archive, torch::nn::Module& module,
                         const std::string& prefix, int64_t& legacy_attentions) {
  torch::NoGradGuard no_grad;
  const auto copy_into = [&](const std::string& key, torch::Tensor& tensor, bool is_buffer) {
    torch::Tensor saved;
    if (!archive.try_read(key, saved, is_buffer)) {
      if (!read_legacy_attention(archive, key, saved)) {
        archive.read(key, saved, is_buffer);  // throws LibTorch's error naming the key
      }
      if (key == "in_weight") ++legacy_attentions;
    }
    if (saved.sizes() != tensor.sizes()) {
      std::ostringstream text;
      text << "tensor " << prefix << key << " has shape " << saved.sizes() << ", the model's is "
           << tensor.sizes();
      throw std::runtime_error(text.str());
    }
    tensor.copy_(saved);
  };
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    copy_into(item.key(), item.value(), /*is_buffer=*/false);
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    copy_into(item.key(), item.value(), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    load_module_weights(child_archive, *child.value(), prefix + child.key() + ".",
                        legacy_attentions);
  }
}

}  // namespace vqa::train
