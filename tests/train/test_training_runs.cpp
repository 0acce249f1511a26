// vqa_train end to end under mpirun on a small synthetic set: data-parallel
// equivalence, exact resume, resume at another rank count, a stop signal
// (checkpoint, exit 75, exact resume mid-epoch), refusal of a global batch
// that does not divide, gradient clipping and the bfloat16 allreduce; the
// same equivalence and exact resume with the random resized crop on;
// --cuda-graph where capture cannot work.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint_files.h"  // load_model, load_checkpoint, load_first_moments, ...
#include "process.h"           // run_process, mpirun_prefix, make_temp_dir
#include "run_files.h"         // read_metrics

namespace fs = std::filesystem;

namespace {

using vqa::testing::differing_tensors;
using vqa::testing::global_norm;
using vqa::testing::load_checkpoint;
using vqa::testing::load_first_moments;
using vqa::testing::load_model;
using vqa::testing::max_relative_difference;
using vqa::testing::read_metrics;
using vqa::testing::whole_relative_difference;

class TrainingRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("train");
    dataset_ = directory_ + "/synth.h5";
    const auto result =
        vqa::testing::run_process(std::string(VQA_PREP) + " synth -o " + dataset_ +
                                      " --train-questions 512 --test-questions 128 --seed 7",
                                  120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    // The same questions with source images of 40 px (stored images: their resize to 32).
    augmented_dataset_ = directory_ + "/synth-sources.h5";
    const auto sources = vqa::testing::run_process(
        std::string(VQA_PREP) + " synth -o " + augmented_dataset_ +
            " --train-questions 512 --test-questions 128 --seed 7 --source-size 40",
        120);
    ASSERT_EQ(sources.exit_code, 0) << sources.output;
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }

  // Runs vqa_train on `ranks` ranks with common flags plus `flags`, into <dir>/<name>.
  static std::string train(const std::string& name, int ranks, const std::string& flags,
                           const std::string& dataset = "") {
    const std::string out = directory_ + "/" + name;
    const auto result = vqa::testing::run_process(
        vqa::testing::mpirun_prefix(ranks) + VQA_TRAIN + " --train-data " +
            (dataset.empty() ? dataset_ : dataset) + " --out " + out +
            " --threads 1 --progress off --lr 1e-3 --seed 3 " + flags,
        600);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    expect_shutdown_in_order(result.output);
    last_output_ = result.output;
    return out;
  }

  // Every exit path ends MPI after the loaders are gone (the loader says so
  // on stderr otherwise, as data_prep's BadFile test shows).
  static void expect_shutdown_in_order(const std::string& output) {
    EXPECT_EQ(output.find("outlived MPI_Finalize"), std::string::npos) << output;
  }

  static inline std::string directory_, dataset_, augmented_dataset_, last_output_;
};

