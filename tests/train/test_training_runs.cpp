// vqa_train end to end under mpirun on a small synthetic set: exact resume,
// resume at another rank count, a stop signal (checkpoint, exit 75, exact
// resume mid-epoch), non-finite gradients (stop or skip), fp16 loss scaling
// across a resume, the same skips decided on the device, bf16 on the CPU
// (autocast where LibTorch can), and refusal of a global batch that does
// not divide. The equivalence across rank counts is
// test_training_equivalence.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint_files.h"       // load_model, load_checkpoint, max_relative_difference, ...
#include "model/autocast_state.h"   // kCpuAutocastRunsTheModel
#include "process.h"                // run_process, mpirun_prefix
#include "run_files.h"              // read_metrics
#include "training_runs_fixture.h"  // TrainingRuns

namespace fs = std::filesystem;

namespace {

using vqa::testing::differing_tensors;
using vqa::testing::load_checkpoint;
using vqa::testing::load_model;
using vqa::testing::max_relative_difference;
using vqa::testing::read_metrics;
using vqa::testing::TrainingRuns;

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

// --precision bf16 on the CPU, 2 ranks of 2 micro-steps each, evaluated under
// autocast too. With LibTorch 2.4 on the forward autocasts: the weight copies
// (the default) and autocast's casts (--weight-copies false) end in the same
// weights and metrics bit for bit (tolerance 0: the same roundings, each
// gradient widened once as the cast back widens it), and the weights are
// apart from float32's (more than 1e-6 relative in some tensor: autocast
// acted) yet near them (all weights as one vector within 2e-2 relative
// after 4 steps; measured 4.6e-3 with LibTorch 2.6, the tensor furthest
// 4.6e-2).
// With LibTorch 1.13, whose CPU autocast cannot run the model, the log says
// so and the run is float32's to the last bit.
TEST_F(TrainingRuns, Bf16OnTheCpuAutocastsWhereLibTorchCan) {
  const std::string common =
      " --epochs 1 --max-steps-per-epoch 4 --global-batch 16 --batch-per-rank 4 --eval-every 1 ";
  const auto checkpoint = "/checkpoints/epoch-0000.pt";
  const auto float32_dir = train("cpu-fp32", 2, common);
  const auto copies_dir = train("cpu-bf16", 2, common + "--precision bf16");
  const std::string output = last_output_;
  const auto float32 = load_model(float32_dir + checkpoint);
  const auto copies = load_model(copies_dir + checkpoint);
  if (!vqa::model::kCpuAutocastRunsTheModel) {
    EXPECT_NE(output.find("--precision bf16 on the CPU: computing in float32"), std::string::npos)
        << output;
    EXPECT_EQ(differing_tensors(copies, float32), "");
    return;
  }
  EXPECT_NE(output.find("--precision bf16 on the CPU: bfloat16 autocast of the forward"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("weight copies: "), std::string::npos) << output;
  const auto casts_dir =
      train("cpu-bf16-casts", 2, common + "--precision bf16 --weight-copies false");
  EXPECT_EQ(last_output_.find("weight copies: "), std::string::npos) << last_output_;
  EXPECT_EQ(differing_tensors(copies, load_model(casts_dir + checkpoint)), "");
  const auto with_copies = read_metrics(copies_dir);
  const auto with_casts = read_metrics(casts_dir);
  ASSERT_EQ(with_copies.size(), 1u);
  ASSERT_EQ(with_casts.size(), 1u);
  for (const char* key : {"train_loss", "test_loss", "overall"}) {
    EXPECT_EQ(with_copies[0][key].get<double>(), with_casts[0][key].get<double>()) << key;
  }
  const double largest = max_relative_difference(copies, float32);
  const double whole = vqa::testing::whole_relative_difference(copies, float32);
  std::printf(
      "bf16 CPU autocast vs float32 after 4 steps: relative difference %.3g of all weights, "
      "%.3g in the tensor furthest\n",
      whole, largest);
  EXPECT_GT(largest, 1e-6);
  EXPECT_LT(whole, 2e-2);
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
