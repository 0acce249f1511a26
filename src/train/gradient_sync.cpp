#include "train/gradient_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <algorithm>

#include "model/weight_copies.h"  // copy_tensors, add_tensors
#include "runtime/check.h"        // VQA_CHECK
#include "util/clock.h"           // SteadyClock, steady_seconds, seconds_since

namespace vqa::train {

// The gradient accumulator's post hook of one parameter, or of its compute copy.
class GradientSynchronizer::ArrivalHook final : public torch::autograd::FunctionPostHook {
 public:
  ArrivalHook(GradientSynchronizer* owner, int64_t index, bool from_copy)
      : owner_(owner), index_(index), from_copy_(from_copy) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    owner_->on_gradient(index_, from_copy_);
    return outputs;
  }

 private:
  GradientSynchronizer* owner_;
  int64_t index_;
  bool from_copy_;
};

GradientSynchronizer::GradientSynchronizer(std::vector<NamedTensor> parameters,
                                           runtime::Communicator& comm,
                                           const GradientSyncOptions& options)
    : parameters_(std::move(parameters)),
      comm_(comm),
      options_(options),
      communicates_(!options.skip_allreduce && comm.world_size() > 1) {
  int64_t row_parameter = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(parameters_.size()); ++i) {
    const auto& tensor = parameters_[i].tensor;
    VQA_CHECK(tensor.requires_grad(),
              "parameter " + parameters_[i].name + " does not require grad");
    VQA_CHECK(tensor.scalar_type() == torch::kFloat32,
              "gradient buckets hold float32 parameters; " + parameters_[i].name + " is " +
                  std::string(c10::toString(tensor.scalar_type())));
    const auto& compute = parameters_[i].compute;
    VQA_CHECK(!compute.defined() ||
                  (compute.requires_grad() && compute.is_leaf() &&
                   compute.sizes() == tensor.sizes() && compute.device() == tensor.device()),
              "the compute copy of " + parameters_[i].name +
                  " must be a leaf requiring grad, of the parameter's shape and device");
    if (parameters_[i].name != options_.row_sync_parameter) continue;
    VQA_CHECK(!compute.defined(), "row sync of " + parameters_[i].name + ": it has a compute copy");
    VQA_CHECK(tensor.dim() == 2, "row sync needs a 2-D table; " + parameters_[i].name + " has " +
                                     std::to_string(tensor.dim()) + " dimensions");
    row_parameter = i;
  }
  VQA_CHECK(options_.row_sync_parameter.empty() || row_parameter >= 0,
            "row sync of " + options_.row_sync_parameter + ": no trainable parameter of that name");
  const std::vector<int64_t> bucket_elements = lay_out_buckets();
  // One buffer for every bucket, so that a pass over all the gradients (the
  // finite check, clipping) is one operator whatever the number of tensors.
  int64_t total = 0;
  for (const int64_t elements : bucket_elements) total += elements;
  if (!buckets_.empty()) {
    const auto& device = parameters_.front().tensor.device();
    all_gradients_ =
        torch::zeros({total}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  }
  view_buckets(bucket_elements);
  touched_.assign(parameters_.size(), false);
  if (options_.shard) make_flat_parameters();

  // A post hook on each parameter's gradient accumulator (as DDP's reducer
  // does), and on its compute copy's: it runs after autograd has put this
  // backward's gradient into grad(). A forward uses one or the other (the
  // copy under autocast in its dtype), so one of them fires. The
  // accumulators are kept alive here, since a tensor holds its own only weakly.
  for (int64_t i = 0; i < static_cast<int64_t>(parameters_.size()); ++i) {
    for (const bool from_copy : {false, true}) {
      const auto& source = from_copy ? parameters_[i].compute : parameters_[i].tensor;
      if (!source.defined()) continue;
      auto accumulator = torch::autograd::impl::grad_accumulator(source);
      VQA_CHECK(accumulator != nullptr,
                "parameter " + parameters_[i].name + " has no gradient accumulator");
      accumulator->add_post_hook(std::make_unique<ArrivalHook>(this, i, from_copy));
      accumulators_.push_back(std::move(accumulator));
    }
  }
}