// The same samples make each optimiser step; only the order of float
// additions differs. The weights after 10 steps agree to 1e-5 relative per
// parameter tensor. They would also agree with the gradient off by a uniform
// factor (AdamW's m / sqrt(v) divides it out; so does clipping, below), so the
// first step's synchronised gradient is compared as well: the first moments
// of a 1-step run are (1 - beta1) x that gradient. Measured 1.8e-7 relative
// (all parameters as one vector); tolerance 1e-6, where a sum over the ranks
// instead of their average or a missing 1/accumulation is off by 2x.
TEST_F(TrainingRuns, TwoRanksEqualOneRankWithDoubleBatchAndWithAccumulation) {
  const std::string first_step =
      " --epochs 1 --max-steps-per-epoch 1 --global-batch 16 --eval-every 0 ";
  const auto epoch_end = "/checkpoints/epoch-0000.pt";
  const auto first_two =
      load_first_moments(train("first2", 2, first_step + "--batch-per-rank 8") + epoch_end);
  const auto first_one =
      load_first_moments(train("first1", 1, first_step + "--batch-per-rank 16") + epoch_end);
  const auto first_accumulated =
      load_first_moments(train("first1acc", 1, first_step + "--batch-per-rank 8") + epoch_end);
  std::printf(
      "first step's gradient, relative difference as one vector: 2 ranks vs 1 rank %.3g, "
      "accumulation vs 1 rank %.3g; norm ratios %.7g, %.7g\n",
      whole_relative_difference(first_two, first_one),
      whole_relative_difference(first_accumulated, first_one),
      global_norm(first_two) / global_norm(first_one),
      global_norm(first_accumulated) / global_norm(first_one));
  EXPECT_GT(global_norm(first_one), 0.0);
  EXPECT_LT(whole_relative_difference(first_two, first_one), 1e-6);
  EXPECT_LT(whole_relative_difference(first_accumulated, first_one), 1e-6);

  const std::string common =
      " --epochs 1 --max-steps-per-epoch 10 --global-batch 16 --eval-every 0 ";
  const auto two_ranks =
      load_model(train("eq2", 2, common + "--batch-per-rank 8") + "/checkpoints/epoch-0000.pt");
  const auto one_rank =
      load_model(train("eq1", 1, common + "--batch-per-rank 16") + "/checkpoints/epoch-0000.pt");
  const auto accumulated =
      load_model(train("eq1acc", 1, common + "--batch-per-rank 8") + "/checkpoints/epoch-0000.pt");
  EXPECT_NE(last_output_.find("2 accumulation step(s)"), std::string::npos) << last_output_;
  const double two_vs_one = max_relative_difference(two_ranks, one_rank);
  const double accumulated_vs_one = max_relative_difference(accumulated, one_rank);
  std::printf("max relative difference: 2 ranks vs 1 rank %.3g, accumulation vs 1 rank %.3g\n",
              two_vs_one, accumulated_vs_one);
  EXPECT_LT(two_vs_one, 1e-5);
  EXPECT_LT(accumulated_vs_one, 1e-5);

  // Control: without the gradient allreduce rank 0 follows only its own half
  // of each batch and ends up measurably elsewhere (> 1e-3 relative).
  const auto no_comm = load_model(train("eq2nocomm", 2, common + "--batch-per-rank 8 --no-comm") +
                                  "/checkpoints/epoch-0000.pt");
  const double no_comm_vs_one = max_relative_difference(no_comm, one_rank);
  std::printf("max relative difference: 2 ranks without allreduce vs 1 rank %.3g\n",
              no_comm_vs_one);
  EXPECT_GT(no_comm_vs_one, 1e-3);
}

// The random resized crop gives every sample its crop from (seed, epoch,
// question row) alone: 2 ranks x 8 and 1 rank x 16 train on the same pixels
// and agree to 1e-5 relative (as without it); the crop acts (the same run
// without it ends > 1e-4 away); a resume from epoch 1 continues with the
// crops the straight run drew, to the last bit (3 crop threads per rank).
TEST_F(TrainingRuns, AugmentedRunsMatchAcrossRankCountsAndResumeExactly) {
  const std::string common =
      " --epochs 1 --max-steps-per-epoch 10 --global-batch 16 --eval-every 0 ";
  const std::string augment = " --augment resized-crop --augment-threads 3 ";
  const auto checkpoint = "/checkpoints/epoch-0000.pt";
  const auto two = load_model(
      train("aug2", 2, common + augment + "--batch-per-rank 8", augmented_dataset_) + checkpoint);
  EXPECT_NE(last_output_.find("augmentation: train images are random resized crops"),
            std::string::npos)
      << last_output_;
  const auto one = load_model(
      train("aug1", 1, common + augment + "--batch-per-rank 16", augmented_dataset_) + checkpoint);
  const auto plain = load_model(
      train("aug1plain", 1, common + "--batch-per-rank 16", augmented_dataset_) + checkpoint);
  const double two_vs_one = max_relative_difference(two, one);
  const double crop_effect = max_relative_difference(one, plain);
  std::printf(
      "max relative difference with the crop: 2 ranks vs 1 rank %.3g; with vs without %.3g\n",
      two_vs_one, crop_effect);
  EXPECT_LT(two_vs_one, 1e-5);
  EXPECT_GT(crop_effect, 1e-4);

  const std::string resume_common =
      " --epochs 3 --max-steps-per-epoch 6 --global-batch 16 --batch-per-rank 8 " + augment;
  const auto straight = train("aug-straight", 2, resume_common, augmented_dataset_);
  const auto resumed =
      train("aug-resumed", 2, resume_common + "--resume " + straight + "/checkpoints/epoch-0001.pt",
            augmented_dataset_);
  EXPECT_NE(last_output_.find("resumed from"), std::string::npos) << last_output_;
  const auto expected = read_metrics(straight);
  const auto got = read_metrics(resumed);
  ASSERT_EQ(expected.size(), 3u);
  ASSERT_EQ(got.size(), 1u);
  for (const char* key : {"train_loss", "test_loss", "overall", "lr"}) {
    EXPECT_EQ(got[0][key].get<double>(), expected[2][key].get<double>()) << key;
  }
  // Every tensor of the last checkpoint: weights, AdamW moments, position.
  EXPECT_EQ(differing_tensors(load_checkpoint(straight + "/checkpoints/epoch-0002.pt"),
                              load_checkpoint(resumed + "/checkpoints/epoch-0002.pt")),
            "");
}

