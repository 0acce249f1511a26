// The step breakdown and its diagnosis, end to end under mpirun: the
// timeline holds every rank's steps, phases and bucket allreduces; a rank
// slowed on purpose is named as the straggler; a data delay is diagnosed as
// data-bound; the small preset with one sample per rank and one big bucket
// is communication-bound.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "process.h"    // run_process, mpirun_prefix, make_temp_dir
#include "run_files.h"  // read_metrics

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class Diagnosis : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("diagnosis");
    const auto result = vqa::testing::run_process(
        std::string(VQA_PREP) + " synth -o " + directory_ +
            "/synth32.h5 --train-questions 256 --test-questions 32 --seed 5 --image-size 32",
        120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }

  // Runs vqa_train on `ranks` ranks; returns the run directory.
  static std::string train(const std::string& name, const std::string& dataset,
                           const std::string& flags, int ranks = 2) {
    const std::string out = directory_ + "/" + name;
    const auto result = vqa::testing::run_process(
        vqa::testing::mpirun_prefix(ranks) + VQA_TRAIN + " --train-data " + directory_ + "/" +
            dataset + ".h5 --out " + out +
            " --threads 1 --progress off --eval-every 0 --save-every 0 --epochs 1 " + flags,
        300);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    output_ = result.output;
    return out;
  }

  static json last_record(const std::string& out) {
    const auto records = vqa::testing::read_metrics(out);
    EXPECT_FALSE(records.empty()) << "no metrics in " << out;
    return records.empty() ? json::object() : records.back();
  }

  // The diagnosis of `rule` in the record, or null.
  static json find_rule(const json& record, const std::string& rule) {
    for (const auto& diagnosis : record.value("diagnosis", json::array())) {
      if (diagnosis["rule"] == rule) return diagnosis;
    }
    return nullptr;
  }

  static inline std::string directory_, output_;
};

TEST_F(Diagnosis, TimelineHoldsEveryRanksStepsPhasesAndAllreduces) {
  const std::string trace = directory_ + "/trace/run.json";
  const auto out = train("timeline", "synth32",
                         "--batch-per-rank 8 --global-batch 16 --max-steps-per-epoch 8 "
                         "--bucket-mb 0.1 --timeline " +
                             trace + " --timeline-first-step 2 --timeline-steps 3");
  std::ifstream file(trace);
  ASSERT_TRUE(file) << "no timeline at " << trace << "\n" << output_;
  const json document = json::parse(file);  // throws, failing the test, when not valid JSON
  ASSERT_TRUE(document.contains("traceEvents"));
  std::set<std::tuple<int, int64_t, std::string>> seen;  // (rank, step, event name)
  std::set<int> named_ranks;
  for (const auto& event : document["traceEvents"]) {
    if (event["ph"] == "M") {
      if (event["name"] == "process_name") named_ranks.insert(event["pid"].get<int>());
      continue;
    }
    ASSERT_EQ(event["ph"], "X") << event.dump();
    EXPECT_GE(event["dur"].get<double>(), 0.0) << event.dump();
    const int64_t step = event["args"]["step"].get<int64_t>();
    EXPECT_GE(step, 2) << "event outside the window: " << event.dump();
    EXPECT_LE(step, 4) << "event outside the window: " << event.dump();
    std::string name = event["name"].get<std::string>();
    if (name.rfind("allreduce bucket", 0) == 0) {
      EXPECT_EQ(event["tid"], 1);
      EXPECT_GT(event["args"]["bytes"].get<int64_t>(), 0);
      name = "allreduce";
    }
    seen.insert({event["pid"].get<int>(), step, name});
  }
  EXPECT_EQ(named_ranks, (std::set<int>{0, 1}));
  for (int rank : {0, 1}) {
    for (int64_t step = 2; step <= 4; ++step) {
      for (const char* name :
           {"data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer", "allreduce"}) {
        EXPECT_TRUE(seen.count({rank, step, name}))
            << "rank " << rank << " step " << step << " " << name;
      }
      EXPECT_TRUE(seen.count({rank, step, "step " + std::to_string(step)}));
    }
  }
  // The epoch record carries the breakdown too.
  const json record = last_record(out);
  for (const char* phase :
       {"data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer"}) {
    EXPECT_TRUE(record["phases"].contains(phase)) << phase;
  }
  EXPECT_EQ(record["per_rank"].size(), 2u);
  EXPECT_GT(record["allreduce_bytes_per_step"].get<int64_t>(), 0);
  EXPECT_TRUE(fs::exists(out + "/diagnosis.json"));
  // Every rank's peak memory, gathered (resident set on the CPU: at least
  // the parameters, their gradients and AdamW's two moments, all counted).
  const auto& memory = record["memory"];
  const int64_t parameters = memory["parameters_bytes"].get<int64_t>();
  EXPECT_GT(parameters, 0);
  EXPECT_EQ(memory["gradients_bytes"].get<int64_t>(), parameters);  // float32 buckets, no bf16
  EXPECT_EQ(memory["optimizer_state_bytes"].get<int64_t>(), 2 * parameters);
  EXPECT_EQ(memory["source"], "resident set (VmHWM)");
  for (const auto& rank : record["per_rank"]) {
    EXPECT_GT(rank["peak_memory_bytes"].get<int64_t>(), 4 * parameters) << rank.dump();
  }
  EXPECT_NE(output_.find("  memory per rank: peak "), std::string::npos) << output_;
}

