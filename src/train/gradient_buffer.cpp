// The gradient buffer's layout and what the rest of the step reads from it:
// the buckets laid out over the one buffer (and laid out again at another
// size between steps: rebucket), the finite check, the norm clip, ZeRO-1's
// shard layout and parameter gathers, the buckets' timings and sizes; and
// the start-up broadcast of a module's state. The buckets' averaging:
// gradient_sync.cpp.
#include <algorithm>
#include <cmath>

#include "runtime/check.h"  // VQA_CHECK
#include "train/gradient_sync.h"
#include "util/clock.h"  // SteadyClock, steady_seconds, seconds_since

namespace vqa::train {

bool GradientSynchronizer::is_row_parameter(int64_t index) const {
  return !options_.row_sync_parameter.empty() &&
         parameters_[index].name == options_.row_sync_parameter;
}

std::vector<std::vector<int64_t>> GradientSynchronizer::group_parameters(double bucket_mb) const {
  const auto bucket_limit = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  // Reverse registration order: backward reaches the last layers first.
  std::vector<std::vector<int64_t>> groups(1);
  int64_t group_bytes = 0;
  for (int64_t i = static_cast<int64_t>(parameters_.size()) - 1; i >= 0; --i) {
    const int64_t bytes = parameters_[i].tensor.numel() * 4;
    if (is_row_parameter(i)) {
      // A bucket of its own, where backward reaches it.
      if (!groups.back().empty()) groups.emplace_back();
      groups.back().push_back(i);
      groups.emplace_back();
      group_bytes = 0;
      continue;
    }
    if (!groups.back().empty() && group_bytes + bytes > bucket_limit) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(i);
    group_bytes += bytes;
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const std::vector<int64_t>& group) { return group.empty(); }),
               groups.end());
  return groups;
}

std::vector<int64_t> GradientSynchronizer::lay_out_buckets() {
  buckets_.clear();
  row_bucket_ = -1;
  slots_.assign(parameters_.size(), Slot{});
  std::vector<int64_t> bucket_elements;
  for (auto& group : group_parameters(options_.bucket_mb)) {
    Bucket bucket;
    if (is_row_parameter(group.front())) {
      row_bucket_ = static_cast<int64_t>(buckets_.size());
      bucket.row_width = parameters_[group.front()].tensor.size(1);
    }
    int64_t elements = 0;
    for (size_t k = 0; k < group.size(); ++k) {
      const int64_t index = group[k];
      slots_[index] =
          Slot{static_cast<int64_t>(buckets_.size()), elements, static_cast<int64_t>(k)};
      elements += parameters_[index].tensor.numel();
    }
    // Sharded: padded to equal blocks, rank r's block is its own.
    const int64_t ranks = comm_.world_size();
    bucket.sharded = options_.shard && bucket.row_width == 0;
    if (bucket.sharded) elements = (elements + ranks - 1) / ranks * ranks;
    bucket.begin = bucket.sharded ? elements / ranks * comm_.rank() : 0;
    bucket.end = bucket.sharded ? bucket.begin + elements / ranks : elements;
    bucket.parameters = std::move(group);
    bucket.arrived.assign(bucket.parameters.size(), false);
    bucket_elements.push_back(elements);
    buckets_.push_back(std::move(bucket));
  }
  return bucket_elements;
}

void GradientSynchronizer::view_buckets(const std::vector<int64_t>& bucket_elements) {
  int64_t offset = 0;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& bucket = buckets_[k];
    bucket.flat = all_gradients_.narrow(0, offset, bucket_elements[k]);
    offset += bucket_elements[k];
    // The row bucket's wire is made each step, as big as that step's rows.
    if (options_.bf16 && bucket.row_width == 0) {
      bucket.wire = torch::empty_like(bucket.flat, torch::kBFloat16);
    }
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  stats_.ready_before_end_sums.assign(buckets_.size(), 0.0);
  stats_.sent_bytes_sums.assign(buckets_.size(), 0);
  stats_.layout_first_step = stats_.synchronised_steps;
  stats_.bytes_per_step = 0;
  for (const int64_t bytes : bucket_bytes()) stats_.bytes_per_step += bytes;
  slot_views_.clear();
  for (int64_t i = 0; i < static_cast<int64_t>(parameters_.size()); ++i) {
    const Slot& slot = slots_[i];
    const auto& tensor = parameters_[i].tensor;
    slot_views_.push_back(
        buckets_[slot.bucket].flat.narrow(0, slot.offset, tensor.numel()).view(tensor.sizes()));
  }
}

