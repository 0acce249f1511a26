#include "train/batches.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <utility>
#include <vector>

#include "runtime/check.h"  // fatal_user_error

namespace vqa::train {

bool next_batch_or_exit(data::ShardedLoader& loader, data::Batch& batch) {
  try {
    return loader.next(batch);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(e.what());
  }
}

data::Batch batch_to_device(const data::Batch& batch, const torch::Device& device) {
  if (device.is_cpu()) return batch;
  data::Batch moved = batch;
  moved.images = batch.images.to(device, /*non_blocking=*/true);
  moved.token_ids = batch.token_ids.to(device, /*non_blocking=*/true);
  moved.attention_mask = batch.attention_mask.to(device, /*non_blocking=*/true);
  moved.targets = batch.targets.to(device, /*non_blocking=*/true);
  moved.answer_type = batch.answer_type.to(device, /*non_blocking=*/true);
  moved.valid = batch.valid.to(device, /*non_blocking=*/true);
  moved.question_type = batch.question_type.to(device, /*non_blocking=*/true);
  return moved;
}

namespace {

// The batch's tensors that batch_to_device moves.
std::vector<torch::Tensor> device_tensors(const data::Batch& batch) {
  return {batch.images,      batch.token_ids, batch.attention_mask, batch.targets,
          batch.answer_type, batch.valid,     batch.question_type};
}

c10::Stream side_stream(const torch::Device& device, bool enabled) {
  if (!enabled) return c10::Stream(c10::Stream::DEFAULT, device);
  return c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
}

}  // namespace

DeviceBatchCopy::DeviceBatchCopy(const torch::Device& device, bool enabled)
    : device_(device),
      enabled_(enabled && device.is_cuda()),
      side_(side_stream(device, enabled_)) {}

data::Batch DeviceBatchCopy::to_device(const data::Batch& host) {
  if (!enabled_) return batch_to_device(host, device_);
  data::Batch moved;
  {
    c10::StreamGuard on_side(side_);
    moved = batch_to_device(host, device_);
  }
  c10::impl::VirtualGuardImpl guard(device_.type());
  const c10::Stream compute = guard.getStream(device_);
  c10::Event copied(device_.type());
  copied.record(side_);
  copied.block(compute);
  for (const auto& tensor : device_tensors(moved)) {
    if (tensor.defined()) guard.recordDataPtrOnStream(tensor.storage().data_ptr(), compute);
  }
  return moved;
}

torch::Tensor vqa_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::binary_cross_entropy_with_logits(logits.to(torch::kFloat32), targets) *
         targets.size(1);
}

}  // namespace vqa::train
