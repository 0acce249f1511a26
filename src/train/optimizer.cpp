#include "train/optimizer.h"

#include <ATen/Parallel.h>
#include <torch/version.h>

// ATen's fused AdamW with CPU and CUDA kernels and found_inf: LibTorch 2.4 on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define VQA_ATEN_FUSED_ADAMW 1
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "model/m3ae_import.h"  // m3ae_parameter_sources: M3AE's names for the m3ae recipe

namespace vqa::train {

namespace {

// The key under which torch::optim::Optimizer keeps a parameter's state: the
// address of its TensorImpl, as a string in LibTorch 1.x and as a pointer in 2.x.
template <typename Key>
Key optimizer_state_key(const torch::Tensor& parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(parameter.unsafeGetTensorImpl());
    return key.str();
  } else {
    return static_cast<Key>(parameter.unsafeGetTensorImpl());
  }
}

bool fusable(const torch::Tensor& tensor) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.scalar_type() == torch::kFloat32 &&
         tensor.is_contiguous() && !tensor.is_sparse();
}

// The loop GCC and Clang vectorise: no aliasing, and sqrt without errno
// (this file is compiled with -fno-math-errno, see CMakeLists.txt). The
// formula is a template parameter, so that the loop has no branch.
template <bool kDecayAfterStep>
void adamw_update_range(float* __restrict parameter, const float* __restrict gradient,
                        float* __restrict exp_avg, float* __restrict exp_avg_sq, int64_t n,
                        const AdamWCoefficients c) {
  const float one_minus_beta1 = 1.0f - c.beta1;
  const float one_minus_beta2 = 1.0f - c.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gradient[i];
    const float m = exp_avg[i] * c.beta1 + one_minus_beta1 * g;
    const float v = exp_avg_sq[i] * c.beta2 + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
    if constexpr (kDecayAfterStep) {
      parameter[i] = (parameter[i] - c.step_size * (m / denom)) * c.decay;
    } else {
      parameter[i] = parameter[i] * c.decay - c.step_size * (m / denom);
    }
  }
}

// M3AE's set_schedule rules on M3AE's parameter names.
bool m3ae_is_head(const std::string& name) {
  for (const char* head :
       {"mlm_head", "mim_head", "itm_head", "vqa_head", "cls_head", "irtr_head"}) {
    if (name.find(head) != std::string::npos) return true;
  }
  return false;
}
bool m3ae_no_decay(const std::string& name) {
  for (const char* part : {"bias", "LayerNorm.bias", "LayerNorm.weight", "norm.bias", "norm.weight",
                           "norm1.bias", "norm1.weight", "norm2.bias", "norm2.weight"}) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

// Group index {encoder, fusion, head} x {decay, no decay} of every
// parameter, under the recipe.
std::vector<std::pair<torch::Tensor, int>> grouped_parameters(model::M3AE& model,
                                                              OptimizerRecipe recipe) {
  std::vector<std::pair<torch::Tensor, int>> grouped;
  if (recipe == OptimizerRecipe::kVqaHpc) {
    for (auto& parameter : model::model_parameter_groups(model)) {
      grouped.emplace_back(parameter.tensor, static_cast<int>(parameter.group) * 2 +
                                                 (parameter.weight_decay ? 0 : 1));
    }
    return grouped;
  }
  auto parameters = model->named_parameters();
  for (const auto& [name, source] : model::m3ae_parameter_sources(model)) {
    const std::string& m3ae = source.name;
    const bool head = m3ae_is_head(m3ae);
    const bool multi_modal = m3ae.find("multi_modal") != std::string::npos;
    const int part = head ? 2 : multi_modal ? 1 : 0;
    grouped.emplace_back(parameters[name], part * 2 + (m3ae_no_decay(m3ae) ? 1 : 0));
  }
  return grouped;
}

}  // namespace

// ZeRO-1's state (VqaOptimizer::shard): a run of one parameter inside one
// bucket's owned range.
struct ShardSegment {
  int64_t bucket = 0;
  int64_t offset = 0;  // elements into the bucket's flat buffers
  int64_t length = 0;
  int64_t parameter_offset = 0;  // elements into the parameter
  size_t group = 0;              // index into adamw().param_groups()
  torch::Tensor parameter;
};

