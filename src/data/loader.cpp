#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "data/dataset_reader.h"  // DatasetReader, QuestionRows
#include "data/io_thread.h"       // Hdf5IoThread
#include "runtime/distributed.h"  // distributed_is_initialized, _barrier, _configure_mpio
#include "util/splitmix64.h"      // SplitMix64

namespace vqa::data {

// Batches crop one at a time, in the order they were submitted: ticket n
// waits until tickets 0..n-1 are done.
class CropGate {
 public:
  class Turn {
   public:
    Turn(CropGate& gate, int64_t ticket) : gate_(gate) {
      std::unique_lock<std::mutex> lock(gate_.mutex_);
      gate_.changed_.wait(lock, [&] { return gate_.serving_ == ticket; });
    }
    ~Turn() {
      {
        std::lock_guard<std::mutex> lock(gate_.mutex_);
        ++gate_.serving_;
      }
      gate_.changed_.notify_all();
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    CropGate& gate_;
  };

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t serving_ = 0;
};

namespace {

// Opens on the I/O thread: with the runtime up through MPI-IO (collective),
// else with the default driver.
std::shared_ptr<DatasetReader> open_reader(const std::string& path, const std::string& split,
                                           bool use_mpio, ReadProgress* progress) {
  Hdf5Id access(H5Pcreate(H5P_FILE_ACCESS));
  hdf5_try(access.get(), "H5Pcreate(H5P_FILE_ACCESS)", path);
  if (use_mpio) runtime::distributed_configure_mpio(access.get());
  return std::make_shared<DatasetReader>(path, split, access.get(), progress);
}

// Waits for the reader; throws when its progress count stands still for
// stall_seconds (see LoaderOptions).
std::shared_ptr<DatasetReader> wait_for_reader(std::future<std::shared_ptr<DatasetReader>> opening,
                                               const ReadProgress& progress, double stall_seconds,
                                               const std::string& path) {
  using Clock = std::chrono::steady_clock;
  auto last_change = Clock::now();
  int64_t last_count = -1;
  while (opening.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    const auto [count, what] = progress.snapshot();
    if (count != last_count) {
      last_count = count;
      last_change = Clock::now();
    } else if (stall_seconds > 0 &&
               std::chrono::duration<double>(Clock::now() - last_change).count() > stall_seconds) {
      Hdf5IoThread::instance().abandon();
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", stall_seconds);
      throw DataFormatError(path + ": " + what + ": HDF5 has not returned for " + seconds +
                            " s; the file is most likely damaged (HDF5 can loop forever on a "
                            "corrupt heap or index): write it again with vqa_prep");
    }
  }
  return opening.get();
}

std::vector<int64_t> sorted_unique(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  return values;
}

// position[i]: where values[i] sits in `sorted` (which holds it).
torch::Tensor positions_in(const std::vector<int64_t>& values, const std::vector<int64_t>& sorted) {
  std::vector<int64_t> position(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    position[i] = std::lower_bound(sorted.begin(), sorted.end(), values[i]) - sorted.begin();
  }
  return torch::tensor(position, torch::kInt64);
}

}  // namespace

torch::Tensor normalise_pixels(const torch::Tensor& pixels, const torch::Tensor& mean,
                               const torch::Tensor& std) {
  const auto on_pixels = torch::TensorOptions().dtype(torch::kFloat32).device(pixels.device());
  const auto scale = torch::full({}, 255.0f, on_pixels);
  return pixels.to(torch::kFloat32)
      .div_(scale)
      .sub_(mean.to(on_pixels).view({1, 3, 1, 1}))
      .div_(std.to(on_pixels).view({1, 3, 1, 1}));
}

void batch_normalise_images(Batch& batch) {
  if (!batch.images.defined() || batch.images.scalar_type() != torch::kUInt8) return;
  batch.images = normalise_pixels(batch.images, batch.image_mean, batch.image_std);
  batch.image_mean = batch.image_std = torch::Tensor();
}

void batch_trim_text_padding(Batch& batch) {
  if (!batch.attention_mask.defined() || batch.attention_mask.dim() != 2) return;
  const int64_t width = batch.attention_mask.size(1);
  // 1 + the index of the last real token of any row.
  const auto columns = torch::arange(1, width + 1, torch::kInt64);
  const int64_t longest = std::max<int64_t>(
      1, (batch.attention_mask.ne(0).to(torch::kInt64) * columns).max().item<int64_t>());
  if (longest >= width) return;
  batch.token_ids = batch.token_ids.narrow(1, 0, longest).contiguous();
  batch.attention_mask = batch.attention_mask.narrow(1, 0, longest).contiguous();
}

namespace {

// Every tensor of the batch in pinned memory (LoaderOptions::pin_memory).
void pin_batch(Batch& batch) {
  for (torch::Tensor* tensor :
       {&batch.images, &batch.token_ids, &batch.attention_mask, &batch.targets, &batch.answer_type,
        &batch.question_ids, &batch.question_type, &batch.valid, &batch.image_mean,
        &batch.image_std}) {
    if (tensor->defined()) *tensor = tensor->pin_memory();
  }
}

// The file's per-channel mean or std as normalise_pixels takes them.
torch::Tensor channel_values(const std::vector<double>& values) {
  return torch::tensor(values, torch::kFloat64).to(torch::kFloat32);
}

// An empty uint8 [count,3,size,size], page-locked when `pin`.
torch::Tensor empty_pixels(int64_t count, int64_t size, bool pin) {
  return torch::empty({count, 3, size, size},
                      torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(pin));
}

// A batch's questions with their images still to come: image_rows[i] is
// sample i's row of the split's images.
struct QuestionBatch {
  Batch batch;
  std::vector<int64_t> image_rows;
};

// Questions `rows` (any order, repeats allowed), in that order; each
// distinct question is read once.
QuestionBatch read_questions(DatasetReader& reader, const std::vector<int64_t>& rows,
                             const std::vector<float>& valid) {
  const DatasetInfo& info = reader.info();
  const std::vector<int64_t> unique_rows = sorted_unique(rows);
  const auto order = positions_in(rows, unique_rows);
  QuestionRows questions = reader.read_question_rows(unique_rows);
  const auto u = static_cast<int64_t>(unique_rows.size());
  const int64_t length = info.max_question_length, targets_per_row = reader.max_targets();

  QuestionBatch result;
  Batch& batch = result.batch;
  auto as_tensor = [&](std::vector<int64_t>& values, std::vector<int64_t> shape) {
    return torch::from_blob(values.data(), shape, torch::kInt64).index_select(0, order);
  };
  batch.token_ids = as_tensor(questions.token_ids, {u, length});
  batch.attention_mask = as_tensor(questions.attention_mask, {u, length});
  batch.answer_type = as_tensor(questions.answer_type, {u});
  batch.question_ids = as_tensor(questions.question_id, {u});
  batch.question_type = as_tensor(questions.question_type, {u});
  batch.valid = torch::tensor(valid, torch::kFloat32);

  // Sparse (label, score) pairs to dense soft scores; labels were range-checked.
  auto targets = torch::zeros({u, info.num_answers}, torch::kFloat32);
  auto* target_data = targets.data_ptr<float>();
  for (int64_t i = 0; i < u; ++i) {
    for (int64_t m = 0; m < targets_per_row; ++m) {
      const int32_t label = questions.labels[i * targets_per_row + m];
      if (label >= 0) {
        target_data[i * info.num_answers + label] = questions.scores[i * targets_per_row + m];
      }
    }
  }
  batch.targets = targets.index_select(0, order);
  const auto position = order.accessor<int64_t, 1>();
  for (int64_t i = 0; i < position.size(0); ++i) {
    result.image_rows.push_back(questions.image_row[static_cast<size_t>(position[i])]);
  }
  return result;
}

// The stored images of each sample, read once per distinct image: features
// float32 [B,T,D], or pixels as stored, uint8 [B,3,S,S] (gathered straight
// into pinned memory when `pin`).
torch::Tensor read_images(DatasetReader& reader, const std::vector<int64_t>& image_rows, bool pin) {
  const DatasetInfo& info = reader.info();
  const std::vector<int64_t> unique_images = sorted_unique(image_rows);
  const auto image_order = positions_in(image_rows, unique_images);
  const auto ui = static_cast<int64_t>(unique_images.size());
  if (info.has_features) {
    auto features = reader.read_features(unique_images);
    return torch::from_blob(features.data(), {ui, info.feature_tokens, info.feature_dim},
                            torch::kFloat32)
        .index_select(0, image_order);
  }
  const int64_t size = info.image_size;
  auto pixels = reader.read_pixels(unique_images);
  auto images = empty_pixels(image_order.size(0), size, pin);
  torch::index_select_out(images,
                          torch::from_blob(pixels.data(), {ui, 3, size, size}, torch::kUInt8),
                          /*dim=*/0, image_order);
  return images;
}

// A batch whose images are still to be cut from their sources (off the I/O thread).
struct SourceBatch {
  QuestionBatch questions;
  std::vector<SourceImage> sources;       // each distinct image once
  std::vector<int64_t> source_of_sample;  // index into sources per sample
};

SourceBatch read_source_batch(DatasetReader& reader, const std::vector<int64_t>& rows,
                              const std::vector<float>& valid) {
  SourceBatch result;
  result.questions = read_questions(reader, rows, valid);
  const auto& image_rows = result.questions.image_rows;
  const std::vector<int64_t> unique_images = sorted_unique(image_rows);
  result.sources = reader.read_source_images(unique_images);
  for (int64_t row : image_rows) {
    result.source_of_sample.push_back(
        std::lower_bound(unique_images.begin(), unique_images.end(), row) - unique_images.begin());
  }
  return result;
}

// What a batch's random resized crops need besides the images.
struct CropJob {
  uint64_t seed = 0;
  int64_t epoch = 0;
  RandomCropRanges ranges;
  int threads = 1;
};

// Sample i's image: the crop of its source drawn from (seed, epoch, rows[i]),
// resized to the file's size, as uint8 [B,3,S,S] like the stored images
// (page-locked when `pin`), each thread writing its samples straight into
// the batch. Samples are dealt to job.threads threads (this one included).
torch::Tensor crop_images(const SourceBatch& raw, const std::vector<int64_t>& rows,
                          const DatasetInfo& info, const CropJob& job, bool pin) {
  const auto count = static_cast<int64_t>(rows.size());
  const int64_t size = info.image_size, plane = size * size;
  auto images = empty_pixels(count, size, pin);
  uint8_t* out = images.data_ptr<uint8_t>();
  const int threads =
      static_cast<int>(std::clamp<int64_t>(job.threads, 1, std::max<int64_t>(1, count)));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto work = [&](int thread) {
    try {
      for (int64_t i = thread; i < count; i += threads) {
        const SourceImage& source = raw.sources[static_cast<size_t>(raw.source_of_sample[i])];
        util::SplitMix64 rng(augment_crop_seed(job.seed, job.epoch, rows[i]));
        const CropBox box = image_random_crop_box(source.width, source.height, job.ranges, rng);
        const auto pixels =
            image_crop_resize_bicubic(source.rgb.data(), source.width, source.height, 3, box,
                                      static_cast<int>(size), static_cast<int>(size));
        for (int64_t c = 0; c < 3; ++c) {
          uint8_t* channel = out + (i * 3 + c) * plane;
          for (int64_t p = 0; p < plane; ++p) channel[p] = pixels[3 * p + c];
        }
      }
    } catch (...) {
      errors[static_cast<size_t>(thread)] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  for (int thread = 1; thread < threads; ++thread) helpers.emplace_back(work, thread);
  work(0);
  for (auto& helper : helpers) helper.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return images;
}

// What every batch's last touches need to know.
struct Finish {
  bool trim = false, pin = false, bytes = false;
  torch::Tensor mean, std;  // the file's, float32 [3]
};

// Pixels normalised here or left as bytes with the file's mean and std,
// then trimmed and pinned, as the options ask.
Batch finish_batch(Batch batch, const Finish& finish) {
  if (batch.images.defined() && batch.images.scalar_type() == torch::kUInt8) {
    batch.image_mean = finish.mean;
    batch.image_std = finish.std;
    if (!finish.bytes) batch_normalise_images(batch);
  }
  if (finish.trim) batch_trim_text_padding(batch);
  if (finish.pin) pin_batch(batch);
  return batch;
}

}  // namespace

ShardedLoader::ShardedLoader(const std::string& path, const std::string& split,
                             const LoaderOptions& options)
    : options_(options), path_(path) {
  if (options.batch_per_rank < 1 || options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size || options.prefetch_depth < 0 ||
      options.augment_threads < 1) {
    throw std::invalid_argument(
        "ShardedLoader(" + path + "): batch_per_rank " + std::to_string(options.batch_per_rank) +
        ", rank " + std::to_string(options.rank) + " of " + std::to_string(options.world_size) +
        ", prefetch_depth " + std::to_string(options.prefetch_depth) + ", augment_threads " +
        std::to_string(options.augment_threads));
  }
  const bool use_mpio = runtime::distributed_is_initialized();
  opened_with_mpio_ = use_mpio;
  // Every rank arrives before the (collective) open, so that a rank still
  // starting up does not count as a stall of the others.
  if (use_mpio) runtime::distributed_barrier();
  // The task holds the progress too: it outlives this loader when HDF5 never returns.
  progress_ = std::make_shared<ReadProgress>();
  auto opening = Hdf5IoThread::instance().submit([path, split, use_mpio, progress = progress_] {
    return open_reader(path, split, use_mpio, progress.get());
  });
  reader_ = wait_for_reader(std::move(opening), *progress_, options.stall_seconds, path);
  info_ = reader_->info();
  if (options_.random_resized_crop && !info_.has_source_images) {
    throw DataFormatError(
        path + ": split '" + split +
        "' holds no source images, which the random resized crop (--augment resized-crop) cuts "
        "from: make the file with vqa_prep convert --keep-source-images (or synth "
        "--source-size N), format version 3");
  }
  image_mean_ = channel_values(info_.image_mean);
  image_std_ = channel_values(info_.image_std);
  const int64_t n = info_.num_questions;
  num_samples_per_rank_ = options_.drop_last ? n / options_.world_size
                                             : (n + options_.world_size - 1) / options_.world_size;
  steps_ = steps_per_epoch();
}

ShardedLoader::~ShardedLoader() {
  if (opened_with_mpio_ && !runtime::distributed_is_initialized()) {
    // MPI_Finalize has run: HDF5 closed its files then, so this close fails,
    // and a collective close that ranks reach in a different order can hang.
    std::fprintf(stderr,
                 "[vqa] internal error: the loader of %s outlived MPI_Finalize; destroy loaders "
                 "before distributed_finalize (declare runtime::DistributedSession first)\n",
                 path_.c_str());
  }
  drain();
  // Close the file on the I/O thread too (with MPI-IO, collectively).
  try {
    Hdf5IoThread::instance()
        .submit([reader = std::move(reader_)]() mutable { reader.reset(); })
        .get();
  } catch (...) {
    // A destructor cannot report a failed close; reading is over by now.
  }
}

int64_t ShardedLoader::steps_per_epoch() const {
  const int64_t batch = options_.batch_per_rank;
  return options_.drop_last ? num_samples_per_rank_ / batch
                            : (num_samples_per_rank_ + batch - 1) / batch;
}

void ShardedLoader::drain() {
  // Batches of an abandoned epoch: wait for them (the reader stays in use
  // until they finish) and drop them, errors included.
  for (auto& future : in_flight_) {
    try {
      future.get();
    } catch (...) {
    }
  }
  in_flight_.clear();
}

void ShardedLoader::start_epoch(int64_t epoch, int64_t skip_steps) {
  drain();
  shard_ = shard_indices_for_rank(info_.num_questions, options_.seed, epoch, options_.shuffle,
                                  options_.drop_last, options_.rank, options_.world_size);
  shard_.resize(static_cast<size_t>(num_samples_per_rank_));
  epoch_ = epoch;
  next_submit_ = next_return_ = std::clamp<int64_t>(skip_steps, 0, steps_);
  while (static_cast<int>(in_flight_.size()) < options_.prefetch_depth && next_submit_ < steps_) {
    submit(next_submit_++);
  }
}

void ShardedLoader::submit(int64_t step) {
  const int64_t begin = step * options_.batch_per_rank;
  const int64_t end = std::min(begin + options_.batch_per_rank, num_samples_per_rank_);
  const int64_t padding_start = shard_padding_start(info_.num_questions, options_.drop_last,
                                                    options_.rank, options_.world_size);
  std::vector<int64_t> rows(shard_.begin() + begin, shard_.begin() + end);
  std::vector<float> valid;
  valid.reserve(rows.size());
  for (int64_t i = begin; i < end; ++i) valid.push_back(i < padding_start ? 1.0f : 0.0f);
  const Finish finish{options_.trim_text_padding, options_.pin_memory, options_.images_as_bytes,
                      image_mean_, image_std_};
  // Float32 images are pinned after the normalisation; bytes are gathered into pinned memory.
  const bool pin_bytes = finish.pin && finish.bytes;
  if (!options_.random_resized_crop) {
    in_flight_.push_back(Hdf5IoThread::instance().submit(
        [reader = reader_, rows = std::move(rows), valid = std::move(valid), finish, pin_bytes] {
          QuestionBatch read = read_questions(*reader, rows, valid);
          read.batch.images = read_images(*reader, read.image_rows, pin_bytes);
          return finish_batch(std::move(read.batch), finish);
        }));
    return;
  }
  // The I/O thread reads the sources; a thread of this batch's own crops them.
  auto reading =
      Hdf5IoThread::instance().submit([reader = reader_, rows, valid = std::move(valid)] {
        return read_source_batch(*reader, rows, valid);
      });
  const CropJob job{options_.seed, epoch_, options_.crop_ranges, options_.augment_threads};
  if (!crop_gate_) crop_gate_ = std::make_shared<CropGate>();
  in_flight_.push_back(std::async(
      std::launch::async,
      [reading = std::move(reading), rows = std::move(rows), job, reader = reader_, finish,
       pin_bytes, gate = crop_gate_, ticket = crop_tickets_++]() mutable {
        std::exception_ptr failed;
        SourceBatch raw;
        try {
          raw = reading.get();
        } catch (...) {
          failed = std::current_exception();
        }
        const CropGate::Turn turn(*gate, ticket);  // every ticket takes its turn, failed or not
        if (failed) std::rethrow_exception(failed);
        // info() is plain data fixed at open: reading it off the I/O thread is safe.
        raw.questions.batch.images = crop_images(raw, rows, reader->info(), job, pin_bytes);
        return finish_batch(std::move(raw.questions.batch), finish);
      }));
}

bool ShardedLoader::next(Batch& batch) {
  if (next_return_ >= steps_) return false;
  if (in_flight_.empty()) submit(next_submit_++);
  std::future<Batch> ready = std::move(in_flight_.front());
  in_flight_.pop_front();
  // Refill first, so that the I/O thread works on the following batches
  // while the caller computes on this one.
  while (static_cast<int>(in_flight_.size()) < options_.prefetch_depth && next_submit_ < steps_) {
    submit(next_submit_++);
  }
  const auto start = std::chrono::steady_clock::now();
  ready.wait();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++next_return_;
  batch = ready.get();  // rethrows an error from the I/O thread
  return true;
}

}  // namespace vqa::data
