// shard_indices_for_rank, the pure sampler: exact set properties, no tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/loader.h"  // shard_indices_for_rank, shard_padding_start

namespace {

using vqa::data::shard_indices_for_rank;
using vqa::data::shard_padding_start;

TEST(Sampler, ShardsAreDisjointCoverAndHaveEqualSize) {
  for (int64_t n : {1, 2, 7, 10, 64, 101}) {
    for (int world : {1, 2, 3, 4}) {
      for (bool drop_last : {false, true}) {
        std::multiset<int64_t> real;  // samples before the padding start
        std::set<size_t> sizes;
        for (int rank = 0; rank < world; ++rank) {
          const auto shard = shard_indices_for_rank(n, 5, 2, true, drop_last, rank, world);
          sizes.insert(shard.size());
          const int64_t padding = shard_padding_start(n, drop_last, rank, world);
          for (int64_t i = 0; i < static_cast<int64_t>(shard.size()); ++i) {
            ASSERT_GE(shard[i], 0);
            ASSERT_LT(shard[i], n);
            if (i < padding) real.insert(shard[i]);
          }
        }
        SCOPED_TRACE("n " + std::to_string(n) + " world " + std::to_string(world) +
                     (drop_last ? " drop_last" : " pad"));
        EXPECT_EQ(sizes.size(), 1u) << "every rank gets the same count";
        const int64_t expected = drop_last ? n / world * world : n;
        EXPECT_EQ(static_cast<int64_t>(real.size()), expected);
        EXPECT_EQ(std::set<int64_t>(real.begin(), real.end()).size(), real.size())
            << "a sample appears twice outside the padding";
      }
    }
  }
}

TEST(Sampler, PermutationDependsOnSeedAndEpochOnly) {
  const auto a = shard_indices_for_rank(1000, 7, 3, true, false, 1, 3);
  EXPECT_EQ(a, shard_indices_for_rank(1000, 7, 3, true, false, 1, 3));
  EXPECT_NE(a, shard_indices_for_rank(1000, 7, 4, true, false, 1, 3));
  EXPECT_NE(a, shard_indices_for_rank(1000, 8, 3, true, false, 1, 3));
}

TEST(Sampler, WithoutShuffleTheOrderIsStrided) {
  EXPECT_EQ(shard_indices_for_rank(7, 1, 0, false, false, 1, 3), (std::vector<int64_t>{1, 4, 0}));
  EXPECT_EQ(shard_padding_start(7, false, 1, 3), 2);
  EXPECT_EQ(shard_indices_for_rank(7, 1, 0, false, true, 2, 3), (std::vector<int64_t>{2, 5}));
}

TEST(Sampler, RejectsBadArguments) {
  EXPECT_THROW(shard_indices_for_rank(10, 0, 0, true, false, 3, 3), std::invalid_argument);
  EXPECT_THROW(shard_indices_for_rank(-1, 0, 0, true, false, 0, 1), std::invalid_argument);
}

}  // namespace
