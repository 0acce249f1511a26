#include "train/evaluation.h"

#include "train/autocast.h"  // AutocastScope
#include "train/batches.h"   // next_batch_or_exit, batch_to_device
#include "train/metrics.h"   // count_answers, accuracy_from_counts
#include "util/clock.h"      // SteadyClock, seconds_since

namespace vqa::train {

EvalStats evaluate(model::M3AE& model, data::ShardedLoader& loader, runtime::Communicator& comm,
                   const torch::Device& device, int64_t epoch, bool bf16_autocast) {
  const auto start = util::SteadyClock::now();
  torch::NoGradGuard no_grad;
  model->eval();
  loader.start_epoch(epoch);
  auto counts = torch::zeros({kAnswerCounts + 1}, torch::TensorOptions().device(device));
  data::Batch host_batch;
  while (next_batch_or_exit(loader, host_batch)) {
    const data::Batch batch = batch_to_device(host_batch, device);
    torch::Tensor logits;
    {
      AutocastScope autocast(bf16_autocast && device.is_cuda());
      logits =
          model->forward(batch.images, batch.token_ids, batch.attention_mask).to(torch::kFloat32);
    }
    counts.narrow(0, 0, kAnswerCounts) +=
        count_answers(logits, batch.targets, batch.answer_type, batch.valid);
    // Per-sample loss, padding excluded.
    const auto per_sample =
        torch::binary_cross_entropy_with_logits(logits, batch.targets, {}, {}, at::Reduction::None)
            .sum(/*dim=*/1);
    counts[kAnswerCounts] += (per_sample * batch.valid).sum();
  }
  comm.allreduce(counts, runtime::ReduceOp::kSum);
  EvalStats stats;
  const auto host = counts.to(torch::kCPU);
  stats.accuracy = accuracy_from_counts(host.narrow(0, 0, kAnswerCounts));
  stats.mean_loss =
      stats.accuracy.total > 0 ? host[kAnswerCounts].item<float>() / stats.accuracy.total : 0.0;
  stats.seconds = util::seconds_since(start);
  model->train();
  return stats;
}

}  // namespace vqa::train