// Gradient clipping on averaged gradients: 2 ranks clip what 1 rank with
// the whole batch clips (1e-5 relative, as above), and the clip acts (the
// clipped run ends > 1e-4 relative away from the unclipped one). bfloat16
// allreduce: 2 ranks stay near 1 rank in fp32 (measured 2e-3; tolerance
// 2e-2, where leaving the allreduce out altogether measured 0.5).
TEST_F(TrainingRuns, ClippingMatchesAcrossRankCountsAndBf16AllreduceStaysClose) {
  const std::string common =
      " --epochs 1 --max-steps-per-epoch 10 --global-batch 16 --eval-every 0 ";
  const auto checkpoint = "/checkpoints/epoch-0000.pt";
  const auto clipped_two =
      load_model(train("clip2", 2, common + "--batch-per-rank 8 --grad-clip 0.05") + checkpoint);
  const auto clipped_one =
      load_model(train("clip1", 1, common + "--batch-per-rank 16 --grad-clip 0.05") + checkpoint);
  const auto unclipped_one =
      load_model(train("noclip1", 1, common + "--batch-per-rank 16") + checkpoint);
  const auto bf16_two = load_model(
      train("bf16", 2, common + "--batch-per-rank 8 --bf16-allreduce true") + checkpoint);
  const double clipped = max_relative_difference(clipped_two, clipped_one);
  const double clip_effect = max_relative_difference(clipped_one, unclipped_one);
  const double bf16 = max_relative_difference(bf16_two, unclipped_one);
  std::printf(
      "max relative difference: clipped 2 ranks vs 1 rank %.3g, clipped vs unclipped %.3g, "
      "bf16 allreduce vs fp32 1 rank %.3g\n",
      clipped, clip_effect, bf16);
  EXPECT_LT(clipped, 1e-5);
  EXPECT_GT(clip_effect, 1e-4);
  EXPECT_LT(bf16, 2e-2);
}

// --cuda-graph where capture cannot work (here the CPU) changes nothing:
// questions are trimmed and the word embedding's sync chosen as without it
// (a captured run would pad and sync the whole table), so the weights are
// equal to the last bit, and train.log says why there is no graph.
TEST_F(TrainingRuns, CudaGraphWhereCaptureCannotWorkIsTheRunWithoutIt) {
  const std::string common =
      " --epochs 1 --max-steps-per-epoch 6 --global-batch 16 --batch-per-rank 8 "
      "--eval-every 0 ";
  const auto checkpoint = "/checkpoints/epoch-0000.pt";
  const auto graph = load_model(train("graph-cpu", 2, common + "--cuda-graph true") + checkpoint);
  const std::string graph_output = last_output_;
  const auto plain = load_model(train("plain", 2, common) + checkpoint);
  const std::string plain_output = last_output_;
  EXPECT_EQ(vqa::testing::differing_tensors(graph, plain), "");
  EXPECT_NE(graph_output.find("CUDA graph: eager steps (the device is the CPU)"), std::string::npos)
      << graph_output;
  EXPECT_EQ(graph_output.find("with --cuda-graph"), std::string::npos) << graph_output;
  // The same choice of word-embedding sync in both runs' logs.
  const auto sync_line = [](const std::string& output) {
    const auto at = output.find("word embedding sync:");
    return at == std::string::npos ? std::string("none")
                                   : output.substr(at, output.find('\n', at) - at);
  };
  EXPECT_EQ(sync_line(graph_output), sync_line(plain_output));
}