struct VqaOptimizer::ShardState {
  std::vector<ShardBucket> buckets;
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;  // per bucket: its owned range
  std::vector<ShardSegment> segments;              // in bucket order
  std::function<void(int64_t)> after_bucket;
  int64_t step = 0;           // optimiser steps taken (every parameter steps every step)
  torch::Tensor device_step;  // the same count on the device (ATen's fused AdamW reads it)
  bool took_loaded_state = false;
};

void adamw_update_fused(float* parameter, const float* gradient, float* exp_avg, float* exp_avg_sq,
                        int64_t n, const AdamWCoefficients& c) {
  constexpr int64_t kGrain = 1 << 15;  // values per task: a few tens of microseconds
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    if (c.decay_after_step) {
      adamw_update_range<true>(parameter + begin, gradient + begin, exp_avg + begin,
                               exp_avg_sq + begin, end - begin, c);
    } else {
      adamw_update_range<false>(parameter + begin, gradient + begin, exp_avg + begin,
                                exp_avg_sq + begin, end - begin, c);
    }
  });
}

double linear_schedule_factor(int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return static_cast<double>(step) / std::max<int64_t>(1, warmup);
  return std::max(0.0, static_cast<double>(total - step) / std::max<int64_t>(1, total - warmup));
}

bool aten_fused_adamw_available() {
#ifdef VQA_ATEN_FUSED_ADAMW
  return true;
#else
  return false;
#endif
}

AtenAdamWCoefficients aten_fused_coefficients(bool transformers, double lr, double weight_decay,
                                              double eps, double beta2, int64_t step) {
  if (!transformers) return {lr, weight_decay, eps};
  const double decay = 1 - lr * weight_decay;
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  return {lr * decay, decay > 0 ? weight_decay / decay : 0.0, eps / std::sqrt(bias_correction2)};
}

VqaOptimizer::VqaOptimizer(model::M3AE& model, const OptimizerSettings& settings)
    : settings_(settings) {
  // transformers' schedules take int(ratio x steps); ours rounds up, so that
  // any positive ratio warms up.
  const double warmup = settings.warmup_ratio * static_cast<double>(settings.total_steps);
  warmup_steps_ = static_cast<int64_t>(
      settings.recipe == OptimizerRecipe::kM3ae ? std::floor(warmup) : std::ceil(warmup));
  // Six groups: {encoder, fusion, head} x {decay, no decay}.
  std::vector<std::vector<torch::Tensor>> tensors(6);
  for (auto& [tensor, group] : grouped_parameters(model, settings.recipe)) {
    tensors[group].push_back(tensor);
  }
  const double group_multiplier[3] = {1.0, settings.fusion_multiplier, settings.head_multiplier};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (int group = 0; group < 6; ++group) {
    if (tensors[group].empty()) continue;
    auto options = std::make_unique<torch::optim::AdamWOptions>(settings.lr);
    options->betas({0.9, 0.98})
        .eps(1e-8)
        .weight_decay(group % 2 == 0 ? settings.weight_decay : 0.0);
    groups.emplace_back(tensors[group], std::move(options));
    multipliers_.push_back(group_multiplier[group / 2]);
  }
  adamw_ = std::make_unique<torch::optim::AdamW>(
      groups, torch::optim::AdamWOptions(settings.lr).betas({0.9, 0.98}).eps(1e-8));
  const auto parameters = model->parameters();
  const bool gpu = !parameters.empty() && parameters.front().device().is_cuda();
  on_device_path_ = aten_fused_adamw_available() && (gpu || settings.aten_fused_on_cpu);
}

VqaOptimizer::~VqaOptimizer() = default;

bool VqaOptimizer::masks_on_device() const { return on_device_path_; }

void VqaOptimizer::undo_step_count() {
  if (shard_) {
    shard_->step = std::max<int64_t>(0, shard_->step - 1);
    return;
  }
  for (auto& entry : adamw_->state()) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*entry.second);
    state.step(std::max<int64_t>(0, state.step() - 1));
  }
}

