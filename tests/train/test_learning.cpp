// The quickstart learns: the tiny preset trained with jobs/configs/quickstart.ini
// on 2 ranks reaches at least 95% overall test accuracy on the synthetic set
// (chance, always answering the most frequent label, is far below).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "process.h"    // run_process, mpirun_prefix, make_temp_dir
#include "run_files.h"  // read_metrics

namespace {

TEST(Learning, TinyPresetReachesNinetyFivePercentOnSyntheticSet) {
  const std::string directory = vqa::testing::make_temp_dir("learn");
  const std::string dataset = directory + "/synth.h5";
  // The quickstart's dataset: vqa_prep synth with its defaults.
  auto result = vqa::testing::run_process(std::string(VQA_PREP) + " synth -o " + dataset, 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  result = vqa::testing::run_process(vqa::testing::mpirun_prefix(2) + VQA_TRAIN +
                                         " --config " VQA_SOURCE_DIR
                                         "/jobs/configs/quickstart.ini --train-data " +
                                         dataset + " --out " + directory + "/run --progress off",
                                     1200);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  const auto records = vqa::testing::read_metrics(directory + "/run");
  const int epochs = static_cast<int>(records.size());
  ASSERT_GT(epochs, 0) << result.output;
  const nlohmann::json& last = records.back();
  const double overall = last["overall"].get<double>();
  std::printf(
      "quickstart: %d epochs in %.1f s, final overall %.2f%% (open %.2f%%, closed %.2f%%)\n",
      epochs, result.seconds, 100 * overall, 100 * last["open"].get<double>(),
      100 * last["closed"].get<double>());
  EXPECT_GE(overall, 0.95) << result.output;
  std::filesystem::remove_all(directory);
}

}  // namespace
