// What the loop does with a loader's batch before and after the model: take
// it (a read error ends the job with a message), move it to the device, and
// M3AE's loss on it. Shared by training and evaluation.
#pragma once

#include <c10/core/Stream.h>
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
// Images that come as bytes (LoaderOptions::images_as_bytes) are copied as
// bytes and normalised on `device` (data::batch_normalise_images), on any
// device: the result is the float32 batch the loader would have given.
data::Batch batch_to_device(const data::Batch& batch, const torch::Device& device);

// Batch copies to a GPU on a side stream (--copy-stream): the host runs
// ahead of the GPU by a step or more (nothing in the step waits for the
// device), so when the host asks for the next batch's copy the GPU is still
// computing earlier work; on a stream of its own the copy runs beside that
// work instead of after it. The current stream waits for the copy through an
// event (no host wait), and the batch's device memory is tied to that
// stream, so the allocator does not hand it to a later copy before the
// compute that reads it has run. Disabled, or on the CPU: batch_to_device.
class DeviceBatchCopy {
 public:
  DeviceBatchCopy(const torch::Device& device, bool enabled);
  bool enabled() const { return enabled_; }
  data::Batch to_device(const data::Batch& host);

 private:
  torch::Device device_;
  bool enabled_;
  c10::Stream side_;
};

// BCE with logits on the soft targets, times K (M3AE's loss): the mean over
// the batch of the sum over answer labels.
torch::Tensor vqa_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace vqa::train