int64_t VqaOptimizer::state_bytes() const {
  int64_t bytes = 0;
  if (shard_) {
    for (const auto& moments : {shard_->exp_avg, shard_->exp_avg_sq}) {
      for (const auto& tensor : moments) bytes += static_cast<int64_t>(tensor.nbytes());
    }
  }
  for (const auto& entry : adamw_->state()) {
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    if (state.exp_avg().defined()) bytes += static_cast<int64_t>(state.exp_avg().nbytes());
    if (state.exp_avg_sq().defined()) bytes += static_cast<int64_t>(state.exp_avg_sq().nbytes());
  }
  return bytes;
}

double VqaOptimizer::learning_rate(int64_t step) const {
  return settings_.lr * linear_schedule_factor(step, warmup_steps_, settings_.total_steps);
}

void VqaOptimizer::step(int64_t step, const torch::Tensor& found_inf) {
  const double lr = learning_rate(step);
  auto& groups = adamw_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    static_cast<torch::optim::AdamWOptions&>(groups[i].options()).lr(lr * multipliers_[i]);
  }
  TORCH_CHECK(!found_inf.defined() || on_device_path_,
              "a device skip flag needs the ATen fused AdamW path");
  if (shard_) {
    sharded_step(found_inf);
  } else if (on_device_path_) {
    aten_fused_step(found_inf);
  } else if (settings_.fused_cpu && fused_step_possible()) {
    fused_step();
  } else if (settings_.recipe == OptimizerRecipe::kM3ae) {
    transformers_step();
  } else {
    adamw_->step();
  }
}

bool VqaOptimizer::fused_step_possible() const {
  for (const auto& group : adamw_->param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& parameter : group.params()) {
      if (!fusable(parameter)) return false;
      if (parameter.grad().defined() && !fusable(parameter.grad())) return false;
    }
  }
  for (const auto& entry : adamw_->state()) {  // moments read from a checkpoint, say
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    if (!fusable(state.exp_avg()) || !fusable(state.exp_avg_sq())) return false;
  }
  return true;
}

namespace {
// A parameter's AdamW state in LibTorch's map, created (zero moments) on first use.
torch::optim::AdamWParamState& adamw_state_of(torch::optim::AdamW& adamw,
                                              const torch::Tensor& parameter) {
  auto& states = adamw.state();
  using Key = typename std::decay_t<decltype(states)>::key_type;
  const Key key = optimizer_state_key<Key>(parameter);
  auto found = states.find(key);
  if (found == states.end()) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(parameter, torch::MemoryFormat::Preserve));
    found = states.emplace(key, std::move(fresh)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*found->second);
}

// Calls step(options, parameter, gradient, state) for every parameter with a
// gradient, group by group, after counting the step in its state.
template <typename Step>
void for_each_parameter_step(torch::optim::AdamW& adamw, Step step) {
  torch::NoGradGuard no_grad;
  for (auto& group : adamw.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& parameter : group.params()) {
      const torch::Tensor& gradient = parameter.grad();
      if (!gradient.defined()) continue;
      auto& state = adamw_state_of(adamw, parameter);
      state.step(state.step() + 1);
      step(options, parameter, gradient, state);
    }
  }
}
// The fused pass's coefficients for a group at step `step` (1-based):
// LibTorch's AdamW, or transformers' (the m3ae recipe).
AdamWCoefficients fused_coefficients(const torch::optim::AdamWOptions& options, int64_t step,
                                     bool transformers) {
  const auto [beta1, beta2] = options.betas();
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  AdamWCoefficients coefficients{};
  coefficients.decay = static_cast<float>(1 - options.lr() * options.weight_decay());
  coefficients.beta1 = static_cast<float>(beta1);
  coefficients.beta2 = static_cast<float>(beta2);
  coefficients.eps = static_cast<float>(options.eps());
  if (transformers) {
    coefficients.step_size =
        static_cast<float>(options.lr() * std::sqrt(bias_correction2) / bias_correction1);
    coefficients.sqrt_bias_correction2 = 1.0f;
    coefficients.decay_after_step = true;
  } else {
    coefficients.step_size = static_cast<float>(options.lr() / bias_correction1);
    coefficients.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  }
  return coefficients;
}
}  // namespace

