#include "train/batches.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "runtime/check.h"  // fatal_user_error

namespace vqa::train {

bool next_batch_or_exit(data::ShardedLoader& loader, data::Batch& batch) {
  try {
    return loader.next(batch);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(e.what());
  }
}

namespace {

// The batch's tensors the step reads on the device (the rest stay on the host).
constexpr torch::Tensor data::Batch::*kDeviceFields[] = {
    &data::Batch::images,       &data::Batch::token_ids,   &data::Batch::attention_mask,
    &data::Batch::targets,      &data::Batch::answer_type, &data::Batch::valid,
    &data::Batch::question_type};

c10::Stream side_stream(const torch::Device& device, bool enabled) {
  if (!enabled) return c10::Stream(c10::Stream::DEFAULT, device);
  return c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
}

}  // namespace

data::Batch batch_to_device(const data::Batch& batch, const torch::Device& device) {
  data::Batch moved = batch;
  if (!device.is_cpu()) {
    for (const auto field : kDeviceFields) {
      moved.*field = (batch.*field).to(device, /*non_blocking=*/true);
    }
    if (batch.image_mean.defined()) {
      moved.image_mean = batch.image_mean.to(device, /*non_blocking=*/true);
      moved.image_std = batch.image_std.to(device, /*non_blocking=*/true);
    }
  }
  // Bytes (LoaderOptions::images_as_bytes) become the model's float32 input
  // here, on the device, after the 4x smaller copy.
  data::batch_normalise_images(moved);
  return moved;
}

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
  for (const auto field : kDeviceFields) {
    guard.recordDataPtrOnStream((moved.*field).storage().data_ptr(), compute);
  }
  return moved;
}

torch::Tensor vqa_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::binary_cross_entropy_with_logits(logits.to(torch::kFloat32), targets) *
         targets.size(1);
}

}  // namespace vqa::train
