// What the rest of the step reads from the synchronised gradient buffer:
// the finite check, the norm clip, ZeRO-1's shard layout and parameter
// gathers, the buckets' timings and sizes; and the start-up broadcast of a
// module's state. The buckets and their averaging: gradient_sync.cpp.
#include <algorithm>
#include <cmath>

#include "runtime/check.h"  // VQA_CHECK
#include "train/gradient_sync.h"
#include "util/clock.h"  // SteadyClock, steady_seconds, seconds_since

namespace vqa::train {

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
  const int64_t element = options_.bf16 ? 2 : 4;
  std::vector<int64_t> sizes;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& bucket = buckets_[k];
    if (bucket.row_width == 0) {
      sizes.push_back(bucket.flat.numel() * element);
    } else if (stats_.synchronised_steps > 0 && communicates_) {
      sizes.push_back(stats_.sent_bytes_sums[k] / stats_.synchronised_steps);
    } else {
      const int64_t rows = std::min(bucket.flat.numel() / bucket.row_width,
                                    std::max<int64_t>(1, options_.row_sync_expected_rows));
      sizes.push_back(rows * bucket.row_width * element);
    }
  }
  return sizes;
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