// transformers.optimization.AdamW.step (correct_bias on), in its order.
void VqaOptimizer::transformers_step() {
  for_each_parameter_step(
      *adamw_, [](const torch::optim::AdamWOptions& options, torch::Tensor& parameter,
                  const torch::Tensor& gradient, torch::optim::AdamWParamState& state) {
        const auto [beta1, beta2] = options.betas();
        state.exp_avg().mul_(beta1).add_(gradient, 1 - beta1);
        state.exp_avg_sq().mul_(beta2).addcmul_(gradient, gradient, 1 - beta2);
        const auto denom = state.exp_avg_sq().sqrt().add_(options.eps());
        const double step_size = options.lr() * std::sqrt(1 - std::pow(beta2, state.step())) /
                                 (1 - std::pow(beta1, state.step()));
        parameter.addcdiv_(state.exp_avg(), denom, -step_size);
        if (options.weight_decay() > 0) {
          parameter.add_(parameter, -options.lr() * options.weight_decay());
        }
      });
}

// LibTorch's AdamW::step (amsgrad off), or transformers' (the m3ae recipe),
// with the moments kept where LibTorch keeps them, so that either can take
// over from the other and checkpoints match.
void VqaOptimizer::fused_step() {
  const bool transformers = settings_.recipe == OptimizerRecipe::kM3ae;
  for_each_parameter_step(
      *adamw_, [transformers](const torch::optim::AdamWOptions& options, torch::Tensor& parameter,
                              const torch::Tensor& gradient, torch::optim::AdamWParamState& state) {
        const auto coefficients = fused_coefficients(options, state.step(), transformers);
        adamw_update_fused(parameter.data_ptr<float>(), gradient.data_ptr<float>(),
                           state.exp_avg().data_ptr<float>(), state.exp_avg_sq().data_ptr<float>(),
                           parameter.numel(), coefficients);
      });
}

// ATen's fused AdamW, one call per parameter group and step count: the
// moments stay in LibTorch's states (checkpoints unchanged), the step counts
// also on the device (the kernel reads them there), counted on both sides
// and taken back on the device at once when found_inf is true (as PyTorch's
// _fused_adamw does it); the host takes its count back when it learns of the
// skip (undo_step_count).
void VqaOptimizer::aten_fused_step(const torch::Tensor& found_inf) {
#ifdef VQA_ATEN_FUSED_ADAMW
  torch::NoGradGuard no_grad;
  const bool transformers = settings_.recipe == OptimizerRecipe::kM3ae;
  std::optional<at::Tensor> skip;
  if (found_inf.defined()) skip = found_inf.to(torch::kFloat32).reshape({});
  size_t index = 0;
  for (auto& group : adamw_->param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = options.betas();
    // Parameters with a gradient, by their step count (one call per count;
    // all alike unless a parameter went without a gradient on some step).
    std::map<int64_t, std::array<std::vector<at::Tensor>, 5>> calls;
    for (auto& parameter : group.params()) {
      const size_t slot = index++;
      const torch::Tensor& gradient = parameter.grad();
      if (!gradient.defined()) continue;
      auto& state = adamw_state_of(*adamw_, parameter);
      if (device_steps_.size() <= slot) {
        device_steps_.resize(slot + 1);
        device_steps_for_.resize(slot + 1, nullptr);
      }
      if (device_steps_for_[slot] != state.exp_avg().unsafeGetTensorImpl()) {
        device_steps_[slot] =
            torch::full({}, static_cast<double>(state.step()),
                        torch::TensorOptions().dtype(torch::kFloat32).device(parameter.device()));
        device_steps_for_[slot] = state.exp_avg().unsafeGetTensorImpl();
      }
      state.step(state.step() + 1);
      auto& call = calls[state.step()];
      call[0].push_back(parameter);
      call[1].push_back(gradient);
      call[2].push_back(state.exp_avg());
      call[3].push_back(state.exp_avg_sq());
      call[4].push_back(device_steps_[slot]);
    }
    for (auto& [count, tensors] : calls) {
      const auto c = aten_fused_coefficients(transformers, options.lr(), options.weight_decay(),
                                             options.eps(), beta2, count);
      at::_foreach_add_(tensors[4], 1);
      at::_fused_adamw_(tensors[0], tensors[1], tensors[2], tensors[3], /*max_exp_avg_sqs=*/{},
                        tensors[4], c.lr, beta1, beta2, c.weight_decay, c.eps, /*amsgrad=*/false,
                        /*maximize=*/false, /*grad_scale=*/std::nullopt, skip);
      if (skip) {
        at::_foreach_sub_(tensors[4], std::vector<at::Tensor>(tensors[4].size(), *skip));
      }
    }
  }
#else
  (void)found_inf;
  TORCH_CHECK(false, "ATen's fused AdamW needs LibTorch 2.4 or later");
#endif
}