// Each bucket's parameters move into one flat buffer with the gradients'
// layout (the padding stays zero): the parameter keeps its identity (its
// autograd accumulator, the optimiser's groups) and takes a view of the
// buffer as its data, as set_data does for PyTorch's `param.data = ...`.
void GradientSynchronizer::make_flat_parameters() {
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    bucket.values = torch::zeros_like(bucket.flat);
    for (const int64_t index : bucket.parameters) {
      torch::Tensor& parameter = parameters_[index].tensor;
      auto view =
          bucket.values.narrow(0, slots_[index].offset, parameter.numel()).view(parameter.sizes());
      view.copy_(parameter);
      parameter.set_data(view);
    }
  }
}

void GradientSynchronizer::gather_step_rows(const std::vector<torch::Tensor>& row_ids) {
  if (row_bucket_ < 0) return;
  VQA_CHECK(!step_open_, "row sync: gather_step_rows inside an optimiser step");
  local_rows_.clear();
  for (const auto& ids : row_ids) note_rows(ids);
  if (communicates_) gather_rows();
  rows_gathered_ = true;
}

void GradientSynchronizer::prepare_backward(bool sync) {
  copy_staged_gradients();  // a previous micro-step's, of parameters some bucket still waits for
  for (auto& bucket : buckets_) bucket.micro_arrivals = 0;
  if (!step_open_) {  // first micro-step of an optimiser step
    VQA_CHECK(row_bucket_ < 0 || rows_gathered_,
              "row sync: gather_step_rows must come before the step's first prepare_backward");
    step_open_ = true;
    std::fill(touched_.begin(), touched_.end(), false);
    next_to_launch_ = 0;
    for (auto& bucket : buckets_) {
      bucket.pending = static_cast<int64_t>(bucket.parameters.size());
      std::fill(bucket.arrived.begin(), bucket.arrived.end(), false);
      bucket.work.reset();
    }
    // Last step's averages leave param.grad(): autograd's next gradient is
    // then stored as it is (no addition), and on_gradient moves it to the slot.
    for (auto& parameter : parameters_) {
      parameter.tensor.mutable_grad() = torch::Tensor();
      if (parameter.compute.defined()) parameter.compute.mutable_grad() = torch::Tensor();
    }
  }
  last_micro_ = sync;
}

void GradientSynchronizer::note_rows(const torch::Tensor& row_ids) {
  VQA_CHECK(row_ids.device().is_cpu(), "row sync: the row ids must be on the host");
  const auto ids = row_ids.to(torch::kInt64).contiguous();
  const int64_t* data = ids.data_ptr<int64_t>();
  const int64_t rows = parameters_[buckets_[row_bucket_].parameters.front()].tensor.size(0);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    VQA_CHECK(data[i] >= 0 && data[i] < rows, "row sync: row id " + std::to_string(data[i]) +
                                                  " outside the table's " + std::to_string(rows) +
                                                  " rows");
    local_rows_.push_back(static_cast<int32_t>(data[i]));
  }
}

