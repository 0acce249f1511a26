// Reading the model out of a vqa_train checkpoint, for the tests that
// compare runs parameter by parameter.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vqa::testing {

// Module::save nests one archive per submodule.
inline void collect_tensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                            std::map<std::string, torch::Tensor>& tensors) {
  for (const auto& key : archive.keys()) {
    torch::Tensor value;
    torch::serialize::InputArchive child;
    if (archive.try_read(key, value)) {
      tensors[prefix + key] = value;
    } else if (archive.try_read(key, child)) {
      collect_tensors(child, prefix + key + ".", tensors);
    }
  }
}

// Every parameter and buffer of the checkpoint's model, by dotted name.
inline std::map<std::string, torch::Tensor> load_model(const std::string& checkpoint) {
  torch::serialize::InputArchive archive;
  archive.load_from(checkpoint);
  torch::serialize::InputArchive model;
  archive.read("model", model);
  std::map<std::string, torch::Tensor> tensors;
  collect_tensors(model, "", tensors);
  EXPECT_GT(tensors.size(), 10u) << checkpoint;
  return tensors;
}

// Each parameter of `b` with its namesake in `a` (a failure for one `a` lacks).
inline std::vector<std::pair<torch::Tensor, torch::Tensor>> paired_tensors(
    const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;
  for (const auto& [name, tensor] : b) {
    const auto other = a.find(name);
    if (other == a.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    pairs.emplace_back(other->second, tensor);
  }
  return pairs;
}

// Largest relative difference ||a - b|| / ||b|| over the parameters.
inline double max_relative_difference(const std::map<std::string, torch::Tensor>& a,
                                      const std::map<std::string, torch::Tensor>& b) {
  double worst = 0.0;
  for (const auto& [other, tensor] : paired_tensors(a, b)) {
    const double norm = std::max(tensor.norm().item<double>(), 1e-12);
    worst = std::max(worst, (other - tensor).norm().item<double>() / norm);
  }
  return worst;
}

// Relative difference ||a - b|| / ||b|| of all parameters as one vector.
inline double whole_relative_difference(const std::map<std::string, torch::Tensor>& a,
                                        const std::map<std::string, torch::Tensor>& b) {
  double difference = 0.0, norm = 0.0;
  for (const auto& [other, tensor] : paired_tensors(a, b)) {
    const auto reference = tensor.to(torch::kDouble);
    difference += (other.to(torch::kDouble) - reference).pow(2).sum().item<double>();
    norm += reference.pow(2).sum().item<double>();
  }
  return std::sqrt(difference) / std::max(std::sqrt(norm), 1e-12);
}

// Names of the tensors that differ in any bit (or that only `a` has), "" when
// the two models are bitwise equal.
inline std::string differing_tensors(const std::map<std::string, torch::Tensor>& a,
                                     const std::map<std::string, torch::Tensor>& b) {
  std::string names;
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    const auto other = b.find(name);
    if (other == b.end() || !torch::equal(tensor, other->second)) names += name + " ";
  }
  return names;
}

}  // namespace vqa::testing