TEST_F(Diagnosis, RankSlowedOnPurposeIsNamedAsTheStraggler) {
  // Rank 1 spends 60 ms more per step than rank 0 (a tiny step is ~10 ms).
  const auto out = train("straggler", "synth32",
                         "--batch-per-rank 8 --global-batch 16 --max-steps-per-epoch 8 "
                         "--test-slow-rank 1 --test-slow-ms 60");
  const json straggler = find_rule(last_record(out), "straggler");
  ASSERT_FALSE(straggler.is_null()) << output_;
  EXPECT_EQ(straggler["numbers"]["rank"], 1);
  EXPECT_NE(output_.find("diagnosis: straggler: rank 1 "), std::string::npos) << output_;
}

TEST_F(Diagnosis, InjectedDataDelayIsDiagnosedAsDataBound) {
  const auto out = train("databound", "synth32",
                         "--batch-per-rank 8 --global-batch 16 --max-steps-per-epoch 8 "
                         "--test-data-delay-ms 60");
  const json record = last_record(out);
  const json data = find_rule(record, "data-bound");
  ASSERT_FALSE(data.is_null()) << output_;
  EXPECT_GT(data["numbers"]["share"].get<double>(), 0.10);
  EXPECT_NE(output_.find("diagnosis: data-bound: "), std::string::npos) << output_;
  // The delay shows in the data phase, not elsewhere: at least 50 ms of it
  // per step (60 ms injected; the loader's own wait can only add).
  EXPECT_GT(record["phases"]["data_wait"]["mean"].get<double>(), 0.050);
}

TEST_F(Diagnosis, SmallPresetWithOneSamplePerRankAndOneBigBucketIsCommunicationBound) {
  // 11.3 M parameters (45 MB of gradients) in one bucket launched at the end
  // of backward, for one 32x32 image (5 image tokens) of work per rank, on 3
  // ranks: measured 46-47% of the step exposed. At 2 ranks the share was
  // 17-28% on a 2-core machine, too near the 20% threshold for a test; the
  // optimiser and backward's per-parameter work do not shrink with the batch.
  // Those shares were measured with Open MPI's own allreduce, which this run
  // keeps (--mpi-allreduce library): the default ring moves 45 MB over shared
  // memory about 14 times faster, and so hides most of it behind backward.
  const auto out = train("commbound", "synth32",
                         "--preset small --batch-per-rank 1 --global-batch 3 "
                         "--max-steps-per-epoch 4 --bucket-mb 1000 --mpi-allreduce library",
                         /*ranks=*/3);
  const json comm = find_rule(last_record(out), "communication-bound");
  ASSERT_FALSE(comm.is_null()) << output_;
  EXPECT_GT(comm["numbers"]["share"].get<double>(), 0.20);
  EXPECT_NE(output_.find("diagnosis: communication-bound: "), std::string::npos) << output_;
}

}  // namespace
