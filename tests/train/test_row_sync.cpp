// --sparse-embedding-sync end to end under mpirun: the word embedding's
// gradient averaged by the rows some rank touched gives the very parameters
// the whole table's average gives, in float32 and with the bfloat16
// allreduce, with gradient accumulation, at 2 and 3 ranks, while sending
// fewer bytes; auto picks it for a large vocabulary only.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "checkpoint_files.h"  // load_model, max_relative_difference, differing_tensors
#include "process.h"           // run_process, mpirun_prefix, make_temp_dir
#include "run_files.h"         // read_metrics

namespace fs = std::filesystem;

namespace {

using vqa::testing::differing_tensors;
using vqa::testing::load_model;

class RowSync : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("rowsync");
    // 5,000 entries: the templates' words and filler words that end each
    // question (4-12 per question, Zipf), so a step of 16 questions touches
    // a few dozen rows of the table.
    dataset_ = directory_ + "/synth-vocab.h5";
    const auto result = vqa::testing::run_process(
        std::string(VQA_PREP) + " synth -o " + dataset_ +
            " --train-questions 512 --test-questions 64 --seed 5 --vocab-size 5000 --max-len 32",
        120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    ASSERT_NE(result.output.find("5000 vocabulary entries"), std::string::npos) << result.output;
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }

  // vqa_train on `ranks` ranks for `steps` optimiser steps with `flags`; returns <out>.
  static std::string train(const std::string& name, int ranks, const std::string& flags,
                           int steps = 20) {
    const std::string out = directory_ + "/" + name;
    const auto result = vqa::testing::run_process(
        vqa::testing::mpirun_prefix(ranks) + VQA_TRAIN + " --train-data " + dataset_ + " --out " +
            out + " --threads 1 --progress off --lr 1e-3 --seed 3 --epochs 1 --eval-every 0 " +
            "--max-steps-per-epoch " + std::to_string(steps) + " " + flags,
        600);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    last_output_ = result.output;
    return out;
  }

  static std::map<std::string, torch::Tensor> model_of(const std::string& out) {
    return load_model(out + "/checkpoints/epoch-0000.pt");
  }

  // The epoch's allreduced bytes per step, as metrics.jsonl records them.
  static double bytes_per_step(const std::string& out) {
    const auto records = vqa::testing::read_metrics(out);
    EXPECT_EQ(records.size(), 1u) << out;
    return records.empty() ? 0.0 : records.back().at("allreduce_bytes_per_step").get<double>();
  }

  // The run that made `rows_out` synchronised the word embedding by rows: its
  // log says so, and it sent less than half the bytes per step of the run
  // that made `dense_out` with the whole table (a fallback to the whole
  // table would send the same), so the equality checked after it is not
  // the trivial one of two whole-table runs. `rows_output`: the rows run's output.
  static void expect_synced_by_rows(const std::string& rows_output, const std::string& mode,
                                    const std::string& rows_out, const std::string& dense_out) {
    EXPECT_NE(
        rows_output.find("word embedding sync: by rows (--sparse-embedding-sync " + mode + ")"),
        std::string::npos)
        << rows_output;
    const double rows_bytes = bytes_per_step(rows_out), dense_bytes = bytes_per_step(dense_out);
    std::printf("%s: bytes per step by rows %.0f, whole table %.0f\n", rows_out.c_str(), rows_bytes,
                dense_bytes);
    // The tiny model's table is 5000 x 64 values, 53% of what each step
    // sends in full; a step touches at most global batch x 32 rows.
    EXPECT_LT(rows_bytes, 0.5 * dense_bytes) << rows_out;
  }

  static inline std::string directory_, dataset_, last_output_;
};

