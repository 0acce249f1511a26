// ZeRO-1 (--shard-optimizer): VqaOptimizer's AdamW moments for the owned
// ranges of the gradient buckets' flat buffers only, the step over those
// ranges, and each rank's part of the moments for a sharded checkpoint and
// back from one (checkpoint_shards.h).
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "train/adamw_update.h"    // adamw_update_fused
#include "train/optimizer.h"       // VqaOptimizer
#include "train/optimizer_impl.h"  // VqaOptimizer::ShardState, fused_coefficients

namespace vqa::train {

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

VqaOptimizer::OwnedMoments VqaOptimizer::owned_moments(bool with_replicated) {
  OwnedMoments owned;
  if (!shard_) return owned;
  take_loaded_state();
  const ShardState& shard = *shard_;
  owned.step = shard.step;
  std::vector<int64_t> flat_begin(shard.buckets.size(), -1);
  for (size_t b = 0; b < shard.buckets.size(); ++b) {
    if (!shard.buckets[b].sharded && !with_replicated) continue;
    flat_begin[b] = owned.elements;
    owned.exp_avg.push_back(shard.exp_avg[b]);
    owned.exp_avg_sq.push_back(shard.exp_avg_sq[b]);
    owned.elements += shard.exp_avg[b].numel();
  }
  std::map<const void*, int64_t> index_in_group;
  for (const auto& group : adamw_->param_groups()) {
    for (size_t i = 0; i < group.params().size(); ++i) {
      index_in_group[group.params()[i].unsafeGetTensorImpl()] = static_cast<int64_t>(i);
    }
  }
  for (const auto& segment : shard.segments) {
    if (flat_begin[segment.bucket] < 0) continue;
    const int64_t into = segment.offset - shard.buckets[segment.bucket].begin;
    owned.runs.push_back({segment.parameter, segment.parameter_offset, segment.length,
                          flat_begin[segment.bucket] + into, static_cast<int64_t>(segment.group),
                          index_in_group[segment.parameter.unsafeGetTensorImpl()]});
  }
  return owned;
}

void VqaOptimizer::load_moments(const torch::Tensor& parameter, int64_t step,
                                int64_t parameter_offset, const torch::Tensor& exp_avg,
                                const torch::Tensor& exp_avg_sq) {
  torch::NoGradGuard no_grad;
  auto& state = adamw_state_of(*adamw_, parameter);
  state.step(step);
  const int64_t length = exp_avg.numel();
  TORCH_CHECK(parameter_offset >= 0 && parameter_offset + length <= parameter.numel(),
              "a checkpoint part's run [", parameter_offset, ", ", parameter_offset + length,
              ") lies outside its parameter of ", parameter.numel(), " elements");
  state.exp_avg().view({-1}).narrow(0, parameter_offset, length).copy_(exp_avg.reshape({-1}));
  state.exp_avg_sq().view({-1}).narrow(0, parameter_offset, length).copy_(exp_avg_sq.reshape({-1}));
}

}  // namespace vqa::train
