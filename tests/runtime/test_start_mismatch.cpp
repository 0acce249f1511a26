// Ranks that would train on different inputs are refused before the first
// step, with the difference printed: another configuration value on rank 1,
// another dataset file under the same (relative) path on rank 1 (as with
// node-local copies), another code version on rank 1. Real vqa_train under
// mpirun, each rank with its own arguments, directory and environment.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "process.h"  // run_process, make_temp_dir

namespace fs = std::filesystem;

namespace {

using vqa::testing::contains;

// Bad input ends the job on every rank within this many seconds (mpirun's
// start-up on a loaded 2-core machine is most of it).
constexpr double kMaxSeconds = 30.0;
// fatal_user_error's exit status (runtime/check.h).
constexpr int kExitUserError = 2;

class StartMismatch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("mismatch");
    // Two "nodes" with different files under the same name, and a third
    // with an identical copy of the first.
    for (const auto& [node, seed, questions] : {std::tuple{"a", 7, 96}, std::tuple{"b", 8, 128}}) {
      fs::create_directories(directory_ + "/" + node);
      const auto result =
          vqa::testing::run_process(std::string(VQA_PREP) + " synth -o " + directory_ + "/" + node +
                                        "/synth.h5 --train-questions " + std::to_string(questions) +
                                        " --test-questions 32 --seed " + std::to_string(seed),
                                    120);
      ASSERT_EQ(result.exit_code, 0) << result.output;
    }
    fs::create_directories(directory_ + "/c");
    fs::copy_file(directory_ + "/a/synth.h5", directory_ + "/c/synth.h5");
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }

  // vqa_train on 2 ranks: rank 0 runs `rank0`, rank 1 `rank1` (shell
  // commands such as "cd DIR && exec PROGRAM" or "exec env X=Y PROGRAM"),
  // both with `flags`. One program line, in which a shell picks its rank's
  // command: an MPMD line (-np 1 A : -np 1 B) makes Debian 13's mpirun (Open
  // MPI 5 with PRRTE 3 and an external PMIx) segfault before any rank starts.
  static vqa::testing::ProcessResult run(const std::string& name, const std::string& rank0,
                                         const std::string& rank1, const std::string& flags) {
    const std::string common = std::string(" --out ") + directory_ + "/" + name +
                               " --threads 1 --progress off --epochs 1 --max-steps-per-epoch 2"
                               " --global-batch 16 --batch-per-rank 8 --eval-every 0 " +
                               flags;
    return vqa::testing::run_process(vqa::testing::mpirun_prefix(2) +
                                         "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 0 ]; then " +
                                         rank0 + common + "; else " + rank1 + common + "; fi'",
                                     120);
  }

  static void expect_refused(const vqa::testing::ProcessResult& result, const std::string& name) {
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_EQ(result.exit_code, kExitUserError) << result.output;
    EXPECT_LT(result.seconds, kMaxSeconds) << result.output;
    // Before the first step: no checkpoint, no training log line.
    EXPECT_FALSE(fs::exists(directory_ + "/" + name + "/checkpoints")) << result.output;
    EXPECT_FALSE(contains(result.output, "optimiser steps per epoch")) << result.output;
    // Said once, by rank 0, not once per rank.
    EXPECT_TRUE(contains(result.output, "[vqa] error on rank 0/2")) << result.output;
    EXPECT_FALSE(contains(result.output, "[vqa] error on rank 1/2")) << result.output;
  }

  static inline std::string directory_;
};

TEST_F(StartMismatch, DifferentConfigurationValueIsRefusedWithBothValues) {
  const std::string data = " --train-data " + directory_ + "/a/synth.h5";
  const auto result = run("config", "exec " VQA_TRAIN + data + " --lr 0.001",
                          "exec " VQA_TRAIN + data + " --lr 0.002", "");
  expect_refused(result, "config");
  EXPECT_TRUE(contains(result.output, "the configuration differs between the ranks"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 (")) << result.output;
  EXPECT_TRUE(contains(result.output, "'lr = 0.002' where rank 0 has 'lr = 0.001'"))
      << result.output;
}

TEST_F(StartMismatch, DifferentDatasetFileUnderTheSamePathIsRefusedWithSizes) {
  const auto result = run("files", "cd " + directory_ + "/a && exec " + VQA_TRAIN,
                          "cd " + directory_ + "/b && exec " + VQA_TRAIN, "--train-data synth.h5");
  expect_refused(result, "files");
  EXPECT_TRUE(
      contains(result.output, "the dataset files differ between the ranks; copy the same file"))
      << result.output;
  const std::string size_a = std::to_string(fs::file_size(directory_ + "/a/synth.h5"));
  const std::string size_b = std::to_string(fs::file_size(directory_ + "/b/synth.h5"));
  ASSERT_NE(size_a, size_b);
  EXPECT_TRUE(contains(result.output, "'synth.h5: " + size_b + " bytes, checksum "))
      << result.output;
  EXPECT_TRUE(
      contains(result.output, "where rank 0 has 'synth.h5: " + size_a + " bytes, checksum "))
      << result.output;
}

TEST_F(StartMismatch, IdenticalCopiesOnTwoNodesAreAccepted) {
  // The control: the same bytes in two directories train normally.
  const auto result = run("copies", "cd " + directory_ + "/a && exec " + VQA_TRAIN,
                          "cd " + directory_ + "/c && exec " + VQA_TRAIN, "--train-data synth.h5");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_FALSE(contains(result.output, "differs")) << result.output;
  EXPECT_TRUE(fs::exists(directory_ + "/copies/checkpoints")) << result.output;
}

TEST_F(StartMismatch, DifferentCodeVersionIsRefusedWithBothVersions) {
  const std::string program =
      std::string(VQA_TRAIN) + " --train-data " + directory_ + "/a/synth.h5";
  const auto result = run("version", "exec " + program,
                          "exec env VQA_TEST_CODE_VERSION=v0.0-other-build " + program, "");
  expect_refused(result, "version");
  EXPECT_TRUE(contains(result.output,
                       "the ranks run different builds of vqa-hpc; install the "
                       "same build on every node (rank 0 runs on "))
      << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 (")) << result.output;
  EXPECT_TRUE(contains(result.output, "'v0.0-other-build' where rank 0 has '")) << result.output;
}

}  // namespace
