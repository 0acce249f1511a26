// --mpi-allreduce auto and --bucket-mb 0's trials in training, end to end
// on 3 ranks: the first steps try each method and other bucket sizes, every
// rank ends with the same choice (methods and size), the cost is bounded and
// reported, a run that starts with a stored choice (what a resumed run does)
// tries nothing and lays its buckets out at the stored size, and the runs
// train to the same losses as a run pinned with --bucket-mb and
// --mpi-allreduce: methods and sizes sum the same float32 values in another
// order, so the losses agree to 1e-5 relative (measured here: identical to
// the digits metrics.jsonl keeps). With --shard-optimizer the size stays.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "process.h"    // run_process, mpirun_prefix, make_temp_dir, contains
#include "run_files.h"  // read_metrics

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kRanks = 3;
// A quarter of it (16) holds 3 rounds of 5 candidates, 2 of 7 (4 or 5
// methods, 1 or 2 other bucket sizes).
constexpr int kSteps = 64;

class AllreduceAutotuneRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("autotune");
    const auto result = vqa::testing::run_process(
        std::string(VQA_PREP) + " synth -o " + directory_ +
            "/synth32.h5 --train-questions 400 --test-questions 16 --seed 5 --image-size 32",
        120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }

  // vqa_train on kRanks ranks into `out` (`flags` name --bucket-mb); returns its output.
  static std::string train(const std::string& out, const std::string& flags = "") {
    const auto result = vqa::testing::run_process(
        vqa::testing::mpirun_prefix(kRanks) + VQA_TRAIN + " --train-data " + directory_ +
            "/synth32.h5 --out " + out +
            " --threads 1 --progress off --eval-every 0 --save-every 0 --epochs 1"
            " --batch-per-rank 2 --global-batch 6 --max-steps-per-epoch " +
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

  // Every rank's communicator uses the record's methods and bucket size.
  static void expect_same_on_every_rank(const json& record, double bucket_mb) {
    std::string chosen;
    for (const auto& [bytes, method] : record["methods"].items()) {
      chosen += (chosen.empty() ? "" : ", ") + method.get<std::string>();
    }
    ASSERT_EQ(record["rank_methods"].size(), static_cast<size_t>(kRanks)) << record.dump(2);
    ASSERT_EQ(record["rank_bucket_mb"].size(), static_cast<size_t>(kRanks)) << record.dump(2);
    for (int rank = 0; rank < kRanks; ++rank) {
      EXPECT_EQ(record["rank_methods"][rank], chosen) << "rank " << rank << "\n" << record.dump(2);
      EXPECT_EQ(record["rank_bucket_mb"][rank].get<double>(), bucket_mb) << "rank " << rank << "\n"
                                                                         << record.dump(2);
    }
  }

  static void expect_same_losses(const std::string& a, const std::string& b) {
    const auto a_metrics = vqa::testing::read_metrics(a);
    const auto b_metrics = vqa::testing::read_metrics(b);
    ASSERT_EQ(a_metrics.size(), b_metrics.size());
    ASSERT_FALSE(a_metrics.empty());
    for (size_t k = 0; k < a_metrics.size(); ++k) {
      const double x = a_metrics[k]["train_loss"], y = b_metrics[k]["train_loss"];
      EXPECT_LT(std::abs(x - y), 1e-5 * std::abs(y))
          << a << " vs " << b << ", epoch " << k << ": " << x << " vs " << y;
    }
  }

  static inline std::string directory_;
};

TEST_F(AllreduceAutotuneRuns, EveryRankTakesTheSameChoiceAndThePinnedRunsTrainAlike) {
  const std::string tuned = directory_ + "/tuned";
  const std::string output = train(tuned, "--bucket-mb 0");
  ASSERT_TRUE(vqa::testing::contains(output, "allreduce tuning: steps 0-")) << output;
  const json record = read_json(tuned + "/allreduce_tuning.json");
  ASSERT_TRUE(record.contains("choice")) << record.dump(2);
  EXPECT_TRUE(record["bucket_size_tuned"].get<bool>()) << record.dump(2);

  // The methods at the start-up size and at least one other size, every
  // candidate tried alike (at least 2 rounds) after the 2 warm-up steps,
  // within the budget.
  const auto& candidates = record["candidates"];
  ASSERT_GE(candidates.size(), 5u) << record.dump(2);
  const double start_mb = candidates[0]["bucket_mb"];
  int other_sizes = 0;
  for (const auto& candidate : candidates) other_sizes += candidate["bucket_mb"] != start_mb;
  EXPECT_GE(other_sizes, 1) << record.dump(2);
  const int rounds = candidates[0]["steps"];
  EXPECT_GE(rounds, 2);
  for (const auto& candidate : candidates) {
    EXPECT_EQ(candidate["steps"], rounds) << candidate.dump();
    EXPECT_GT(candidate["step_seconds"].get<double>(), 0.0) << candidate.dump();
  }
  const int64_t spent = record["steps_spent"];
  EXPECT_EQ(spent, 2 + rounds * static_cast<int64_t>(candidates.size()));
  EXPECT_LE(spent, kSteps / 4);
  EXPECT_GE(record["seconds_lost"].get<double>(), 0.0);
  // The chosen candidate is the fastest one, and its size is the one in use.
  double fastest = 1e30;
  json fastest_candidate;
  for (const auto& candidate : candidates) {
    if (candidate["step_seconds"].get<double>() < fastest) {
      fastest = candidate["step_seconds"];
      fastest_candidate = candidate;
    }
  }
  EXPECT_EQ(record["choice"], fastest_candidate["name"]);
  EXPECT_EQ(record["bucket_mb"], fastest_candidate["bucket_mb"]);
  // The epoch's diagnosis carries the same record.
  const json diagnosis = read_json(tuned + "/diagnosis.json");
  ASSERT_TRUE(diagnosis.value("allreduce_tuning", json()).is_object()) << diagnosis.dump(2);
  EXPECT_EQ(diagnosis["allreduce_tuning"]["choice"], record["choice"]) << diagnosis.dump(2);
  EXPECT_EQ(diagnosis["allreduce_tuning"]["bucket_mb"], record["bucket_mb"]) << diagnosis.dump(2);
  expect_same_on_every_rank(record, record["bucket_mb"]);

  // Pinned to the chosen size and method family from the first step
  // (--mpi-allreduce names ring or library; the methods agree to rounding).
  std::ostringstream pinned_flags;
  pinned_flags.precision(17);
  const std::string method = record["methods"].empty()
                                 ? std::string("library")
                                 : record["methods"].begin()->get<std::string>();
  pinned_flags << "--bucket-mb " << record["bucket_mb"].get<double>() << " --mpi-allreduce "
               << (method.rfind("ring", 0) == 0 ? "ring" : "library");
  const std::string pinned = directory_ + "/pinned";
  const std::string pinned_output = train(pinned, pinned_flags.str());
  EXPECT_FALSE(vqa::testing::contains(pinned_output, "allreduce tuning")) << pinned_output;
  expect_same_losses(tuned, pinned);

  // A resumed run (--bucket-mb 0, the record in its directory) lays its
  // buckets out at the stored size from its first step, on every rank, and
  // tries nothing: here a size none of the candidates had.
  json stored = record;
  stored["bucket_mb"] = 0.3;
  const std::string resumed = directory_ + "/resumed";
  fs::create_directories(resumed);
  std::ofstream(resumed + "/allreduce_tuning.json") << stored.dump(2);
  const std::string resumed_output = train(resumed, "--bucket-mb 0");
  EXPECT_TRUE(vqa::testing::contains(resumed_output, "(buckets 0.3 MiB), the choice stored in"))
      << resumed_output;
  EXPECT_FALSE(vqa::testing::contains(resumed_output, "allreduce tuning: steps")) << resumed_output;
  const json resumed_diagnosis = read_json(resumed + "/diagnosis.json");
  ASSERT_TRUE(resumed_diagnosis.value("allreduce_tuning", json()).is_object());
  expect_same_on_every_rank(resumed_diagnosis["allreduce_tuning"], 0.3);
  expect_same_losses(tuned, resumed);
}

TEST_F(AllreduceAutotuneRuns, FixedMethodOrTooShortARunTriesNothing) {
  const std::string fixed = directory_ + "/fixed";
  const std::string output = train(fixed, "--bucket-mb 0.25 --mpi-allreduce ring");
  EXPECT_FALSE(vqa::testing::contains(output, "allreduce tuning")) << output;
  EXPECT_FALSE(fs::exists(fixed + "/allreduce_tuning.json"));
  const std::string short_run = directory_ + "/short";
  const std::string short_output = train(short_run, "--bucket-mb 0.25 --allreduce-tune-steps 8");
  EXPECT_TRUE(vqa::testing::contains(short_output, "allreduce tuning: off (")) << short_output;
  EXPECT_FALSE(fs::exists(short_run + "/allreduce_tuning.json"));
}

TEST_F(AllreduceAutotuneRuns, ShardedOptimizerKeepsTheBucketSize) {
  const std::string sharded = directory_ + "/sharded";
  const std::string output = train(sharded, "--bucket-mb 0 --shard-optimizer");
  EXPECT_TRUE(vqa::testing::contains(output, "under --shard-optimizer")) << output;
  const json record = read_json(sharded + "/allreduce_tuning.json");
  ASSERT_TRUE(record.contains("candidates")) << record.dump(2);
  EXPECT_FALSE(record["bucket_size_tuned"].get<bool>());
  for (const auto& candidate : record["candidates"]) {
    EXPECT_EQ(candidate["bucket_mb"], record["bucket_mb"]) << candidate.dump();
  }
  expect_same_on_every_rank(record, record["bucket_mb"]);
}

}  // namespace