// The union of every rank's rows of this optimiser step, sorted, so that
// every rank selects the same rows in the same order. Blocks for the other
// ranks' hosts only: the ids are host bytes, so no device work is waited for.
void GradientSynchronizer::gather_rows() {
  std::sort(local_rows_.begin(), local_rows_.end());
  local_rows_.erase(std::unique(local_rows_.begin(), local_rows_.end()), local_rows_.end());
  const std::string mine(reinterpret_cast<const char*>(local_rows_.data()),
                         local_rows_.size() * sizeof(int32_t));
  std::vector<int64_t> rows;
  for (const auto& theirs : comm_.gather_host_strings(mine)) {
    const auto* ids = reinterpret_cast<const int32_t*>(theirs.data());
    rows.insert(rows.end(), ids, ids + theirs.size() / sizeof(int32_t));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const auto count = static_cast<int64_t>(rows.size());
  const auto& device = buckets_[row_bucket_].flat.device();
  auto host = torch::empty(
      {count}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(device.is_cuda()));
  std::copy(rows.begin(), rows.end(), host.data_ptr<int64_t>());
  // From pinned memory the copy does not wait for the device; the caching
  // host allocator keeps `host` until the copy has run.
  row_index_ = device.is_cuda() ? host.to(device, /*non_blocking=*/true) : host;
}

// Runs inside backward, once per parameter, right after autograd's gradient
// accumulator has stored this micro-step's gradient in param.grad() (or the
// compute copy's grad()). The first time in an optimiser step that is
// autograd's own tensor: it is staged to be copied into the slot and
// param.grad() becomes the slot (the tensor is freed, so backward holds one
// copy of each gradient, in the buckets). Later micro-steps find the slot in
// param.grad() and autograd adds into it in place; a copy's gradient is
// staged in every micro-step (its grad() cannot be the float32 slot) and
// added then. A bucket's staged gradients are copied (and added) once all
// its parameters' have arrived in this micro-step, or when it is launched.
void GradientSynchronizer::on_gradient(int64_t index, bool from_copy) {
  if (!step_open_) return;  // a backward outside prepare_backward/finish_backward
  Bucket& bucket = buckets_[slots_[index].bucket];
  torch::Tensor& parameter_grad = parameters_[index].tensor.mutable_grad();
  torch::Tensor& grad = from_copy ? parameters_[index].compute.mutable_grad() : parameter_grad;
  if (grad.defined() && !grad.is_same(slot_views_[index])) {
    auto& into = !touched_[index] ? (from_copy ? bucket.copied_into : bucket.staged_into)
                                  : bucket.added_into;
    auto& from = !touched_[index] ? (from_copy ? bucket.copied_from : bucket.staged_from)
                                  : bucket.added_from;
    into.push_back(slot_views_[index]);
    from.push_back(std::move(grad));
    grad = torch::Tensor();
  }
  parameter_grad = slot_views_[index];
  touched_[index] = true;
  if (++bucket.micro_arrivals == static_cast<int64_t>(bucket.parameters.size())) {
    copy_staged(bucket);
  }
  if (!last_micro_) return;
  const Slot& slot = slots_[index];
  if (bucket.arrived[slot.position]) return;  // autograd calls each hook once per backward
  bucket.arrived[slot.position] = true;
  if (--bucket.pending == 0) launch_ready_buckets();
}

void GradientSynchronizer::launch_ready_buckets() {
  while (next_to_launch_ < static_cast<int64_t>(buckets_.size()) &&
         buckets_[next_to_launch_].pending == 0) {
    const int64_t index = next_to_launch_++;
    Bucket& bucket = buckets_[index];
    copy_staged(bucket);
    bucket.launched = util::steady_seconds();
    if (!communicates_) continue;  // one rank: its gradients are their own average
    if (bucket.row_width > 0) {
      // Only the rows some rank touched; the rest is zero on every rank.
      torch::NoGradGuard no_grad;
      const auto rows = bucket.flat.view({-1, bucket.row_width}).index_select(0, row_index_);
      bucket.wire = options_.bf16 ? rows.to(torch::kBFloat16) : rows;
      bucket.work = comm_.allreduce_async(bucket.wire, runtime::ReduceOp::kAverage);
    } else {
      if (options_.bf16) bucket.wire.copy_(bucket.flat);
      const torch::Tensor& sent = options_.bf16 ? bucket.wire : bucket.flat;
      bucket.work = bucket.sharded ? comm_.reduce_scatter_async(sent, runtime::ReduceOp::kAverage)
                                   : comm_.allreduce_async(sent, runtime::ReduceOp::kAverage);
    }
    count_sent(index);
  }
}

void GradientSynchronizer::copy_staged(Bucket& bucket) {
  if (bucket.staged_into.empty() && bucket.copied_into.empty() && bucket.added_into.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  // One multi-tensor operator per source dtype: ATen's takes one (on a GPU a
  // list of mixed dtypes runs one kernel per tensor).
  model::copy_tensors(bucket.staged_into, bucket.staged_from);
  model::copy_tensors(bucket.copied_into, bucket.copied_from);
  model::add_tensors(bucket.added_into, bucket.added_from);
  bucket.staged_into.clear();
  bucket.staged_from.clear();  // autograd's tensors freed: one copy of each gradient remains
  bucket.copied_into.clear();
  bucket.copied_from.clear();
  bucket.added_into.clear();
  bucket.added_from.clear();
}

void GradientSynchronizer::copy_staged_gradients() {
  for (auto& bucket : buckets_) copy_staged(bucket);
}

void GradientSynchronizer::finish_backward() {
  if (!last_micro_ || !step_open_) return;
  torch::NoGradGuard no_grad;
  copy_staged_gradients();
  const double backward_end = util::steady_seconds();
  // Parameters that got no gradient in this optimiser step contribute zeros,
  // so every rank still launches every bucket and nobody waits forever.
  for (auto& bucket : buckets_) {
    if (bucket.pending == 0) continue;
    for (size_t k = 0; k < bucket.parameters.size(); ++k) {
      if (bucket.arrived[k]) continue;
      const int64_t index = bucket.parameters[k];
      if (!touched_[index]) {
        slot_views_[index].zero_();
        if (!reported_unused_) unused_names_.push_back(parameters_[index].name);
      }
      bucket.arrived[k] = true;
    }
    bucket.pending = 0;
  }
  reported_unused_ = true;
  launch_ready_buckets();
  last_ready_before_end_.resize(buckets_.size());
  for (size_t k = 0; k < buckets_.size(); ++k) {
    last_ready_before_end_[k] = std::max(0.0, backward_end - buckets_[k].launched);
    stats_.ready_before_end_sums[k] += last_ready_before_end_[k];
  }

  if (communicates_) {
    const auto start = util::SteadyClock::now();
    for (auto& bucket : buckets_) bucket.work->wait();
    stats_.exposed_wait_seconds += util::seconds_since(start);
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
      if (bucket.row_width > 0) {
        bucket.flat.view({-1, bucket.row_width})
            .index_copy_(0, row_index_, bucket.wire.to(torch::kFloat32));
        stats_.synced_rows += row_index_.numel();
      } else if (options_.bf16) {
        bucket.owned(bucket.flat).copy_(bucket.owned(bucket.wire));
      }
    }
    stats_.bytes_per_step = 0;
    for (const auto& bucket : buckets_) stats_.bytes_per_step += bucket.sent_bytes();
  }
  ++stats_.synchronised_steps;
  for (int64_t i = 0; i < static_cast<int64_t>(parameters_.size()); ++i) {
    parameters_[i].tensor.mutable_grad() = slot_views_[i];
  }
  step_open_ = false;
  rows_gathered_ = false;
}

void GradientSynchronizer::count_sent(int64_t index) {
  const int64_t bytes = buckets_[index].sent_bytes();
  stats_.sent_bytes_sums[index] += bytes;
  stats_.sent_bytes += bytes;
}

void GradientSynchronizer::count_replayed_step() {
  VQA_CHECK(!step_open_ && row_bucket_ < 0 && !last_ready_before_end_.empty(),
            "a replayed step counted before any captured one, or with row sync");
  for (size_t k = 0; k < buckets_.size(); ++k) {
    stats_.ready_before_end_sums[k] += last_ready_before_end_[k];
    if (communicates_) count_sent(static_cast<int64_t>(k));
  }
  ++stats_.synchronised_steps;
}

}  // namespace vqa::train
