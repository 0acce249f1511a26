// The in-training allreduce tuner's plan and decision on given step times
// (allreduce_autotune.h): the interleaved schedule after 2 warm-up steps, the
// budget, the choice by the slowest rank's medians and the cost reported,
// the bucket sizes tried and the stored choice's key.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "runtime/allreduce_choice.h"
#include "train/allreduce_autotune.h"

namespace vqa::train {
namespace {

TEST(AllreduceAutotune, ScheduleWarmsUpThenRotatesTheCandidatesEveryRound) {
  const AutotuneSchedule schedule(/*first_step=*/10, /*candidates=*/4, /*rounds=*/3);
  EXPECT_EQ(schedule.steps(), 14);
  EXPECT_EQ(schedule.end_step(), 24);
  EXPECT_EQ(schedule.candidate_at(9), -1);
  EXPECT_EQ(schedule.candidate_at(24), -1);
  for (const int64_t warm_up : {10, 11}) {  // the start-up choice, not measured
    EXPECT_EQ(schedule.candidate_at(warm_up), 0);
    EXPECT_FALSE(schedule.measured(warm_up));
  }
  std::vector<int> order;
  std::map<int, int> steps_of;
  for (int64_t step = 12; step < 24; ++step) {
    EXPECT_TRUE(schedule.measured(step));
    order.push_back(schedule.candidate_at(step));
    ++steps_of[order.back()];
  }
  // Each round holds every candidate once, and each round starts elsewhere,
  // so a slow spell of a shared machine does not fall on one candidate.
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 1, 2, 3, 0, 2, 3, 0, 1}));
  for (const auto& [candidate, steps] : steps_of) EXPECT_EQ(steps, 3) << candidate;
}

TEST(AllreduceAutotune, BudgetIsTheSmallerOfTheStepsAskedAndAQuarterOfTheRun) {
  // 4 candidates: 3 rounds need 14 steps (2 warm-ups), 2 rounds 10.
  EXPECT_EQ(autotune_rounds(4, /*max_steps=*/16, /*steps_left=*/1000), 3);
  EXPECT_EQ(autotune_rounds(4, 13, 1000), 2);  // (13 - 2) / 4
  EXPECT_EQ(autotune_rounds(4, 9, 1000), 0);   // under 2 rounds: the start-up choice stays
  EXPECT_EQ(autotune_rounds(4, 16, 56), 3);    // a quarter of 56: 14
  EXPECT_EQ(autotune_rounds(4, 16, 55), 2);    // a quarter of 55: 13
  EXPECT_EQ(autotune_rounds(4, 16, 32), 0);    // a quarter of 32: 8
  EXPECT_EQ(autotune_rounds(1, 16, 1000), 0);  // nothing to choose between
}

TEST(AllreduceAutotune, ChoosesByTheSlowestRanksMedianAndPricesTheTrials) {
  // Rank 1 is fast with candidate 2, but rank 0 is slow with it: every step
  // waits for the slowest rank, so candidate 1 wins.
  const std::vector<std::vector<double>> seconds = {{0.50, 0.42, 0.60, 0.45},
                                                    {0.48, 0.40, 0.30, 0.44}};
  const std::vector<std::vector<double>> exposed = {{0.10, 0.02, 0.20, 0.05},
                                                    {0.12, 0.01, 0.01, 0.06}};
  const AutotuneResult result = autotune_decide(seconds, exposed, /*rounds=*/3);
  EXPECT_EQ(result.choice, 1);
  EXPECT_EQ(result.seconds, (std::vector<double>{0.50, 0.42, 0.60, 0.45}));
  EXPECT_EQ(result.exposed_seconds, (std::vector<double>{0.12, 0.02, 0.20, 0.06}));
  // 3 trial steps of each candidate, each over the choice's 0.42 s.
  EXPECT_NEAR(result.seconds_lost, 3 * (0.08 + 0.0 + 0.18 + 0.03), 1e-12);
}

TEST(AllreduceAutotune, TieKeepsTheStartUpChoice) {
  const AutotuneResult result = autotune_decide({{0.4, 0.4, 0.5}}, {{0.1, 0.1, 0.1}}, 2);
  EXPECT_EQ(result.choice, 0);
  EXPECT_NEAR(result.seconds_lost, 2 * 0.1, 1e-12);
}

TEST(AllreduceAutotune, StoredChoiceIsKeyedByRanksAndBuckets) {
  const std::string key = autotune_key(3, {256556, 187136});
  EXPECT_EQ(key, "3 ranks, buckets 256556 187136");
  EXPECT_NE(key, autotune_key(2, {256556, 187136}));
  EXPECT_NE(key, autotune_key(3, {256556}));
}

TEST(AllreduceAutotune, StoredSizeChoiceIsKeyedByRanksAndBytesNotTheProbesSize) {
  const std::string key = autotune_key_tuned_size(3, 1141036);
  EXPECT_EQ(key, "3 ranks, 1141036 bytes per step, bucket size tuned");
  EXPECT_NE(key, autotune_key_tuned_size(2, 1141036));
  EXPECT_NE(key, autotune_key(3, {1141036}));  // a choice of methods only is not reused
}

TEST(AllreduceAutotune, BucketSizesAreHalfAndTwiceTheSizeThatTakesEffect) {
  // The probe's 8 MiB of 20 MiB of gradients: 4 and 16.
  EXPECT_EQ(autotune_bucket_sizes(8.0, 20.0), (std::vector<double>{4.0, 16.0}));
  // 19.3 MiB asked, 1.088 MiB of gradients (one bucket holds them all):
  // around the 1.088, to 3 digits, so that the logged number pins the same buckets.
  EXPECT_EQ(autotune_bucket_sizes(19.3, 1.08817), (std::vector<double>{0.544, 2.18}));
}

// The stored choice and the communicator's switch name methods by text.
TEST(AllreduceAutotune, MethodNamesReadBackToTheirMethods) {
  using runtime::AllreduceAlgorithm;
  using runtime::AllreduceMethod;
  for (const AllreduceMethod& method :
       {AllreduceMethod{}, AllreduceMethod{AllreduceAlgorithm::kRing, int64_t{1024} << 10},
        AllreduceMethod{AllreduceAlgorithm::kRing, int64_t{60} << 10},
        AllreduceMethod{AllreduceAlgorithm::kReduceScatterAllgather, 0}}) {
    const std::string name = runtime::allreduce_method_name(method);
    EXPECT_TRUE(runtime::allreduce_method_from_name(name) == method) << name;
  }
  EXPECT_THROW(runtime::allreduce_method_from_name("ring 60 MiB"), std::invalid_argument);
  EXPECT_THROW(runtime::allreduce_method_from_name("fast"), std::invalid_argument);
}

}  // namespace
}  // namespace vqa::train
