// Units of the step breakdown: quantiles, the phase timer's bookkeeping and
// its cost per step, and each diagnosis rule on hand-made rank summaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "train/step_report.h"  // epoch_report_build, RankSummary, thresholds
#include "train/step_timer.h"   // StepTimer, summarize

namespace {

using vqa::train::Phase;

TEST(StepTimer, SummaryUsesNearestRankQuantiles) {
  std::vector<double> values;
  for (int i = 100; i >= 1; --i) values.push_back(i);
  const auto summary = vqa::train::summarize(values);
  EXPECT_DOUBLE_EQ(summary.mean, 50.5);
  EXPECT_DOUBLE_EQ(summary.p50, 50.0);
  EXPECT_DOUBLE_EQ(summary.p95, 95.0);
  EXPECT_DOUBLE_EQ(vqa::train::summarize({7.0}).p95, 7.0);
}

// When a mark was taken: between two reads of the timer's own clock, one
// just before the call that marks and one just after.
struct Bracket {
  double low = 0.0, high = 0.0;
};

// What a phase from mark `from` to mark `to` can have lasted.
Bracket between(const Bracket& from, const Bracket& to) {
  return {to.low - from.high, to.high - from.low};
}

Bracket operator+(const Bracket& a, const Bracket& b) { return {a.low + b.low, a.high + b.high}; }

TEST(StepTimer, PhasesAddUpToTheStepAndMatchTheirDurations) {
  // Each phase is checked against reads of the same clock taken around its
  // marks, not against the sleeps' nominal lengths: however long the
  // machine's load stretches a sleep, the bracket stretches with it.
  vqa::train::StepTimer timer(torch::kCPU, /*enabled=*/true);
  const auto marked = [&](const auto& mark) {
    Bracket when;
    when.low = timer.host_now();
    mark();
    when.high = timer.host_now();
    return when;
  };
  const Bracket begin = marked([&] { timer.begin_step(3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const Bracket data = marked([&] { timer.end_phase(Phase::kDataWait); });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const Bracket forward = marked([&] { timer.end_phase(Phase::kForward); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // A second micro-step adds to the same phase.
  const Bracket data_again = marked([&] { timer.end_phase(Phase::kDataWait); });
  timer.end_step();
  const auto steps = timer.collect(/*wait=*/true);
  ASSERT_EQ(steps.size(), 1u);
  const auto& step = steps[0];
  EXPECT_EQ(step.step, 3);
  ASSERT_EQ(step.segments.size(), 3u);
  double sum = 0.0;
  for (double seconds : step.seconds) sum += seconds;
  EXPECT_NEAR(sum, step.total(), 1e-9);  // the phases tile the step exactly

  constexpr double kRounding = 1e-9;  // differences of doubles of a few seconds
  const auto expect_within = [&](double value, const Bracket& bracket, const char* what) {
    EXPECT_GE(value, bracket.low - kRounding) << what;
    EXPECT_LE(value, bracket.high + kRounding) << what;
  };
  expect_within(step.begin, begin, "step begin");
  expect_within(step.end, data_again, "step end");
  expect_within(step.seconds[static_cast<int>(Phase::kDataWait)],
                between(begin, data) + between(forward, data_again), "data wait, both micro-steps");
  expect_within(step.seconds[static_cast<int>(Phase::kForward)], between(data, forward), "forward");
  EXPECT_EQ(step.seconds[static_cast<int>(Phase::kBackward)], 0.0);
  // The segments in order, each between its marks.
  const Bracket* ends[] = {&data, &forward, &data_again};
  const Phase phases[] = {Phase::kDataWait, Phase::kForward, Phase::kDataWait};
  const Bracket* previous = &begin;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(step.segments[i].phase, phases[i]) << "segment " << i;
    expect_within(step.segments[i].begin, *previous, "segment begin");
    expect_within(step.segments[i].end, *ends[i], "segment end");
    previous = ends[i];
  }
  // Sleeps last at least as long as asked.
  EXPECT_GE(step.seconds[static_cast<int>(Phase::kDataWait)], 0.040);
  EXPECT_GE(step.seconds[static_cast<int>(Phase::kForward)], 0.005);
  EXPECT_TRUE(timer.collect(/*wait=*/true).empty());
}

TEST(StepTimer, CostsUnderOnePercentOfTheShortestStep) {
  // A training step marks 6 phases (more with accumulation); the tiny preset's
  // step is about 5 ms on a CPU, so 1% of it is 50 us. The cost is the
  // fastest of many short batches: a batch lasts well under a scheduler time
  // slice, so on a loaded machine some batches still run undisturbed, while
  // a cost in every mark (a sleep, a sync, a lock) shows in every batch.
  vqa::train::StepTimer timer(torch::kCPU, /*enabled=*/true);
  constexpr int kBatches = 40;
  constexpr int kStepsPerBatch = 500;
  std::vector<double> per_step;
  for (int batch = 0; batch < kBatches; ++batch) {
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < kStepsPerBatch; ++s) {
      timer.begin_step(s);
      for (int p = 0; p < vqa::train::kPhaseCount; ++p) timer.end_phase(static_cast<Phase>(p));
      timer.end_step();
      if (s % 100 == 99) timer.collect(/*wait=*/false);
    }
    timer.collect(/*wait=*/true);
    per_step.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        kStepsPerBatch);
  }
  const double fastest = *std::min_element(per_step.begin(), per_step.end());
  const auto summary = vqa::train::summarize(per_step);
  std::printf(
      "phase timer cost: %.2f us per step in the fastest batch (%.4f%% of a 5 ms step); "
      "median %.2f us, 95th percentile %.2f us\n",
      1e6 * fastest, 100 * fastest / 0.005, 1e6 * summary.p50, 1e6 * summary.p95);
  EXPECT_LT(fastest, 50e-6);
}

vqa::train::RankSummary rank(int index, double step, double comm, double data, double compute) {
  vqa::train::RankSummary summary;
  summary.rank = index;
  summary.steps = 10;
  summary.step_mean = summary.step_p50 = summary.step_p95 = step;
  summary.phase_mean[static_cast<int>(Phase::kCommExposed)] = comm;
  summary.phase_mean[static_cast<int>(Phase::kDataWait)] = data;
  summary.phase_mean[static_cast<int>(Phase::kForward)] = compute / 2;
  summary.phase_mean[static_cast<int>(Phase::kBackward)] = compute / 2;
  summary.phase_mean[static_cast<int>(Phase::kOptimizer)] = step - comm - data - compute;
  summary.own_mean = step - comm;
  summary.samples_per_second = 16 / step;
  return summary;
}

std::vector<std::string> rules(const vqa::train::EpochReport& report) {
  std::vector<std::string> names;
  for (const auto& diagnosis : report.diagnoses) names.push_back(diagnosis.rule);
  return names;
}

TEST(Diagnose, HealthyRanksGetNoDiagnosis) {
  const auto report = vqa::train::epoch_report_build(
      0, false, {rank(0, 0.100, 0.005, 0.001, 0.090), rank(1, 0.100, 0.006, 0.001, 0.089)}, 1000000,
      4.0, 1000000);
  EXPECT_TRUE(report.diagnoses.empty()) << report.diagnoses.front().message;
  EXPECT_NEAR(report.samples_per_second, 320.0, 1e-9);
}

TEST(Diagnose, EachRuleFiresAboveItsThresholdAndNamesTheRank) {
  // Rank 2 computes 30 ms longer; the others wait for it in the allreduce.
  auto straggler = vqa::train::epoch_report_build(
      0, false,
      {rank(0, 0.130, 0.031, 0.001, 0.090), rank(1, 0.130, 0.030, 0.001, 0.091),
       rank(2, 0.130, 0.001, 0.001, 0.120)},
      1000000, 4.0, 1000000);
  EXPECT_EQ(rules(straggler), (std::vector<std::string>{"straggler"}));
  EXPECT_EQ(straggler.slowest_rank, 2);
  EXPECT_NE(straggler.diagnoses[0].message.find("rank 2 "), std::string::npos);

  const auto comm = vqa::train::epoch_report_build(
      0, false, {rank(0, 0.100, 0.040, 0.001, 0.055), rank(1, 0.100, 0.040, 0.001, 0.055)}, 1000000,
      4.0, 1000000);
  EXPECT_EQ(rules(comm), (std::vector<std::string>{"communication-bound"}));

  const auto data = vqa::train::epoch_report_build(
      0, false, {rank(0, 0.100, 0.002, 0.030, 0.065), rank(1, 0.100, 0.002, 0.030, 0.065)}, 1000000,
      4.0, 1000000);
  EXPECT_EQ(rules(data), (std::vector<std::string>{"data-bound"}));

  const auto small = vqa::train::epoch_report_build(
      0, false, {rank(0, 0.010, 0.001, 0.0005, 0.004), rank(1, 0.010, 0.001, 0.0005, 0.004)},
      1000000, 4.0, 1000000);
  EXPECT_EQ(rules(small), (std::vector<std::string>{"small-batch"}));

  auto slow_eval = rank(1, 0.100, 0.005, 0.001, 0.090);
  slow_eval.eval_seconds = 3.0;
  auto fast_eval = rank(0, 0.100, 0.005, 0.001, 0.090);
  fast_eval.eval_seconds = 2.0;
  const auto eval =
      vqa::train::epoch_report_build(0, false, {fast_eval, slow_eval}, 1000000, 4.0, 1000000);
  EXPECT_EQ(rules(eval), (std::vector<std::string>{"eval-imbalance"}));
}

TEST(Diagnose, BusBandwidthUsesTheFastestRanksAllreduceTime) {
  auto late = rank(0, 0.100, 0.005, 0.001, 0.090);
  late.allreduce_seconds = 0.020;  // waited 19 ms for rank 1 to arrive
  auto last = rank(1, 0.100, 0.005, 0.001, 0.090);
  last.allreduce_seconds = 0.001;
  const auto report = vqa::train::epoch_report_build(0, false, {late, last}, 4000000, 4.0, 4000000);
  // 4 MB in 1 ms on 2 ranks: busbw = 4e6 / 1e-3 x 2(2-1)/2 = 4 GB/s.
  EXPECT_NEAR(report.bus_gbps, 4.0, 1e-9);
}

TEST(Diagnose, MemoryLineNamesThePeakRankAndTheParts) {
  auto small = rank(0, 0.100, 0.005, 0.001, 0.090);
  small.peak_memory_bytes = 300ll << 20;  // 300 MiB
  auto big = rank(1, 0.100, 0.005, 0.001, 0.090);
  big.peak_memory_bytes = 3ll << 30;  // 3 GiB
  auto report = vqa::train::epoch_report_build(0, false, {small, big}, 1000000, 4.0, 1000000);
  report.memory = {"resident set (VmHWM)", 1ll << 30, 1ll << 29, 1ll << 30};
  const auto lines = vqa::train::epoch_report_lines(report);
  const std::string expected =
      "  memory per rank: peak 3.00 GiB (rank 1, lowest 300.0 MiB; resident set (VmHWM)) = "
      "parameters 1.00 GiB + gradient buckets 512.0 MiB + optimizer state 1.00 GiB + activations "
      "and the rest 512.0 MiB";
  EXPECT_NE(std::find(lines.begin(), lines.end(), expected), lines.end())
      << "lines:\n"
      << [&] {
           std::string all;
           for (const auto& line : lines) all += line + "\n";
           return all;
         }();
  const auto json = vqa::train::epoch_report_json(report);
  EXPECT_EQ(json["memory"]["parameters_bytes"].get<int64_t>(), 1ll << 30);
  EXPECT_EQ(json["memory"]["gradients_bytes"].get<int64_t>(), 1ll << 29);
  EXPECT_EQ(json["memory"]["optimizer_state_bytes"].get<int64_t>(), 1ll << 30);
  EXPECT_EQ(json["per_rank"][1]["peak_memory_bytes"].get<int64_t>(), 3ll << 30);

  // Unknown peaks (0) print no line.
  report.ranks[0].peak_memory_bytes = report.ranks[1].peak_memory_bytes = 0;
  for (const auto& line : vqa::train::epoch_report_lines(report)) {
    EXPECT_EQ(line.find("memory per rank"), std::string::npos) << line;
  }
}

}  // namespace
