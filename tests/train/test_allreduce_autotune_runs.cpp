// --mpi-allreduce auto's trials in training, end to end on 3 ranks: the
// first steps try each method, every rank ends with the same choice, the
// cost is bounded and reported, and a run that starts with the stored
// choice (what a resumed run does) tries nothing and trains to the same
// losses: the methods sum the same float32 values in another order, so the
// losses agree to 1e-5 relative (measured here: identical to the digits
// metrics.jsonl keeps).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "process.h"    // run_process, mpirun_prefix, make_temp_dir, contains
#include "run_files.h"  // read_metrics

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kRanks = 3;
constexpr int kSteps = 52;  // a quarter of it (13) holds 3 rounds of 4 candidates

class AllreduceAutotuneRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("autotune");
    const auto result = vqa::testing::run_process(
        std::string(VQA_PREP) + " synth -o " + directory_ +
            "/synth32.h5 --train-questions 320 --test-questions 16 --seed 5 --image-size 32",
        120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }

  // vqa_train on kRanks ranks into `out`; returns its output.
  static std::string train(const std::string& out, const std::string& flags = "") {
    const auto result = vqa::testing::run_process(
        vqa::testing::mpirun_prefix(kRanks) + VQA_TRAIN + " --train-data " + directory_ +
            "/synth32.h5 --out " + out +
            " --threads 1 --progress off --eval-every 0 --save-every 0 --epochs 1"
            " --batch-per-rank 2 --global-batch 6 --bucket-mb 0.25 --max-steps-per-epoch " +
            std::to_string(kSteps) + " " + flags,
        300);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
  }

  static json read_json(const std::string& path) {
    std::ifstream file(path);
    EXPECT_TRUE(file) << "no " << path;
    return file ? json::parse(file) : json::object();
  }

  static inline std::string directory_;
};

TEST_F(AllreduceAutotuneRuns, EveryRankTakesTheSameChoiceAndThePinnedRunTrainsAlike) {
  const std::string tuned = directory_ + "/tuned";
  const std::string output = train(tuned);
  ASSERT_TRUE(vqa::testing::contains(output, "allreduce tuning: steps 0-")) << output;
  const json record = read_json(tuned + "/allreduce_tuning.json");
  ASSERT_TRUE(record.contains("choice")) << record.dump(2);

  // Every candidate tried 3 times after the warm-up step, within the budget.
  const auto& candidates = record["candidates"];
  ASSERT_GE(candidates.size(), 4u) << record.dump(2);
  for (const auto& candidate : candidates) {
    EXPECT_EQ(candidate["steps"], 3) << candidate.dump();
    EXPECT_GT(candidate["step_seconds"].get<double>(), 0.0) << candidate.dump();
  }
  const int64_t spent = record["steps_spent"];
  EXPECT_EQ(spent, 1 + 3 * static_cast<int64_t>(candidates.size()));
  EXPECT_LE(spent, kSteps / 4);
  EXPECT_GE(record["seconds_lost"].get<double>(), 0.0);
  // The chosen candidate is the fastest one.
  double fastest = 1e30;
  std::string fastest_name;
  for (const auto& candidate : candidates) {
    if (candidate["step_seconds"].get<double>() < fastest) {
      fastest = candidate["step_seconds"];
      fastest_name = candidate["name"];
    }
  }
  EXPECT_EQ(record["choice"], fastest_name);
  // The epoch's diagnosis carries the same record.
  const json diagnosis = read_json(tuned + "/diagnosis.json");
  ASSERT_TRUE(diagnosis.value("allreduce_tuning", json()).is_object()) << diagnosis.dump(2);
  EXPECT_EQ(diagnosis["allreduce_tuning"]["choice"], record["choice"]) << diagnosis.dump(2);

  // Every rank's communicator uses the chosen methods.
  std::string chosen;
  for (const auto& [bytes, method] : record["methods"].items()) {
    chosen += (chosen.empty() ? "" : ", ") + method.get<std::string>();
  }
  ASSERT_EQ(record["rank_methods"].size(), static_cast<size_t>(kRanks)) << record.dump(2);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(record["rank_methods"][rank], chosen) << "rank " << rank << "\n" << record.dump(2);
  }

  // A run that finds the stored choice (a resume) uses it from its first
  // step and trains to the same losses as the tuned run.
  const std::string pinned = directory_ + "/pinned";
  fs::create_directories(pinned);
  fs::copy_file(tuned + "/allreduce_tuning.json", pinned + "/allreduce_tuning.json");
  const std::string pinned_output = train(pinned);
  EXPECT_TRUE(vqa::testing::contains(pinned_output, "the choice stored in")) << pinned_output;
  EXPECT_FALSE(vqa::testing::contains(pinned_output, "allreduce tuning: steps")) << pinned_output;
  const auto tuned_metrics = vqa::testing::read_metrics(tuned);
  const auto pinned_metrics = vqa::testing::read_metrics(pinned);
  ASSERT_EQ(tuned_metrics.size(), pinned_metrics.size());
  ASSERT_FALSE(tuned_metrics.empty());
  for (size_t k = 0; k < tuned_metrics.size(); ++k) {
    const double a = tuned_metrics[k]["train_loss"], b = pinned_metrics[k]["train_loss"];
    EXPECT_LT(std::abs(a - b), 1e-5 * std::abs(b)) << "epoch " << k << ": " << a << " vs " << b;
  }
}

TEST_F(AllreduceAutotuneRuns, FixedMethodOrTooShortARunTriesNothing) {
  const std::string fixed = directory_ + "/fixed";
  const std::string output = train(fixed, "--mpi-allreduce ring");
  EXPECT_FALSE(vqa::testing::contains(output, "allreduce tuning")) << output;
  EXPECT_FALSE(fs::exists(fixed + "/allreduce_tuning.json"));
  const std::string short_run = directory_ + "/short";
  const std::string short_output = train(short_run, "--allreduce-tune-steps 8");
  EXPECT_TRUE(vqa::testing::contains(short_output, "allreduce tuning: off (")) << short_output;
  EXPECT_FALSE(fs::exists(short_run + "/allreduce_tuning.json"));
}

}  // namespace
