#include "train/gradient_sync.h"

#include <chrono>

#include "runtime/check.h"  // VQA_CHECK

namespace vqa::train {

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

GradientSynchronizer::GradientSynchronizer(std::vector<NamedTensor> parameters,
                                           runtime::Communicator& comm,
                                           const GradientSyncOptions& options)
    : parameters_(std::move(parameters)), comm_(comm), options_(options) {
  const int64_t bucket_limit = static_cast<int64_t>(options_.bucket_mb * 1024 * 1024);
  slots_.resize(parameters_.size());
  // Reverse registration order: backward reaches the last layers first.
  std::vector<std::vector<int64_t>> groups(1);
  int64_t group_bytes = 0;
  for (int64_t i = static_cast<int64_t>(parameters_.size()) - 1; i >= 0; --i) {
    const auto& tensor = parameters_[i].tensor;
    VQA_CHECK(tensor.requires_grad(),
              "parameter " + parameters_[i].name + " does not require grad");
    VQA_CHECK(tensor.scalar_type() == torch::kFloat32,
              "gradient buckets hold float32 parameters; " + parameters_[i].name + " is " +
                  std::string(c10::toString(tensor.scalar_type())));
    const int64_t bytes = tensor.numel() * 4;
    if (!groups.back().empty() && group_bytes + bytes > bucket_limit) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(i);
    group_bytes += bytes;
  }
  for (auto& group : groups) {
    if (group.empty()) continue;
    Bucket bucket;
    int64_t elements = 0;
    for (size_t k = 0; k < group.size(); ++k) {
      const int64_t index = group[k];
      slots_[index] =
          Slot{static_cast<int64_t>(buckets_.size()), elements, static_cast<int64_t>(k)};
      elements += parameters_[index].tensor.numel();
    }
    const auto& device = parameters_[group.front()].tensor.device();
    bucket.parameters = std::move(group);
    bucket.flat =
        torch::zeros({elements}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    if (options_.bf16) bucket.wire = torch::empty_like(bucket.flat, torch::kBFloat16);
    bucket.arrived.assign(bucket.parameters.size(), false);
    stats_.bytes_per_step += elements * (options_.bf16 ? 2 : 4);
    buckets_.push_back(std::move(bucket));
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());

  for (int64_t i = 0; i < static_cast<int64_t>(parameters_.size()); ++i) {
    parameters_[i].tensor.register_hook([this, i](torch::Tensor grad) { on_gradient(i, grad); });
  }
}

torch::Tensor GradientSynchronizer::slot_view(int64_t index) {
  const Slot& slot = slots_[index];
  const auto& tensor = parameters_[index].tensor;
  return buckets_[slot.bucket].flat.narrow(0, slot.offset, tensor.numel()).view(tensor.sizes());
}

void GradientSynchronizer::prepare_backward(bool sync) {
  syncing_ = sync && options_.enabled;
  if (!syncing_) return;
  next_to_launch_ = 0;
  for (auto& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.parameters.size());
    std::fill(bucket.arrived.begin(), bucket.arrived.end(), false);
    bucket.work.reset();
  }
}

// Runs inside backward, once per parameter, with the gradient of this
// micro-step, before autograd adds it to param.grad(). The slot receives the
// whole accumulated gradient: what earlier micro-steps left in .grad plus this one.
void GradientSynchronizer::on_gradient(int64_t index, const torch::Tensor& grad) {
  if (!syncing_) return;
  torch::NoGradGuard no_grad;
  const Slot& slot = slots_[index];
  Bucket& bucket = buckets_[slot.bucket];
  const int64_t position = slot.position;
  if (bucket.arrived[position]) return;  // autograd calls each hook once per backward
  auto view = slot_view(index);
  const auto& accumulated = parameters_[index].tensor.grad();
  if (accumulated.defined()) {
    torch::add_out(view, accumulated, grad);
  } else {
    view.copy_(grad);
  }
  bucket.arrived[position] = true;
  if (--bucket.pending == 0) launch_ready_buckets();
}

void GradientSynchronizer::launch_ready_buckets() {
  while (next_to_launch_ < static_cast<int64_t>(buckets_.size()) &&
         buckets_[next_to_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_to_launch_++];
    bucket.launched = steady_seconds();
    if (options_.bf16) {
      bucket.wire.copy_(bucket.flat);
      bucket.work = comm_.allreduce_async(bucket.wire, runtime::ReduceOp::kAverage);
    } else {
      bucket.work = comm_.allreduce_async(bucket.flat, runtime::ReduceOp::kAverage);
    }
  }
}

void GradientSynchronizer::finish_backward() {
  if (!syncing_) return;
  torch::NoGradGuard no_grad;
  // Parameters that got no gradient this step contribute zeros, so every
  // rank still launches every bucket and nobody waits forever.
  for (auto& bucket : buckets_) {
    if (bucket.pending == 0) continue;
    for (size_t k = 0; k < bucket.parameters.size(); ++k) {
      if (bucket.arrived[k]) continue;
      const int64_t index = bucket.parameters[k];
      auto view = slot_view(index);
      const auto& accumulated = parameters_[index].tensor.grad();
      if (accumulated.defined()) {
        view.copy_(accumulated);
      } else {
        view.zero_();
      }
      if (!reported_unused_) unused_names_.push_back(parameters_[index].name);
      bucket.arrived[k] = true;
    }
    bucket.pending = 0;
  }
  reported_unused_ = true;
  launch_ready_buckets();

  const auto start = std::chrono::steady_clock::now();
  for (auto& bucket : buckets_) bucket.work->wait();
  stats_.exposed_wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double busy = 0.0;
  bool timed = true;
  for (const auto& bucket : buckets_) {
    if (bucket.work->ended_at() <= 0) timed = false;
    busy += bucket.work->ended_at() - bucket.work->began_at();
  }
  if (timed) {
    stats_.allreduce_seconds += busy;
    ++stats_.timed_steps;
  }

  for (auto& bucket : buckets_) {
    if (options_.bf16) bucket.flat.copy_(bucket.wire);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(parameters_.size()); ++i) {
    auto& grad = parameters_[i].tensor.mutable_grad();
    if (grad.defined()) {
      grad.copy_(slot_view(i));
    } else {
      grad = slot_view(i).clone();
    }
  }
  ++stats_.synchronised_steps;
  syncing_ = false;
}

std::vector<BucketTiming> GradientSynchronizer::last_step_timings() const {
  std::vector<BucketTiming> timings;
  for (int64_t k = 0; k < static_cast<int64_t>(buckets_.size()); ++k) {
    const Bucket& bucket = buckets_[k];
    if (!bucket.work) continue;
    timings.push_back({k, (options_.bf16 ? bucket.wire : bucket.flat).nbytes(), bucket.launched,
                       bucket.work->began_at(), bucket.work->ended_at()});
  }
  return timings;
}

std::vector<int64_t> GradientSynchronizer::bucket_bytes() const {
  std::vector<int64_t> sizes;
  for (const auto& bucket : buckets_) sizes.push_back(bucket.flat.numel() * 4);
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