// 2 ranks: float32 and the bfloat16 allreduce, each on and off. The rows are
// summed as the whole table's are (each element's sum of two is the same
// addition), so the parameters agree to the last bit.
TEST_F(RowSync, EqualsTheWholeTableBitwiseAtTwoRanks) {
  const std::string common = " --global-batch 16 --batch-per-rank 8 ";
  const auto rows_out = train("rows", 2, common + "--sparse-embedding-sync auto");
  const std::string rows_output = last_output_;
  const auto dense_out = train("dense", 2, common + "--sparse-embedding-sync off");
  // The table is 5000 x 64 float32 = 1.28 MB of the 2.42 MB each step sends in full.
  expect_synced_by_rows(rows_output, "auto", rows_out, dense_out);
  EXPECT_EQ(differing_tensors(model_of(rows_out), model_of(dense_out)), "");

  const auto rows_bf16 =
      train("rows-bf16", 2, common + "--bf16-allreduce true --sparse-embedding-sync on");
  const std::string rows_bf16_output = last_output_;
  const auto dense_bf16 =
      train("dense-bf16", 2, common + "--bf16-allreduce true --sparse-embedding-sync off");
  expect_synced_by_rows(rows_bf16_output, "on", rows_bf16, dense_bf16);
  EXPECT_EQ(differing_tensors(model_of(rows_bf16), model_of(dense_bf16)), "");
}

// Accumulation (2 micro-steps per step: the union over both) at 2 ranks is
// still bitwise. At 3 ranks an element's three terms may be added in another
// order when the buckets are cut differently (the ring's chunks and the
// library's blocks follow the buffer's length), so the tolerance is the one
// the other equivalence tests give the order of float additions: 1e-5
// relative per tensor after 20 AdamW steps (measured 2.6e-6, with clipping).
TEST_F(RowSync, EqualsTheWholeTableWithAccumulationAndAtThreeRanks) {
  const auto rows_acc =
      train("rows-acc", 2, "--global-batch 32 --batch-per-rank 8 --sparse-embedding-sync on");
  EXPECT_NE(last_output_.find("2 accumulation step(s)"), std::string::npos) << last_output_;
  const std::string rows_acc_output = last_output_;
  const auto dense_acc =
      train("dense-acc", 2, "--global-batch 32 --batch-per-rank 8 --sparse-embedding-sync off");
  expect_synced_by_rows(rows_acc_output, "on", rows_acc, dense_acc);
  EXPECT_EQ(differing_tensors(model_of(rows_acc), model_of(dense_acc)), "");

  const std::string three = " --global-batch 24 --batch-per-rank 8 --grad-clip 1.0 ";
  const auto rows_three = train("rows-3", 3, three + "--sparse-embedding-sync on");
  const std::string rows_three_output = last_output_;
  const auto dense_three = train("dense-3", 3, three + "--sparse-embedding-sync off");
  expect_synced_by_rows(rows_three_output, "on", rows_three, dense_three);
  const auto rows_model = model_of(rows_three), dense_model = model_of(dense_three);
  const double difference = vqa::testing::max_relative_difference(rows_model, dense_model);
  std::printf("3 ranks, by rows vs whole table: max relative difference %.3g\n", difference);
  EXPECT_LT(difference, 1e-5);
}

// auto keeps the whole table where a step's token positions could touch
// every row (the 5,000-row table with a global batch of 512 x 32 tokens); on
// with one rank says it has nothing to send.
TEST_F(RowSync, AutoAndOneRankSayWhatTheyDo) {
  train("auto-large-batch", 2, "--global-batch 512 --batch-per-rank 8", /*steps=*/1);
  EXPECT_NE(last_output_.find("word embedding sync: whole table (--sparse-embedding-sync auto: "
                              "16384 token positions per step (global batch 512 x 32) could "
                              "touch all 5000 rows)"),
            std::string::npos)
      << last_output_;
  train("one-rank", 1, "--global-batch 8 --batch-per-rank 8 --sparse-embedding-sync on",
        /*steps=*/2);
  EXPECT_NE(last_output_.find("--sparse-embedding-sync on has no effect: one rank sends nothing"),
            std::string::npos)
      << last_output_;
}

}  // namespace