// A 2-rank run resumed from epoch 1's checkpoint of 4 ends where the
// uninterrupted run ends, in every tensor of the last checkpoint (weights,
// AdamW moments, position) and every metric; resumed on 1 rank (the same
// samples, sums in another order) within 1e-5 relative per weight tensor
// (measured 6e-8).
TEST_F(TrainingRuns, ResumeContinuesExactlyAndAtAnotherRankCount) {
  const std::string common = " --epochs 4 --max-steps-per-epoch 6 --global-batch 16 ";
  const auto straight = train("straight", 2, common + "--batch-per-rank 8");
  const std::string checkpoint = straight + "/checkpoints/epoch-0001.pt";
  ASSERT_TRUE(fs::exists(checkpoint));
  const auto resumed = train("resumed", 2, common + "--batch-per-rank 8 --resume " + checkpoint);
  EXPECT_NE(last_output_.find("resumed from"), std::string::npos) << last_output_;
  const auto one_rank = train("resumed1", 1, common + "--batch-per-rank 16 --resume " + checkpoint);

  const auto expected = read_metrics(straight);
  const auto got = read_metrics(resumed);
  const auto got_one_rank = read_metrics(one_rank);
  ASSERT_EQ(expected.size(), 4u);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(got_one_rank.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& want = expected[2 + i];
    EXPECT_EQ(got[i]["epoch"], want["epoch"]);
    // Same ranks, same threads, same order of operations on CPU: identical numbers.
    for (const char* key : {"train_loss", "test_loss", "overall", "open", "closed", "lr"}) {
      EXPECT_EQ(got[i][key].get<double>(), want[key].get<double>()) << key << " epoch " << 2 + i;
    }
    // One rank sums the same samples in another order: losses agree to 1e-4
    // relative; the schedule is identical.
    EXPECT_NEAR(got_one_rank[i]["train_loss"].get<double>(), want["train_loss"].get<double>(),
                1e-4 * want["train_loss"].get<double>());
    EXPECT_EQ(got_one_rank[i]["lr"].get<double>(), want["lr"].get<double>());
  }

  const std::string last = "/checkpoints/epoch-0003.pt";
  const auto want_last = load_checkpoint(straight + last);
  EXPECT_EQ(differing_tensors(want_last, load_checkpoint(resumed + last)), "")
      << "resumed at 2 ranks differs from the uninterrupted run";
  const double one_rank_vs_straight =
      max_relative_difference(load_model(one_rank + last), load_model(straight + last));
  std::printf("max relative difference of the weights: resumed at 1 rank vs uninterrupted %.3g\n",
              one_rank_vs_straight);
  EXPECT_LT(one_rank_vs_straight, 1e-5);
}

