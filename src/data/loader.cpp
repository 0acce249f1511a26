#include "data/loader.h"

#include <chrono>
#include <stdexcept>

#include "data/dataset_reader.h"  // DatasetReader
#include "data/io_thread.h"       // Hdf5IoThread
#include "runtime/distributed.h"  // distributed_is_initialized

namespace vqa::data {

ShardedLoader::ShardedLoader(const std::string& path, const std::string& split,
                             const LoaderOptions& options)
    : options_(options) {
  if (options.batch_per_rank < 1 || options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size || options.prefetch_depth < 0) {
    throw std::invalid_argument(
        "ShardedLoader(" + path + "): batch_per_rank " + std::to_string(options.batch_per_rank) +
        ", rank " + std::to_string(options.rank) + " of " + std::to_string(options.world_size) +
        ", prefetch_depth " + std::to_string(options.prefetch_depth));
  }
  const bool use_mpio = runtime::distributed_is_initialized();
  reader_ = Hdf5IoThread::instance()
                .submit([path, split, use_mpio] {
                  return std::make_shared<DatasetReader>(path, split, use_mpio);
                })
                .get();
  info_ = reader_->info();
  const int64_t n = info_.num_questions;
  num_samples_per_rank_ = options_.drop_last ? n / options_.world_size
                                             : (n + options_.world_size - 1) / options_.world_size;
  steps_ = steps_per_epoch();
}

ShardedLoader::~ShardedLoader() {
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
      [reader = reader_, rows = std::move(rows), valid = std::move(valid)] {
        return reader->read_batch(rows, valid);
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
