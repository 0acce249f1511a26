#include "model/weight_copies.h"

#include <torch/version.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "model/autocast_state.h"  // autocast_enabled, autocast_dtype
#include "model/layers.h"          // MultiHeadAttentionImpl

// ATen's multi-tensor copy: LibTorch 2.1 on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define VQA_FOREACH_COPY 1
#endif

namespace vqa::model {

void copy_tensors(const std::vector<torch::Tensor>& into, const std::vector<torch::Tensor>& from) {
  if (into.empty()) return;
#ifdef VQA_FOREACH_COPY
  at::_foreach_copy_(into, from);
#else
  for (size_t i = 0; i < into.size(); ++i) into[i].copy_(from[i]);
#endif
}

void add_tensors(const std::vector<torch::Tensor>& into, const std::vector<torch::Tensor>& from) {
  TORCH_CHECK(into.size() == from.size(), "add_tensors: ", into.size(), " tensors to add into, ",
              from.size(), " to add");
  // One multi-tensor add per dtype of `into` (the float32 slots: one); a
  // `from` of a narrower dtype is first copied, widened, into a buffer of
  // that dtype, by one multi-tensor copy for all of them. Widening is exact,
  // so each sum is add_'s; a wider `from` (which add_ would not round
  // first) is added as it is.
  const auto widens = [&](size_t i, at::ScalarType dtype) {
    return from[i].scalar_type() != dtype &&
           c10::promoteTypes(from[i].scalar_type(), dtype) == dtype;
  };
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < into.size(); ++i) by_dtype[into[i].scalar_type()].push_back(i);
  for (const auto& [dtype, positions] : by_dtype) {
    int64_t converted = 0;
    for (const size_t i : positions) {
      if (widens(i, dtype)) converted += from[i].numel();
    }
    const auto buffer = converted > 0 ? torch::empty({converted}, into[positions.front()].options())
                                      : torch::Tensor();
    std::vector<torch::Tensor> sum_into, sum_from, views, sources;
    int64_t offset = 0;
    for (const size_t i : positions) {
      sum_into.push_back(into[i]);
      if (!widens(i, dtype)) {
        sum_from.push_back(from[i]);
        continue;
      }
      views.push_back(buffer.narrow(0, offset, from[i].numel()).view(from[i].sizes()));
      sources.push_back(from[i]);
      sum_from.push_back(views.back());
      offset += from[i].numel();
    }
    copy_tensors(views, sources);
    at::_foreach_add_(sum_into, sum_from);
  }
}

namespace {

// The tensors a module's forward reads its parameters through, by their
// names in the module's own named_parameters().
std::vector<std::pair<std::string, torch::Tensor*>> parameter_members(torch::nn::Module& module) {
  // The model applies its Linears through ATen's linear (apply_linear),
  // which autocast casts weight and bias for; LibTorch's C++ forward would
  // add a 3-D input's bias in float32 after the product, where a bf16 copy
  // of the bias would not be autocast's arithmetic.
  if (auto* linear = module.as<torch::nn::LinearImpl>()) {
    return {{"weight", &linear->weight}, {"bias", &linear->bias}};
  }
  if (auto* conv = module.as<torch::nn::Conv2dImpl>()) {
    return {{"weight", &conv->weight}, {"bias", &conv->bias}};
  }
  if (auto* attention = module.as<MultiHeadAttentionImpl>()) {
    return attention->parameter_members();
  }
  return {};
}

}  // namespace

WeightCopies::WeightCopies(torch::nn::Module& root, at::ScalarType dtype) : dtype_(dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    throw std::invalid_argument(std::string("weight copies are bfloat16 or float16, not ") +
                                c10::toString(dtype));
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : root.named_modules()) {
    torch::nn::Module& module = *item.value();
    const auto own = module.named_parameters(/*recurse=*/false);
    for (const auto& [local, member] : parameter_members(module)) {
      const torch::Tensor* parameter = own.find(local);
      if (parameter == nullptr || !parameter->requires_grad()) continue;
      Entry entry;
      entry.name = item.key().empty() ? local : item.key() + "." + local;
      entry.member = member;
      entry.parameter = *parameter;
      entry.copy = torch::empty(parameter->sizes(), parameter->options().dtype(dtype));
      entry.copy.copy_(*parameter);
      entry.copy.requires_grad_(true);
      parameters_.push_back(entry.parameter);
      copies_.push_back(entry.copy);
      index_of_.emplace(entry.name, entries_.size());
      entries_.push_back(std::move(entry));
    }
  }
}

void WeightCopies::select_for_forward(const torch::Device& device) {
  const bool use = autocast_enabled(device.type()) && autocast_dtype(device.type()) == dtype_;
  if (use && !entries_.empty()) {
    const Entry& first = entries_.front();
    if (first.parameter.device() != first.copy.device()) {
      throw std::logic_error("weight copies made on " + first.copy.device().str() + ", but " +
                             first.name + " is now on " + first.parameter.device().str() +
                             ": make the copies after moving the model");
    }
    torch::NoGradGuard no_grad;
    copy_tensors(copies_, parameters_);
  }
  if (use != on_copies_) point_at(use);
}

void WeightCopies::point_at(bool copies) {
  for (auto& entry : entries_) *entry.member = copies ? entry.copy : entry.parameter;
  on_copies_ = copies;
}

torch::Tensor WeightCopies::copy_of(const std::string& name) const {
  const auto found = index_of_.find(name);
  return found == index_of_.end() ? torch::Tensor() : entries_[found->second].copy;
}

int64_t WeightCopies::bytes() const {
  int64_t bytes = 0;
  for (const auto& copy : copies_) bytes += static_cast<int64_t>(copy.nbytes());
  return bytes;
}

}  // namespace vqa::model
