// The training job's view of a dataset file: one ShardedLoader per split
// gives this rank its shard, batch by batch, prepared ahead on a background
// thread. The file layout is in data_prep/FORMAT.md.
//
// Threads: construct, call and destroy a loader from one thread (the main
// thread). Every HDF5 call of the process's loaders runs on one shared I/O
// thread (this HDF5 build is not thread-safe); nothing else in the process
// may call HDF5 while a loader exists.
//
// MPI: when the runtime is up (distributed_init), the file is opened through
// MPI-IO, and construction and destruction are collective: every rank
// constructs and destroys its loaders in the same order, and destroys them
// before distributed_finalize (a loader destroyed later says so on stderr).
// Without the runtime the file is opened with the default (POSIX) driver,
// for tools and single-process tests.
//
// Errors: a malformed or unreadable file throws DataFormatError (a
// std::runtime_error) naming the file, the dataset or attribute and the value;
// from the constructor, or from next() when it happens while preparing a batch.
// Every rank validates the same file, so every rank throws. A file on which
// HDF5 stops returning throws too (LoaderOptions::stall_seconds).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset_format.h"  // DataFormatError, kFormatVersion
#include "data/dataset_info.h"    // DatasetInfo
#include "data/image_resample.h"  // RandomCropRanges

namespace vqa::data {

// One batch; all CPU tensors, B rows.
struct Batch {
  // float32 [B,3,H,W] normalised with the file's mean/std, or features float32
  // [B,T,D]; with LoaderOptions::images_as_bytes the stored pixels, uint8
  // [B,3,H,W], that batch_normalise_images turns into the former.
  torch::Tensor images;
  torch::Tensor token_ids;       // int64 [B,L]
  torch::Tensor attention_mask;  // int64 [B,L], 1 for real tokens, 0 for padding
  torch::Tensor
      targets;  // float32 [B,K] dense soft scores (zeros when the answer is outside the label set)
  torch::Tensor answer_type;    // int64 [B], 0 = closed, 1 = open
  torch::Tensor question_ids;   // int64 [B]
  torch::Tensor question_type;  // int64 [B]: code into DatasetInfo::question_types, -1 unknown
  torch::Tensor valid;  // float32 [B]: 1 for a real sample, 0 for a wrap-around padding sample
  // float32 [3]: the file's per-channel mean and std, defined only while
  // `images` holds bytes (on the same device as `images`).
  torch::Tensor image_mean, image_std;
  int64_t size() const { return question_ids.defined() ? question_ids.size(0) : 0; }
};

struct LoaderOptions {
  int64_t batch_per_rank = 32;
  uint64_t seed = 0;
  bool shuffle = true;
  // true: drop the tail that does not fill every rank (and an incomplete last
  // batch); false: pad the shards by wrap-around (padding rows have valid = 0)
  // and keep a smaller last batch.
  bool drop_last = false;
  int prefetch_depth = 2;  // batches prepared ahead; 0 reads in next() (still on the I/O thread)
  // Hand out batches in page-locked (pinned) host memory, so that copies to
  // a GPU with non_blocking run asynchronously. Needs a CUDA LibTorch; the
  // pinned blocks come from LibTorch's caching host allocator, which reuses
  // them batch after batch once the copies from them have finished.
  bool pin_memory = false;
  // Hand out the pixels as the file stores them, uint8 [B,3,H,W] (4x fewer
  // bytes than float32 to pin and copy, and no float pass on the host), with
  // the file's mean and std beside them: the consumer normalises on its
  // device (batch_normalise_images; the job's batch_to_device does). The
  // job turns it on for CUDA devices. Features are float32 either way.
  bool images_as_bytes = false;
  // Drop the text columns past every row's last real token (the batch's
  // longest question, at least one column), so that the model computes
  // nothing on padding; its outputs do not change beyond float rounding
  // (padded keys get an attention weight of exactly 0, positions depend on
  // the real tokens only). Done on the I/O thread, before pinning.
  bool trim_text_padding = false;
  // Train-time augmentation as M3AE's clip_resizedcrop: each sample's image
  // is torchvision's RandomResizedCrop of its source image (the split must
  // hold them: vqa_prep convert --keep-source-images) with crop_ranges, then
  // Pillow's bicubic resize to the file's image_size. The box comes from
  // augment_crop_seed(seed, epoch, question row) alone, so any number of
  // ranks, any batch size and a resume give every sample the same crop.
  // The crops run off the I/O thread on augment_threads threads, one batch
  // at a time in batch order (so a rank never crops on more threads than
  // that, whatever the prefetch depth); one 512 px -> 384 px crop takes ~3
  // ms of a core.
  bool random_resized_crop = false;
  RandomCropRanges crop_ranges;
  int augment_threads = 1;
  int rank = 0;
  int world_size = 1;
  // Opening and validating the file fails (DataFormatError naming the file
  // and what was being read) when HDF5 does not return for this long: one
  // attribute, dataset or block of rows never takes seconds, but HDF5 1.10
  // can loop forever on a damaged file. 0: wait forever. After such a
  // failure the I/O thread stays stuck inside HDF5, so the process must end
  // (the job does: fatal_user_error).
  double stall_seconds = 15.0;
};

class DatasetReader;  // dataset_reader.h: the HDF5 side, used on the I/O thread only
class CropGate;       // loader.cpp: lets one batch at a time crop, in submission order
class ReadProgress;   // dataset_reader.h: what the reader is reading, for the stall check

class ShardedLoader {
 public:
  // split: a group of the file, "train" or "test". Collective (see above).
  ShardedLoader(const std::string& path, const std::string& split, const LoaderOptions& options);
  ~ShardedLoader();
  ShardedLoader(const ShardedLoader&) = delete;
  ShardedLoader& operator=(const ShardedLoader&) = delete;