void GradientSynchronizer::rebucket(double bucket_mb) {
  VQA_CHECK(!options_.shard,
            "rebucket under sharded optimiser state: the parameters are views of the buckets");
  VQA_CHECK(!step_open_, "rebucket inside an optimiser step");
  if (bucket_mb == options_.bucket_mb) return;
  options_.bucket_mb = bucket_mb;
  // Unsharded, the buckets are consecutive unpadded parts of the one buffer,
  // their parameters in the same order whatever the size: every gradient
  // keeps its place (param.grad() stays a view of its slot), only the
  // buckets' boundaries move.
  view_buckets(lay_out_buckets());
  last_ready_before_end_.clear();
  ++stats_.layouts;
}

int64_t GradientSynchronizer::gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& parameter : parameters_) bytes += parameter.tensor.numel() * 4;
  return bytes;
}

bool GradientSynchronizer::gradients_finite() const {
  torch::NoGradGuard no_grad;
  if (buckets_.empty()) return true;
  // A finite sum proves every value finite (an infinity or a NaN anywhere
  // makes it non-finite). One float32 pass; only a sum that is not finite,
  // which finite values can also reach by overflow, gets the exact check.
  bool finite = torch::isfinite(owned_gradient_sums()).all().item<bool>();
  if (!finite) {
    finite = true;
    for (const auto& bucket : buckets_) {
      if (!torch::isfinite(bucket.owned(bucket.flat)).all().item<bool>()) finite = false;
    }
  }
  // Sharded: each rank checked its own blocks; every rank decides alike.
  if (options_.shard && communicates_) finite = comm_.min(finite ? 1.0 : 0.0) > 0.0;
  return finite;
}

torch::Tensor GradientSynchronizer::nonfinite_flag() const {
  torch::NoGradGuard no_grad;
  if (buckets_.empty()) return torch::zeros({}, torch::kBool);
  return any_rank(torch::logical_not(torch::isfinite(owned_gradient_sums())).any());
}

torch::Tensor GradientSynchronizer::owned_gradient_sums() const {
  // Unsharded, every bucket is owned whole: one sum over the one buffer.
  if (!options_.shard) return all_gradients_.sum();
  std::vector<torch::Tensor> sums;
  for (const auto& bucket : buckets_) sums.push_back(bucket.owned(bucket.flat).sum());
  return torch::stack(sums);
}

torch::Tensor GradientSynchronizer::any_rank(const torch::Tensor& flag) const {
  if (!options_.shard || !communicates_) return flag;
  torch::NoGradGuard no_grad;
  auto count = flag.to(torch::kFloat32).reshape({1}).contiguous();
  comm_.allreduce(count, runtime::ReduceOp::kSum);
  return count.gt(0).reshape({});
}

void GradientSynchronizer::clip_gradient_norm(double max_norm) {
  torch::NoGradGuard no_grad;
  if (buckets_.empty()) return;
  if (!options_.shard) {
    // Every gradient, in the one buffer: one norm and one multiplication
    // (accumulated in float64, as below).
    const auto norm = torch::linalg_vector_norm(all_gradients_, 2, c10::nullopt,
                                                /*keepdim=*/false, torch::kFloat64);
    all_gradients_.mul_((max_norm / (norm + 1e-6)).clamp_max(1.0).to(torch::kFloat32));
    return;
  }
  // Squares summed over the owned blocks (accumulated in float64: the sum
  // runs over blocks that cut across parameters, so its rounding should not
  // depend on where they are cut): the sharded buckets' are added up over
  // the ranks, a replicated bucket (the same on every rank) counts once.
  std::vector<torch::Tensor> sharded, replicated;
  for (const auto& bucket : buckets_) {
    auto& into = bucket.sharded ? sharded : replicated;
    into.push_back(torch::linalg_vector_norm(bucket.owned(bucket.flat), 2, c10::nullopt,
                                             /*keepdim=*/false, torch::kFloat64)
                       .square());
  }
  const auto options = buckets_.front().flat.options().dtype(torch::kFloat64);
  auto total =
      sharded.empty() ? torch::zeros({1}, options) : torch::stack(sharded).sum().reshape({1});
  if (communicates_) {
    auto sent = total.to(torch::kFloat32);  // the MPI backend sends float32 and bfloat16
    comm_.allreduce(sent, runtime::ReduceOp::kSum);
    total = sent.to(torch::kFloat64);
  }
  if (!replicated.empty()) total = total + torch::stack(replicated).sum();
  const auto scale = (max_norm / (total.sqrt() + 1e-6)).clamp_max(1.0).to(torch::kFloat32);
  for (auto& bucket : buckets_) bucket.owned(bucket.flat).mul_(scale);
}