TEST_F(TrainingRuns, StopSignalOnOneRankCheckpointsEveryRankAndResumesExactly) {
  const std::string common =
      " --epochs 5 --max-steps-per-epoch 30 --global-batch 16 --batch-per-rank 8 ";
  const auto straight = train("uninterrupted", 2, common);
  // The best epoch's predictions: one JSON line per test question.
  {
    std::ifstream predictions(straight + "/predictions_best.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(predictions, line)) {
      const auto record = nlohmann::json::parse(line);
      EXPECT_TRUE(record.contains("qid") && record.contains("top") && record.contains("correct"))
          << line;
      ++lines;
    }
    EXPECT_EQ(lines, 128) << "predictions_best.jsonl of " << straight;
  }
  const std::string out = directory_ + "/stopped";
  // SIGUSR1 to one rank only, once the first epoch is logged: the other rank
  // must stop at the same step through the agreement, not by its own signal.
  const auto stopped = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + VQA_TRAIN + " --train-data " + dataset_ + " --out " + out +
          " --threads 1 --progress off --lr 1e-3 --seed 3 " + common + " & job=$!; " +
          "while [ ! -s " + out + "/metrics.jsonl ]; do sleep 0.05; done; " +
          "kill -USR1 $(pgrep -P $job | tail -n 1); wait $job",
      300);
  EXPECT_EQ(stopped.exit_code, 75) << stopped.output;
  expect_shutdown_in_order(stopped.output);
  EXPECT_LT(stopped.seconds, 120.0);
  EXPECT_NE(stopped.output.find("stopped by SIGUSR1 at epoch"), std::string::npos)
      << stopped.output;
  EXPECT_FALSE(fs::exists(out + "/DONE"));
  std::ifstream latest(out + "/checkpoints/latest");
  std::string name;
  ASSERT_TRUE(latest >> name) << "no checkpoints/latest after the stop";
  std::printf("stop checkpoint: %s\n", name.c_str());
  // Inside an epoch after the first (the signal came once epoch 0 was logged):
  // epoch-E-step-S.pt with 0 < S < 30, S also in the file and in the log.
  long long stop_epoch = -1, stop_step = -1;
  int consumed = 0;
  ASSERT_EQ(
      std::sscanf(name.c_str(), "epoch-%lld-step-%lld.pt%n", &stop_epoch, &stop_step, &consumed), 2)
      << "not a mid-epoch checkpoint: " << name;
  EXPECT_EQ(consumed, static_cast<int>(name.size())) << name;
  EXPECT_GE(stop_epoch, 1) << name;
  EXPECT_GT(stop_step, 0) << name;
  EXPECT_LT(stop_step, 30) << name;
  const auto stop_state = load_checkpoint(out + "/checkpoints/" + name);
  ASSERT_EQ(stop_state.count("state.step_in_epoch"), 1u);
  EXPECT_EQ(stop_state.at("state.step_in_epoch").item<int64_t>(), stop_step);
  EXPECT_NE(stopped.output.find("stopped by SIGUSR1 at epoch " + std::to_string(stop_epoch) +
                                " after " + std::to_string(stop_step) + " of its optimiser steps"),
            std::string::npos)
      << stopped.output;

  train("stopped", 2, common + "--resume auto");
  EXPECT_NE(last_output_.find("resumed from"), std::string::npos) << last_output_;
  EXPECT_TRUE(fs::exists(out + "/DONE"));
  const auto want = read_metrics(straight);
  const auto got = read_metrics(out);
  ASSERT_EQ(want.size(), 5u);
  ASSERT_EQ(got.size(), want.size());
  // Same ranks, threads and order of operations on CPU: every field except
  // the timings is identical, the stopped epoch's loss and sample count too.
  for (size_t i = 0; i < want.size(); ++i) {
    for (const char* key : {"epoch", "train_loss", "test_loss", "overall", "open", "closed", "lr",
                            "samples", "optimizer_steps", "best"}) {
      EXPECT_EQ(got[i][key], want[i][key]) << key << " epoch " << i;
    }
  }

  // Every tensor of the last checkpoint: weights, AdamW moments, position.
  EXPECT_EQ(differing_tensors(load_checkpoint(straight + "/checkpoints/epoch-0004.pt"),
                              load_checkpoint(out + "/checkpoints/epoch-0004.pt")),
            "");

  // A completed run started again with --resume auto does nothing.
  train("stopped", 2, common + "--resume auto");
  EXPECT_NE(last_output_.find("nothing to do"), std::string::npos) << last_output_;
  EXPECT_EQ(read_metrics(out).size(), want.size());
}

