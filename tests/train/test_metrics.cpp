// Accuracy on a hand-made fixture, counted on each rank's share of the rows
// and summed over ranks, equals the hand-computed numbers at 1 and 2 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/communicator.h"  // communicator_create
#include "runtime/distributed.h"   // distributed_rank_info
#include "train/metrics.h"         // count_answers, accuracy_from_counts

namespace {

// 8 questions, K = 3 labels. Row by row (pred = argmax of logits, gold = argmax of target):
//  0 closed pred 0 gold 0           -> right
//  1 closed pred 1 gold 0           -> wrong
//  2 open   pred 2 gold 2 (soft)    -> right
//  3 open   pred 0 gold: none       -> wrong (answer outside the label set, all-zero target)
//  4 open   pred 1 gold 1           -> right
//  5 closed pred 2 gold 2           -> right
//  6 open   pred 0 gold 1           -> wrong
//  7 open   pred 1 gold 1, padding  -> not counted
// By hand: overall 4/7, open 2/4, closed 2/3.
struct Fixture {
  torch::Tensor logits, targets, answer_type, valid;
};

Fixture make_fixture() {
  Fixture f;
  f.logits = torch::tensor({{5.f, 1.f, 0.f},
                            {0.f, 2.f, 1.f},
                            {0.f, 1.f, 3.f},
                            {4.f, 0.f, 0.f},
                            {0.f, 9.f, 1.f},
                            {1.f, 0.f, 2.f},
                            {3.f, 1.f, 0.f},
                            {0.f, 2.f, 0.f}});
  f.targets = torch::tensor({{1.f, 0.f, 0.f},
                             {1.f, 0.f, 0.f},
                             {0.f, 0.3f, 0.9f},
                             {0.f, 0.f, 0.f},
                             {0.f, 1.f, 0.f},
                             {0.f, 0.f, 1.f},
                             {0.f, 1.f, 0.f},
                             {0.f, 1.f, 0.f}});
  f.answer_type = torch::tensor({0, 0, 1, 1, 1, 0, 1, 1}, torch::kInt64);
  f.valid = torch::tensor({1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 0.f});
  return f;
}

TEST(Metrics, HandMadeFixtureSummedOverRanks) {
  const auto& info = vqa::runtime::distributed_rank_info();
  const Fixture f = make_fixture();
  // Rank r takes rows r, r + n, r + 2n, ... as the sampler shards the test split.
  const auto rows = torch::arange(info.rank, 8, info.world_size, torch::kInt64);
  auto counts =
      vqa::train::count_answers(f.logits.index_select(0, rows), f.targets.index_select(0, rows),
                                f.answer_type.index_select(0, rows), f.valid.index_select(0, rows));
  auto comm = vqa::runtime::communicator_create(vqa::runtime::Backend::kMpi, torch::kCPU);
  comm->allreduce(counts, vqa::runtime::ReduceOp::kSum);
  const auto accuracy = vqa::train::accuracy_from_counts(counts);
  // Counts are small integers, exact in float32: compare exactly.
  EXPECT_EQ(accuracy.total, 7);
  EXPECT_EQ(accuracy.open_total, 4);
  EXPECT_EQ(accuracy.closed_total, 3);
  EXPECT_DOUBLE_EQ(accuracy.overall, 4.0 / 7.0);
  EXPECT_DOUBLE_EQ(accuracy.open, 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(accuracy.closed, 2.0 / 3.0);
}

TEST(Metrics, NothingCountedGivesZeroNotNaN) {
  const auto zero = torch::zeros({vqa::train::kAnswerCounts});
  const auto accuracy = vqa::train::accuracy_from_counts(zero);
  EXPECT_EQ(accuracy.overall, 0.0);
  EXPECT_EQ(accuracy.total, 0);
}

}  // namespace
