#include "model/m3ae_export.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include "model/m3ae_import.h"  // m3ae_parameter_sources

namespace vqa::model {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Rows [begin, end) of one packed tensor filled so far.
struct Packed {
  torch::Tensor value;
  std::vector<std::pair<int64_t, int64_t>> rows;
  bool filled(int64_t begin, int64_t end) const {
    for (const auto& [b, e] : rows) {
      if (b == begin && e == end) return true;
    }
    return false;
  }
};

}  // namespace

std::map<std::string, torch::Tensor> m3ae_export_tensors(M3AE& model) {
  torch::NoGradGuard no_grad;
  const auto sources = m3ae_parameter_sources(model);  // throws for a features model
  const int64_t hidden = model->config().hidden;
  const auto parameters = model->named_parameters();
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, Packed> packed;
  for (const auto& [name, source] : sources) {
    torch::Tensor value = parameters[name].detach().to(torch::kCPU, torch::kFloat32);
    if (source.into_begin >= 0) value = value.slice(0, source.into_begin, source.into_end);
    if (source.row_begin < 0) {
      tensors[source.name] = value.clone();
      continue;
    }
    Packed& target = packed[source.name];
    if (!target.value.defined()) {
      std::vector<int64_t> shape(value.sizes().begin(), value.sizes().end());
      shape[0] = 3 * hidden;
      target.value = torch::zeros(shape, torch::kFloat32);
    }
    target.value.slice(0, source.row_begin, source.row_end).copy_(value);
    target.rows.emplace_back(source.row_begin, source.row_end);
  }
  for (auto& [name, target] : packed) {
    for (int slot = 0; slot < 3; ++slot) {
      if (target.filled(slot * hidden, (slot + 1) * hidden)) continue;
      // Only CLIP's key bias may stay zero; anything else is a hole in the mapping.
      if (slot != 1 || !ends_with(name, ".attn.in_proj_bias")) {
        throw std::logic_error("m3ae_export_tensors: rows " + std::to_string(slot * hidden) + ".." +
                               std::to_string((slot + 1) * hidden) + " of " + name +
                               " come from no parameter");
      }
    }
    tensors[name] = std::move(target.value);
  }
  // BERT's key biases, next to each key weight the model has.
  std::vector<std::string> key_biases;
  for (const auto& [name, tensor] : tensors) {
    if (ends_with(name, ".self.key.weight")) {
      const std::string bias = name.substr(0, name.size() - 6) + "bias";
      if (!tensors.count(bias)) key_biases.push_back(bias);
    }
  }
  for (const auto& bias : key_biases) tensors[bias] = torch::zeros({hidden}, torch::kFloat32);
  tensors["language_encoder.pooler.dense.weight"] = torch::zeros({hidden, hidden}, torch::kFloat32);
  tensors["language_encoder.pooler.dense.bias"] = torch::zeros({hidden}, torch::kFloat32);
  const torch::Tensor& positions =
      tensors.at("language_encoder.embeddings.position_embeddings.weight");
  tensors["language_encoder.embeddings.position_ids"] =
      torch::arange(positions.size(0), torch::kInt64).unsqueeze(0);
  return tensors;
}

}  // namespace vqa::model
