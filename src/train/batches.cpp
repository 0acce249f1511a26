#include "train/batches.h"

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

torch::Tensor vqa_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::binary_cross_entropy_with_logits(logits.to(torch::kFloat32), targets) *
         targets.size(1);
}

}  // namespace vqa::train
