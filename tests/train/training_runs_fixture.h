// The fixture of the vqa_train runs under mpirun (test_training_runs.cpp,
// test_training_equivalence.cpp): a small synthetic set, stored images and
// source images, made once per program, and train(), which runs the job on it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "process.h"  // run_process, mpirun_prefix, make_temp_dir

namespace vqa::testing {

class TrainingRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = make_temp_dir("train");
    dataset_ = directory_ + "/synth.h5";
    const auto result = run_process(std::string(VQA_PREP) + " synth -o " + dataset_ +
                                        " --train-questions 512 --test-questions 128 --seed 7",
                                    120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    // The same questions with source images of 40 px (stored images: their resize to 32).
    augmented_dataset_ = directory_ + "/synth-sources.h5";
    const auto sources =
        run_process(std::string(VQA_PREP) + " synth -o " + augmented_dataset_ +
                        " --train-questions 512 --test-questions 128 --seed 7 --source-size 40",
                    120);
    ASSERT_EQ(sources.exit_code, 0) << sources.output;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(directory_); }

  // Runs vqa_train on `ranks` ranks with common flags plus `flags`, into <dir>/<name>.
  static std::string train(const std::string& name, int ranks, const std::string& flags,
                           const std::string& dataset = "") {
    const std::string out = directory_ + "/" + name;
    const auto result = run_process(mpirun_prefix(ranks) + VQA_TRAIN + " --train-data " +
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

}  // namespace vqa::testing
