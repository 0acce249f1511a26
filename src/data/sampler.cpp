// shard_indices_for_rank: the DistributedSampler semantics (loader.h); and
// augment_crop_seed, which gives each sample its crop.
#include <numeric>
#include <stdexcept>
#include <string>

#include "data/loader.h"
#include "util/splitmix64.h"  // SplitMix64: every rank draws the same permutation

namespace vqa::data {

namespace {

void check_arguments(int64_t dataset_size, int rank, int world_size) {
  if (dataset_size < 0 || world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("shard_indices_for_rank: dataset_size " +
                                std::to_string(dataset_size) + ", rank " + std::to_string(rank) +
                                ", world_size " + std::to_string(world_size));
  }
}

int64_t samples_per_rank(int64_t dataset_size, bool drop_last, int world_size) {
  return drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
}

}  // namespace

std::vector<int64_t> shard_indices_for_rank(int64_t dataset_size, uint64_t seed, int64_t epoch,
                                            bool shuffle, bool drop_last, int rank,
                                            int world_size) {
  check_arguments(dataset_size, rank, world_size);
  std::vector<int64_t> order(static_cast<size_t>(dataset_size));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle) {
    // Mix the epoch into the seed so that (seed, epoch) and (seed + 1, epoch - 1) differ.
    util::SplitMix64 generator(seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1)));
    for (int64_t i = dataset_size - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(generator.below(static_cast<uint64_t>(i + 1)));
      std::swap(order[i], order[j]);
    }
  }
  const int64_t per_rank = samples_per_rank(dataset_size, drop_last, world_size);
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank; ++i) {
    // Wrap-around padding, as DistributedSampler: position p >= n repeats p mod n.
    const int64_t position = rank + i * world_size;
    shard.push_back(order[position % dataset_size]);
  }
  return shard;
}

int64_t shard_padding_start(int64_t dataset_size, bool drop_last, int rank, int world_size) {
  check_arguments(dataset_size, rank, world_size);
  const int64_t per_rank = samples_per_rank(dataset_size, drop_last, world_size);
  if (dataset_size <= rank) return 0;
  const int64_t first_padding = (dataset_size - rank + world_size - 1) / world_size;
  return std::min(per_rank, first_padding);
}

uint64_t augment_crop_seed(uint64_t seed, int64_t epoch, int64_t row) {
  const uint64_t run = util::SplitMix64(seed ^ 0x8A5CD789635D2DFFull).next();
  const uint64_t of_epoch = util::SplitMix64(run ^ static_cast<uint64_t>(epoch)).next();
  return util::SplitMix64(of_epoch ^ static_cast<uint64_t>(row)).next();
}

}  // namespace vqa::data