TEST_F(TrainingRuns, NonFiniteGradientStopsEveryRankOrIsSkipped) {
  // Rank 1's loss becomes NaN at optimiser step 15 (epoch 1, step 5 of 10).
  const std::string common =
      " --epochs 3 --max-steps-per-epoch 10 --global-batch 16 --batch-per-rank 8 "
      "--test-nan-step 15 ";
  const std::string out = directory_ + "/nan-stop";
  const auto stopped = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + VQA_TRAIN + " --train-data " + dataset_ + " --out " + out +
          " --threads 1 --progress off --seed 3 " + common,
      120);
  EXPECT_EQ(stopped.exit_code, 3) << stopped.output;
  EXPECT_LT(stopped.seconds, 60.0);
  EXPECT_NE(stopped.output.find("non-finite gradient at epoch 1 optimiser step 15 (first bad "
                                "parameter: "),
            std::string::npos)
      << stopped.output;
  // The checkpoint of epoch 0 stays the latest; nothing was written after the bad step.
  std::ifstream latest(out + "/checkpoints/latest");
  std::string name;
  EXPECT_TRUE(latest >> name);
  EXPECT_EQ(name, "epoch-0000.pt");
  EXPECT_FALSE(fs::exists(out + "/checkpoints/epoch-0001.pt"));

  const auto skipped = train("nan-skip", 2, common + "--nonfinite skip");
  EXPECT_NE(last_output_.find("non-finite gradient at epoch 1 optimiser step 15"),
            std::string::npos)
      << last_output_;
  EXPECT_NE(last_output_.find("step skipped"), std::string::npos);
  const auto lines = read_metrics(skipped);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["skipped_steps"], 0);
  EXPECT_EQ(lines[1]["skipped_steps"], 1);
  for (const auto& line : lines) {
    EXPECT_TRUE(std::isfinite(line["train_loss"].get<double>())) << line.dump();
  }
}

// --precision fp16 on 2 CPU ranks (the loss scaler around float32 compute),
// growth every 4 finite steps, rank 1's loss NaN at step 9. The scale goes
// 65536 -> 131072 (after step 3) -> 262144 (step 7) -> 131072 (step 9
// overflows: skipped on every rank) -> 262144 (13) -> 524288 (17); each
// epoch's end checks that every rank holds the same scale (the job stops
// otherwise). Scaling by a power of two is exact, so epoch 0 equals the
// float32 run exactly; a resume from epoch 1's checkpoint restores the scale
// and its count and repeats epoch 2 exactly.
TEST_F(TrainingRuns, Fp16LossScalingSkipsOverflowsAlikeAndSurvivesResume) {
  const std::string common =
      " --epochs 3 --max-steps-per-epoch 6 --global-batch 16 --batch-per-rank 8 --eval-every 0 ";
  const std::string fp16 = common + "--precision fp16 --loss-scale-interval 4 --test-nan-step 9 ";
  const auto scaled = train("fp16", 2, fp16);
  EXPECT_NE(last_output_.find("fp16 overflow at epoch 1 optimiser step 9: step skipped, loss "
                              "scale 262144 -> 131072"),
            std::string::npos)
      << last_output_;
  const auto lines = read_metrics(scaled);
  ASSERT_EQ(lines.size(), 3u);
  const double expected_scale[3] = {131072, 131072, 524288};
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(lines[epoch]["loss_scale"].get<double>(), expected_scale[epoch]) << epoch;
    EXPECT_EQ(lines[epoch]["skipped_steps"], epoch == 1 ? 1 : 0) << epoch;
    EXPECT_TRUE(std::isfinite(lines[epoch]["train_loss"].get<double>()));
  }
  const auto plain = read_metrics(train("fp32", 2, common));
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(lines[0]["train_loss"].get<double>(), plain[0]["train_loss"].get<double>());
  EXPECT_FALSE(plain[0].contains("loss_scale"));

  const auto resumed =
      train("fp16-resumed", 2, fp16 + "--resume " + scaled + "/checkpoints/epoch-0001.pt");
  EXPECT_NE(last_output_.find("fp16 loss scale 131072 from the checkpoint (2 finite steps "
                              "towards growth)"),
            std::string::npos)
      << last_output_;
  const auto again = read_metrics(resumed);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0]["loss_scale"].get<double>(), 524288.0);
  EXPECT_EQ(again[0]["train_loss"].get<double>(), lines[2]["train_loss"].get<double>());
  EXPECT_EQ(differing_tensors(load_checkpoint(scaled + "/checkpoints/epoch-0002.pt"),
                              load_checkpoint(resumed + "/checkpoints/epoch-0002.pt")),
            "");
}