// ---- ZeRO-1: the owned ranges of the flat buffers --------------------------

void VqaOptimizer::shard(std::vector<ShardBucket> layout,
                         std::function<void(int64_t)> after_bucket) {
  if (!layout.empty() && layout.front().values.is_cuda() && !on_device_path_) {
    throw std::runtime_error(
        std::string("--shard-optimizer on a GPU needs ATen's fused AdamW (LibTorch 2.4 or "
                    "later); this is LibTorch ") +
        TORCH_VERSION);
  }
  std::map<const void*, size_t> group_of;
  const auto& groups = adamw_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& parameter : groups[g].params()) {
      group_of[parameter.unsafeGetTensorImpl()] = g;
    }
  }
  auto state = std::make_unique<ShardState>();
  for (int64_t b = 0; b < static_cast<int64_t>(layout.size()); ++b) {
    const ShardBucket& bucket = layout[b];
    const auto options = bucket.values.options();
    state->exp_avg.push_back(torch::zeros({bucket.end - bucket.begin}, options));
    state->exp_avg_sq.push_back(torch::zeros({bucket.end - bucket.begin}, options));
    for (const auto& member : bucket.members) {
      const int64_t first = std::max(bucket.begin, member.offset);
      const int64_t last = std::min(bucket.end, member.offset + member.parameter.numel());
      if (first >= last) continue;
      const auto group = group_of.find(member.parameter.unsafeGetTensorImpl());
      TORCH_CHECK(group != group_of.end(),
                  "a gradient bucket's parameter is in no optimiser group");
      state->segments.push_back(
          {b, first, last - first, first - member.offset, group->second, member.parameter});
    }
  }
  state->buckets = std::move(layout);
  state->after_bucket = std::move(after_bucket);
  shard_ = std::move(state);
}

// Moments a checkpoint loaded into adamw()'s per-parameter states (whole
// tensors, from any rank count) move into the owned ranges, once.
void VqaOptimizer::take_loaded_state() {
  ShardState& shard = *shard_;
  if (shard.took_loaded_state) return;
  shard.took_loaded_state = true;
  auto& states = adamw_->state();
  if (states.empty()) return;
  using Key = typename std::decay_t<decltype(states)>::key_type;
  int64_t count = -1;
  for (const auto& segment : shard.segments) {
    const auto found = states.find(optimizer_state_key<Key>(segment.parameter));
    if (found == states.end()) continue;
    const auto& loaded = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    if (count < 0) count = loaded.step();
    TORCH_CHECK(loaded.step() == count, "the loaded optimiser state has step counts ", count,
                " and ", loaded.step(), "; the sharded optimiser keeps one count for all");
    const int64_t into = segment.offset - shard.buckets[segment.bucket].begin;
    for (const auto& [moments, source] :
         {std::pair{shard.exp_avg[segment.bucket], loaded.exp_avg()},
          std::pair{shard.exp_avg_sq[segment.bucket], loaded.exp_avg_sq()}}) {
      moments.narrow(0, into, segment.length)
          .copy_(source.reshape({-1}).narrow(0, segment.parameter_offset, segment.length));
    }
  }
  shard.step = std::max<int64_t>(0, count);
  shard.device_step = torch::Tensor();
  states.clear();
}