std::vector<ShardBucket> GradientSynchronizer::shard_layout() const {
  std::vector<ShardBucket> layout;
  for (const auto& bucket : buckets_) {
    ShardBucket shard{bucket.values, bucket.flat, bucket.begin, bucket.end, bucket.sharded, {}};
    for (const int64_t index : bucket.parameters) {
      shard.members.push_back({parameters_[index].tensor, slots_[index].offset});
    }
    layout.push_back(std::move(shard));
  }
  return layout;
}

void GradientSynchronizer::gather_parameters(int64_t bucket) {
  Bucket& b = buckets_.at(bucket);
  if (!b.sharded || !communicates_) return;
  b.gather = comm_.allgather_async(b.values);
}

void GradientSynchronizer::wait_parameters() {
  for (auto& bucket : buckets_) {
    if (!bucket.gather) continue;
    bucket.gather->wait();
    bucket.gather.reset();
  }
}

std::vector<BucketTiming> GradientSynchronizer::last_step_timings() const {
  std::vector<BucketTiming> timings;
  for (int64_t k = 0; k < static_cast<int64_t>(buckets_.size()); ++k) {
    const Bucket& bucket = buckets_[k];
    if (!bucket.work) continue;
    timings.push_back({k, bucket.sent_bytes(), bucket.launched, bucket.work->began_at(),
                       bucket.work->ended_at()});
  }
  return timings;
}

std::vector<torch::Tensor> GradientSynchronizer::bucket_gradients() const {
  if (!options_.shard && all_gradients_.defined()) return {all_gradients_};
  std::vector<torch::Tensor> flats;
  for (const auto& bucket : buckets_) flats.push_back(bucket.owned(bucket.flat));
  return flats;
}

int64_t GradientSynchronizer::memory_bytes() const {
  int64_t bytes = 0;
  for (const auto& bucket : buckets_) {
    bytes += static_cast<int64_t>(bucket.flat.nbytes());
    if (bucket.wire.defined()) bytes += static_cast<int64_t>(bucket.wire.nbytes());
  }
  return bytes;
}

std::vector<int64_t> GradientSynchronizer::bucket_bytes() const {
  return bucket_bytes_at(options_.bucket_mb);
}

std::vector<int64_t> GradientSynchronizer::bucket_bytes_at(double bucket_mb) const {
  const int64_t element = options_.bf16 ? 2 : 4;
  const int64_t ranks = comm_.world_size();
  std::vector<int64_t> sizes;
  for (const auto& group : group_parameters(bucket_mb)) {
    if (is_row_parameter(group.front())) {
      sizes.push_back(row_bucket_bytes());
      continue;
    }
    int64_t elements = 0;
    for (const int64_t index : group) elements += parameters_[index].tensor.numel();
    if (options_.shard) elements = (elements + ranks - 1) / ranks * ranks;
    sizes.push_back(elements * element);
  }
  return sizes;
}

int64_t GradientSynchronizer::row_bucket_bytes() const {
  const int64_t element = options_.bf16 ? 2 : 4;
  const Bucket& bucket = buckets_.at(row_bucket_);
  // As averaged over the steps of this layout, or as expected before the first.
  const int64_t steps = stats_.synchronised_steps - stats_.layout_first_step;
  if (steps > 0 && communicates_) return stats_.sent_bytes_sums[row_bucket_] / steps;
  const int64_t rows = std::min(bucket.flat.numel() / bucket.row_width,
                                std::max<int64_t>(1, options_.row_sync_expected_rows));
  return rows * bucket.row_width * element;
}

void broadcast_module_state(torch::nn::Module& module, runtime::Communicator& comm) {
  torch::NoGradGuard no_grad;
  for (auto& parameter : module.parameters()) comm.broadcast(parameter, /*root=*/0);
  for (auto& buffer : module.buffers()) {
    if (buffer.scalar_type() == torch::kFloat32 || buffer.scalar_type() == torch::kBFloat16) {
      comm.broadcast(buffer, /*root=*/0);
    }
  }
}

}  // namespace vqa::train