// The GPU path's decisions on the device (ATen's fused AdamW, LibTorch 2.4
// on, forced onto the CPU with --test-aten-fused-adamw): the optimiser turns
// a bad step into a no-op without the host reading the flag, and the host
// learns of it a step later. The same outcomes as the host's decisions: the
// fp16 scales and skipped step of the test above, --nonfinite skip's count
// and message, --nonfinite stop's exit 3 with nothing saved after the bad step.
TEST_F(TrainingRuns, SkipsDecidedOnTheDeviceAreReadAStepLater) {
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 4)
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no at::_fused_adamw_ (2.4 on)";
#endif
  const std::string common =
      " --epochs 3 --max-steps-per-epoch 6 --global-batch 16 --batch-per-rank 8 --eval-every 0 "
      "--test-aten-fused-adamw true ";
  train("device-fp16", 2, common + "--precision fp16 --loss-scale-interval 4 --test-nan-step 9 ");
  EXPECT_NE(last_output_.find("fp16 overflow at epoch 1 optimiser step 9: step skipped, loss "
                              "scale 262144 -> 131072"),
            std::string::npos)
      << last_output_;
  const auto scaled = read_metrics(directory_ + "/device-fp16");
  ASSERT_EQ(scaled.size(), 3u);
  const double expected_scale[3] = {131072, 131072, 524288};
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(scaled[epoch]["loss_scale"].get<double>(), expected_scale[epoch]) << epoch;
    EXPECT_EQ(scaled[epoch]["skipped_steps"], epoch == 1 ? 1 : 0) << epoch;
    EXPECT_TRUE(std::isfinite(scaled[epoch]["train_loss"].get<double>()));
  }

  const auto skipped =
      read_metrics(train("device-skip", 2, common + "--test-nan-step 9 --nonfinite skip"));
  EXPECT_NE(last_output_.find("non-finite gradient at epoch 1 optimiser step 9: step skipped"),
            std::string::npos)
      << last_output_;
  ASSERT_EQ(skipped.size(), 3u);
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(skipped[epoch]["skipped_steps"], epoch == 1 ? 1 : 0) << epoch;
    EXPECT_TRUE(std::isfinite(skipped[epoch]["train_loss"].get<double>()));
  }

  const std::string out = directory_ + "/device-stop";
  const auto stopped = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + VQA_TRAIN + " --train-data " + dataset_ + " --out " + out +
          " --threads 1 --progress off --seed 3 " + common + "--test-nan-step 9",
      120);
  EXPECT_EQ(stopped.exit_code, 3) << stopped.output;
  EXPECT_NE(stopped.output.find("non-finite gradient at epoch 1 optimiser step 9 (found on the "
                                "device, a step later"),
            std::string::npos)
      << stopped.output;
  EXPECT_FALSE(fs::exists(out + "/checkpoints/epoch-0001.pt"));
}

TEST_F(TrainingRuns, GlobalBatchThatDoesNotDivideIsRefusedOnEveryRank) {
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + VQA_TRAIN + " --train-data " + dataset_ + " --out " +
          directory_ + "/bad --global-batch 24 --batch-per-rank 8",
      60);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_LT(result.seconds, 30.0);
  EXPECT_NE(result.output.find(
                "--global-batch 24 is not a multiple of --batch-per-rank x ranks = 8 x 2 = 16"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(fs::exists(directory_ + "/bad/checkpoints"));
}

}  // namespace
