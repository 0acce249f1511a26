// Reading the model and the optimiser state out of a vqa_train checkpoint,
// for the tests that compare runs tensor by tensor.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

// The AdamW state of a checkpoint's "optimizer" archive, as LibTorch saves it:
// per parameter group, the parameters' keys in order (params/<i>: a string
// that names the tensor in the saving process only), and under "state"/<key>
// each parameter's moments. Named here by position, "g<group>.p<i>.exp_avg",
// so that two runs' states pair up; a parameter without state is left out.
inline void collect_optimizer_state(torch::serialize::InputArchive& optimizer,
                                    const std::string& prefix,
                                    std::map<std::string, torch::Tensor>& tensors) {
  torch::serialize::InputArchive groups, states;
  optimizer.read("param_groups", groups);
  optimizer.read("state", states);
  torch::Tensor group_count;
  groups.read("param_groups/size", group_count);
  for (int64_t g = 0; g < group_count.item<int64_t>(); ++g) {
    torch::serialize::InputArchive group;
    groups.read("param_groups/" + std::to_string(g), group);
    torch::Tensor parameter_count;
    group.read("params/size", parameter_count);
    for (int64_t i = 0; i < parameter_count.item<int64_t>(); ++i) {
      c10::IValue key;
      group.read("params/" + std::to_string(i), key);
      torch::serialize::InputArchive state;
      if (!states.try_read(key.toStringRef(), state)) continue;
      collect_tensors(state, prefix + "g" + std::to_string(g) + ".p" + std::to_string(i) + ".",
                      tensors);
    }
  }
}

// Every tensor of a checkpoint: the model's ("model.<name>"), the optimiser
// state's ("optimizer.g<group>.p<i>.exp_avg", ...) and the training
// position's ("state.global_step", ...).
inline std::map<std::string, torch::Tensor> load_checkpoint(const std::string& checkpoint) {
  torch::serialize::InputArchive archive;
  archive.load_from(checkpoint);
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& key : archive.keys()) {
    torch::Tensor value;
    torch::serialize::InputArchive child;
    if (key == "optimizer") {
      archive.read(key, child);
      collect_optimizer_state(child, "optimizer.", tensors);
    } else if (archive.try_read(key, value)) {
      tensors[key] = value;
    } else if (archive.try_read(key, child)) {
      collect_tensors(child, key + ".", tensors);
    }
  }
  EXPECT_GT(tensors.size(), 20u) << checkpoint;
  return tensors;
}

// The optimiser's first moments (AdamW's exp_avg), named as in
// load_checkpoint. After a run's first optimiser step they are (1 - beta1)
// times the step's synchronised (averaged, accumulated, clipped) gradient.
inline std::map<std::string, torch::Tensor> load_first_moments(const std::string& checkpoint) {
  std::map<std::string, torch::Tensor> moments;
  const std::string suffix = ".exp_avg";
  for (const auto& [name, tensor] : load_checkpoint(checkpoint)) {
    if (name.rfind("optimizer.", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      moments[name] = tensor;
    }
  }
  EXPECT_GT(moments.size(), 10u) << checkpoint;
  return moments;
}

// Each parameter of `b` with its namesake in `a` (a failure for one `a` lacks,
// or for one of another shape).
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
    EXPECT_EQ(other->second.sizes(), tensor.sizes()) << name;
    pairs.emplace_back(other->second, tensor);
  }
  return pairs;
}

// The two tensors in float64 with the entries where both hold the same
// non-finite value (NaN and NaN, or the same infinity) set to zero; false
// when a NaN or an infinity in either stands against anything else, or the
// shapes differ. Then no finite difference describes the pair: the callers
// below report it as an infinite one (std::max and sums would drop a NaN).
inline bool finite_parts(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& finite_a,
                         torch::Tensor& finite_b) {
  if (a.sizes() != b.sizes()) return false;
  finite_a = a.to(torch::kDouble);
  finite_b = b.to(torch::kDouble);
  const auto both_finite = torch::isfinite(finite_a).logical_and(torch::isfinite(finite_b));
  const auto same =
      torch::isnan(finite_a).logical_and(torch::isnan(finite_b)).logical_or(finite_a.eq(finite_b));
  if (!both_finite.logical_or(same).all().item<bool>()) return false;
  finite_a = torch::where(both_finite, finite_a, torch::zeros_like(finite_a));
  finite_b = torch::where(both_finite, finite_b, torch::zeros_like(finite_b));
  return true;
}

// Largest relative difference ||a - b|| / ||b|| over the parameters;
// infinite where a NaN or an infinity in either side meets a different value
// in the other (finite_parts).
inline double max_relative_difference(const std::map<std::string, torch::Tensor>& a,
                                      const std::map<std::string, torch::Tensor>& b) {
  double worst = 0.0;
  for (const auto& [other, tensor] : paired_tensors(a, b)) {
    torch::Tensor finite_other, finite_tensor;
    if (!finite_parts(other, tensor, finite_other, finite_tensor)) {
      return std::numeric_limits<double>::infinity();
    }
    const double norm = std::max(finite_tensor.norm().item<double>(), 1e-12);
    worst = std::max(worst, (finite_other - finite_tensor).norm().item<double>() / norm);
  }
  return worst;
}

// Relative difference ||a - b|| / ||b|| of all parameters as one vector;
// infinite as in max_relative_difference.
inline double whole_relative_difference(const std::map<std::string, torch::Tensor>& a,
                                        const std::map<std::string, torch::Tensor>& b) {
  double difference = 0.0, norm = 0.0;
  for (const auto& [other, tensor] : paired_tensors(a, b)) {
    torch::Tensor finite_other, reference;
    if (!finite_parts(other, tensor, finite_other, reference)) {
      return std::numeric_limits<double>::infinity();
    }
    difference += (finite_other - reference).pow(2).sum().item<double>();
    norm += reference.pow(2).sum().item<double>();
  }
  return std::sqrt(difference) / std::max(std::sqrt(norm), 1e-12);
}

// The L2 norm of all the tensors as one vector (float64 sums).
inline double global_norm(const std::map<std::string, torch::Tensor>& tensors) {
  double squares = 0.0;
  for (const auto& [name, tensor] : tensors) {
    squares += tensor.to(torch::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(squares);
}

// Names of the tensors that differ in any bit (or that only `a` has), "" when
// the two maps are bitwise equal (a NaN differs, even from a NaN).
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