void VqaOptimizer::sharded_step(const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  take_loaded_state();
  ShardState& shard = *shard_;
  ++shard.step;
  const bool transformers = settings_.recipe == OptimizerRecipe::kM3ae;
  auto& groups = adamw_->param_groups();
  std::optional<at::Tensor> skip;
  if (on_device_path_) {
    if (!shard.device_step.defined()) {
      shard.device_step = torch::full({}, static_cast<double>(shard.step - 1),
                                      torch::TensorOptions()
                                          .dtype(torch::kFloat32)
                                          .device(shard.buckets.front().values.device()));
    }
    shard.device_step.add_(1);
    if (found_inf.defined()) skip = found_inf.to(torch::kFloat32).reshape({});
  }
  size_t next = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(shard.buckets.size()); ++b) {
    const ShardBucket& bucket = shard.buckets[b];
    std::map<size_t, std::array<std::vector<at::Tensor>, 5>> calls;  // per group (device path)
    for (; next < shard.segments.size() && shard.segments[next].bucket == b; ++next) {
      const ShardSegment& segment = shard.segments[next];
      const int64_t into = segment.offset - bucket.begin;
      if (on_device_path_) {
        auto& call = calls[segment.group];
        call[0].push_back(bucket.values.narrow(0, segment.offset, segment.length));
        call[1].push_back(bucket.gradients.narrow(0, segment.offset, segment.length));
        call[2].push_back(shard.exp_avg[b].narrow(0, into, segment.length));
        call[3].push_back(shard.exp_avg_sq[b].narrow(0, into, segment.length));
        call[4].push_back(shard.device_step);  // read, not counted, by the kernel
        continue;
      }
      const auto& options =
          static_cast<const torch::optim::AdamWOptions&>(groups[segment.group].options());
      adamw_update_fused(bucket.values.data_ptr<float>() + segment.offset,
                         bucket.gradients.data_ptr<float>() + segment.offset,
                         shard.exp_avg[b].data_ptr<float>() + into,
                         shard.exp_avg_sq[b].data_ptr<float>() + into, segment.length,
                         fused_coefficients(options, shard.step, transformers));
    }
#ifdef VQA_ATEN_FUSED_ADAMW
    for (auto& [group, tensors] : calls) {
      const auto& options = static_cast<const torch::optim::AdamWOptions&>(groups[group].options());
      const auto [beta1, beta2] = options.betas();
      const auto c = aten_fused_coefficients(transformers, options.lr(), options.weight_decay(),
                                             options.eps(), beta2, shard.step);
      at::_fused_adamw_(tensors[0], tensors[1], tensors[2], tensors[3], /*max_exp_avg_sqs=*/{},
                        tensors[4], c.lr, beta1, beta2, c.weight_decay, c.eps, /*amsgrad=*/false,
                        /*maximize=*/false, /*grad_scale=*/std::nullopt, skip);
    }
#endif
    if (shard.after_bucket) shard.after_bucket(b);
  }
  if (skip) shard.device_step.sub_(*skip);
}

void VqaOptimizer::gather_state(runtime::Communicator& comm) {
  if (!shard_) return;
  torch::NoGradGuard no_grad;
  take_loaded_state();
  ShardState& shard = *shard_;
  for (size_t b = 0; b < shard.buckets.size(); ++b) {
    const ShardBucket& bucket = shard.buckets[b];
    std::array<torch::Tensor, 2> whole;
    for (int m = 0; m < 2; ++m) {
      const torch::Tensor& own = m == 0 ? shard.exp_avg[b] : shard.exp_avg_sq[b];
      if (!bucket.sharded) {
        whole[m] = own;
        continue;
      }
      whole[m] = torch::zeros_like(bucket.values);
      whole[m].narrow(0, bucket.begin, bucket.end - bucket.begin).copy_(own);
      comm.allgather_async(whole[m])->wait();
    }
    for (const auto& member : bucket.members) {
      auto& state = adamw_state_of(*adamw_, member.parameter);
      state.step(shard.step);
      const int64_t n = member.parameter.numel();
      state.exp_avg().copy_(whole[0].narrow(0, member.offset, n).view_as(member.parameter));
      state.exp_avg_sq().copy_(whole[1].narrow(0, member.offset, n).view_as(member.parameter));
    }
  }
}

void VqaOptimizer::release_gathered_state() {
  if (shard_) adamw_->state().clear();
}

}  // namespace vqa::train
