#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "data/dataset_reader.h"  // DatasetReader, QuestionRows
#include "data/io_thread.h"       // Hdf5IoThread
#include "runtime/distributed.h"  // distributed_is_initialized, _barrier, _configure_mpio

namespace vqa::data {

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
        &batch.question_ids, &batch.question_type, &batch.valid}) {
    if (tensor->defined()) *tensor = tensor->pin_memory();
  }
}

// Questions `rows` (any order, repeats allowed) and their images, in that
// order; each distinct question and image is read once.
Batch read_batch(DatasetReader& reader, const std::vector<int64_t>& rows,
                 const std::vector<float>& valid) {
  const DatasetInfo& info = reader.info();
  const std::vector<int64_t> unique_rows = sorted_unique(rows);
  const auto order = positions_in(rows, unique_rows);
  QuestionRows questions = reader.read_question_rows(unique_rows);
  const auto u = static_cast<int64_t>(unique_rows.size());
  const int64_t length = info.max_question_length, targets_per_row = reader.max_targets();

  Batch batch;
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

  const std::vector<int64_t> unique_images = sorted_unique(questions.image_row);
  const auto image_order = positions_in(questions.image_row, unique_images).index_select(0, order);
  const auto ui = static_cast<int64_t>(unique_images.size());
  if (info.has_features) {
    auto features = reader.read_features(unique_images);
    batch.images = torch::from_blob(features.data(), {ui, info.feature_tokens, info.feature_dim},
                                    torch::kFloat32)
                       .index_select(0, image_order);
  } else {
    const int64_t size = info.image_size;
    auto pixels = reader.read_pixels(unique_images);
    auto mean =
        torch::tensor(info.image_mean, torch::kFloat64).to(torch::kFloat32).view({1, 3, 1, 1});
    auto std =
        torch::tensor(info.image_std, torch::kFloat64).to(torch::kFloat32).view({1, 3, 1, 1});
    batch.images = torch::from_blob(pixels.data(), {ui, 3, size, size}, torch::kUInt8)
                       .index_select(0, image_order)
                       .to(torch::kFloat32)
                       .div_(255.0f)
                       .sub_(mean)
                       .div_(std);
  }
  return batch;
}

}  // namespace

ShardedLoader::ShardedLoader(const std::string& path, const std::string& split,
                             const LoaderOptions& options)
    : options_(options), path_(path) {
  if (options.batch_per_rank < 1 || options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size || options.prefetch_depth < 0) {
    throw std::invalid_argument(
        "ShardedLoader(" + path + "): batch_per_rank " + std::to_string(options.batch_per_rank) +
        ", rank " + std::to_string(options.rank) + " of " + std::to_string(options.world_size) +
        ", prefetch_depth " + std::to_string(options.prefetch_depth));
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
  in_flight_.push_back(Hdf5IoThread::instance().submit(
      [reader = reader_, rows = std::move(rows), valid = std::move(valid),
       pin = options_.pin_memory, trim = options_.trim_text_padding] {
        Batch batch = read_batch(*reader, rows, valid);
        if (trim) batch_trim_text_padding(batch);
        if (pin) pin_batch(batch);
        return batch;
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