  const DatasetInfo& info() const { return info_; }
  // Identical on every rank.
  int64_t steps_per_epoch() const;
  // The permutation comes from (seed, epoch) and is the same on every rank;
  // skip_steps batches are skipped (for resuming mid-epoch) without reading them.
  void start_epoch(int64_t epoch, int64_t skip_steps = 0);
  // Fills `batch` with the next batch of this rank's shard; false at the end
  // of the epoch. Rethrows an error from the I/O thread.
  bool next(Batch& batch);
  // Seconds next() spent blocked waiting for a batch, summed over the loader's life.
  double wait_seconds() const { return wait_seconds_; }

 private:
  void submit(int64_t step);
  void drain();

  LoaderOptions options_;
  std::string path_;
  bool opened_with_mpio_ = false;  // the runtime was up: destroy before distributed_finalize
  DatasetInfo info_;
  // info_'s per-channel mean and std, float32 [3], built once: every batch
  // shares them (normalised here or handed out beside bytes) and none writes them.
  torch::Tensor image_mean_, image_std_;
  std::shared_ptr<ReadProgress> progress_;  // the reader marks it for as long as it lives
  std::shared_ptr<DatasetReader> reader_;   // touched only on the I/O thread
  std::vector<int64_t> shard_;              // this rank's sample indices for the epoch
  int64_t epoch_ = 0;
  int64_t num_samples_per_rank_ = 0;
  int64_t next_submit_ = 0, next_return_ = 0, steps_ = 0;
  std::deque<std::future<Batch>> in_flight_;
  std::shared_ptr<CropGate> crop_gate_;  // random_resized_crop only
  int64_t crop_tickets_ = 0;             // batches handed to the gate so far
  double wait_seconds_ = 0.0;
};

// LoaderOptions::trim_text_padding on one batch: token_ids and
// attention_mask cut to the longest row's real tokens (at least one column).
void batch_trim_text_padding(Batch& batch);

// Pixel values to the model's input, per channel: pixel / 255 - mean, then
// / std, in float32 on the pixels' device (mean and std: float32 [3] there
// too). The job's one normalisation: the loader's float32 batches and the
// device's uint8 ones (images_as_bytes) both come through here, so they
// agree bit for bit. Every operand is a tensor on the pixels' device: CUDA
// divides by a CPU scalar through its reciprocal, which rounds differently.
torch::Tensor normalise_pixels(const torch::Tensor& pixels, const torch::Tensor& mean,
                               const torch::Tensor& std);

// A batch whose images are bytes (images_as_bytes): images normalised with
// the batch's image_mean and image_std (normalise_pixels) where they lie,
// which are then cleared. Any other batch is left as it is.
void batch_normalise_images(Batch& batch);

// The sampler of torch's DistributedSampler, as a pure function: a permutation
// of [0, dataset_size) from (seed, epoch) when shuffle (identity order
// otherwise), padded by wrap-around to a multiple of world_size (drop_last:
// truncated to one), then every world_size-th element from `rank`. Every rank
// gets the same count; the shards are disjoint up to the padding and their
// union covers every sample (drop_last: all but fewer than world_size).
// Entries >= dataset_size never occur: padding repeats earlier indices, and
// padding positions are those at or past dataset_size in the padded order
// (see shard_padding_start).
std::vector<int64_t> shard_indices_for_rank(int64_t dataset_size, uint64_t seed, int64_t epoch,
                                            bool shuffle, bool drop_last, int rank, int world_size);

// The seed of the random resized crop of question `row` in `epoch`
// (LoaderOptions::random_resized_crop): SplitMix64 outputs chained over
// (seed, epoch, row); the loader draws the box with a SplitMix64 of it.
uint64_t augment_crop_seed(uint64_t seed, int64_t epoch, int64_t row);

// The position in this rank's shard from which samples are wrap-around
// padding (shard size when there is none).
int64_t shard_padding_start(int64_t dataset_size, bool drop_last, int rank, int world_size);

}  // namespace vqa::data
