// The quickstart learns: the tiny preset trained with jobs/configs/quickstart.ini
// on 2 ranks reaches at least 95% overall test accuracy on the synthetic set
// (chance, always answering the most frequent label, is far below).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "process.h"  // run_process, mpirun_prefix, make_temp_dir

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

  std::ifstream metrics(directory + "/run/metrics.jsonl");
  std::string line;
  nlohmann::json last;
  int epochs = 0;
  while (std::getline(metrics, line)) {
    last = nlohmann::json::parse(line);
    ++epochs;
  }
  ASSERT_GT(epochs, 0) << result.output;
  const double overall = last["overall"].get<double>();
  std::printf(
      "quickstart: %d epochs in %.1f s, final overall %.2f%% (open %.2f%%, closed %.2f%%)\n",
      epochs, result.seconds, 100 * overall, 100 * last["open"].get<double>(),
      100 * last["closed"].get<double>());
  EXPECT_GE(overall, 0.95) << result.output;
  std::filesystem::remove_all(directory);
}

}  // namespace
