// What the loop does with a loader's batch before and after the model: take
// it (a read error ends the job with a message), move it to the device, and
// M3AE's loss on it. Shared by training and evaluation.
#pragma once

#include <torch/torch.h>

#include "data/loader.h"  // ShardedLoader, Batch

namespace vqa::train {

// A loader's next() inside the loop: a read error met mid-run (a damaged
// chunk, a file gone from a shared file system) ends the job as a user error
// whose message names the file and row, with exit status 2 on every rank.
bool next_batch_or_exit(data::ShardedLoader& loader, data::Batch& batch);

// Moves a batch's model inputs to `device` with non_blocking copies: from the
// loader's pinned batches on a GPU (LoaderOptions::pin_memory) they run
// asynchronously on the current stream, ahead of the forward that reads them.
data::Batch batch_to_device(const data::Batch& batch, const torch::Device& device);

// BCE with logits on the soft targets, times K (M3AE's loss): the mean over
// the batch of the sum over answer labels.
torch::Tensor vqa_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace vqa::train
