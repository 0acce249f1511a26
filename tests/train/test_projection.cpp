// The projection model (src/train/projection.h): the ring cost, buckets
// served in launch order from the moment each is ready, what is left after
// backward exposed; the remedies' profile changes; the JSON round trip that
// vqa_project reads; fabric names. Exact arithmetic, tolerance 1e-12 s.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "train/projection.h"
#include "train/step_report.h"

namespace {

using vqa::train::BucketProfile;
using vqa::train::Fabric;
using vqa::train::StepProfile;

constexpr double kTolerance = 1e-12;

// forward 100 ms, backward 200 ms, optimiser 20 ms; two 10 MB buckets ready
// 150 ms and 50 ms before the end of backward.
StepProfile two_bucket_profile() {
  StepProfile profile;
  profile.forward = 0.100;
  profile.backward = 0.200;
  profile.optimizer = 0.020;
  profile.last_backward = 0.200;
  profile.samples_per_rank_step = 16;
  profile.buckets = {BucketProfile{10e6, 0.150}, BucketProfile{10e6, 0.050}};
  return profile;
}

TEST(Projection, OneRankIsTheMeasuredComputeWithNoCommunication) {
  const auto step = vqa::train::project_step(two_bucket_profile(), Fabric{"f", 0.1, 1e-3, ""}, 1);
  EXPECT_NEAR(step.step_seconds, 0.320, kTolerance);
  EXPECT_EQ(step.comm_seconds, 0.0);
  EXPECT_NEAR(step.samples_per_second, 16 / 0.320, 1e-9);
  EXPECT_EQ(step.bottleneck, "compute");
}

TEST(Projection, BucketsQueueOnTheLinkAndTheRestIsExposed) {
  // 2 ranks at 0.1 GB/s: a 10 MB bucket takes 2(1)/2 x 10e6 / 1e8 = 100 ms
  // plus 2 x 1 ms latency. Bucket 0 from 50 ms to 152 ms, bucket 1 waits for
  // it (ready at 150 ms) and runs to 254 ms: 54 ms after backward's 200 ms.
  const auto step = vqa::train::project_step(two_bucket_profile(), Fabric{"f", 0.1, 1e-3, ""}, 2);
  EXPECT_NEAR(step.comm_seconds, 0.204, kTolerance);
  EXPECT_NEAR(step.exposed_seconds, 0.054, kTolerance);
  EXPECT_NEAR(step.step_seconds, 0.374, kTolerance);
  EXPECT_NEAR(step.efficiency, 0.320 / 0.374, 1e-12);
  EXPECT_EQ(step.bottleneck, "link bandwidth");
}

TEST(Projection, RingCostGrowsAsTwoNMinusOneOverN) {
  // 8 ranks: 2 x 7 / 8 x 10 MB / 1 GB/s = 17.5 ms per bucket, 14 latencies of 10 us.
  const auto step = vqa::train::project_step(two_bucket_profile(), Fabric{"f", 1.0, 1e-5, ""}, 8);
  EXPECT_NEAR(step.comm_seconds, 2 * (0.0175 + 14e-5), kTolerance);
  EXPECT_EQ(step.exposed_seconds, 0.0);
  const auto latency_bound =
      vqa::train::project_step(two_bucket_profile(), Fabric{"f", 1000.0, 5e-3, ""}, 64);
  EXPECT_EQ(latency_bound.bottleneck, "link latency");
  const auto rows =
      vqa::train::project_scaling(two_bucket_profile(), Fabric{"f", 1.0, 1e-5, ""}, 16);
  ASSERT_EQ(rows.size(), 5u);  // 1, 2, 4, 8, 16
  EXPECT_EQ(rows.back().ranks, 16);
}

TEST(Projection, AllreduceCpuTimeDuringBackwardLengthensBackward) {
  // 1000 us of CPU per MB of traffic at 2 ranks (traffic = the buffer) and
  // 0.1 GB/s: in the first schedule bucket 0 moves from 50 to 152 ms, all of
  // it inside the 200 ms backward, bucket 1 from 152 to 254 ms, 48 of its
  // 102 ms inside. That CPU time lengthens backward.
  Fabric fabric{"f", 0.1, 1e-3, "", 1e-9};
  const auto step = vqa::train::project_step(two_bucket_profile(), fabric, 2);
  const double in_backward = 10e6 + 10e6 * 0.048 / 0.102;
  const double backward = 0.200 + 1e-9 * in_backward;
  // The second schedule, ready times stretched by backward / 0.2.
  const double stretch = backward / 0.200;
  const double end0 = 0.050 * stretch + 0.102;
  const double end1 = std::max(end0, 0.150 * stretch) + 0.102;
  EXPECT_NEAR(step.step_seconds, 0.320 + (backward - 0.200) + std::max(0.0, end1 - backward),
              kTolerance);
  EXPECT_GT(step.step_seconds, 0.374);  // slower than without the CPU cost
}

TEST(Projection, RemediesChangeTheProfileAsStated) {
  const auto profile = two_bucket_profile();
  const auto half = vqa::train::profile_with_bytes_scaled(profile, 0.5);
  EXPECT_EQ(half.buckets[0].bytes, 5e6);
  const auto twice = vqa::train::profile_with_accumulation(profile, 2);
  EXPECT_NEAR(twice.compute(), 2 * 0.300 + 0.020, kTolerance);
  EXPECT_EQ(twice.samples_per_rank_step, 32);
  EXPECT_NEAR(twice.last_backward, 0.200, kTolerance);
  // 10 MB buckets cut to 5 MB: launches spread evenly back to the start of
  // backward (200 ms before its end) for the first bucket.
  const auto cut = vqa::train::profile_with_bucket_bytes(profile, 5e6);
  ASSERT_EQ(cut.buckets.size(), 4u);
  EXPECT_NEAR(cut.buckets[0].ready_before_end, 0.175, kTolerance);
  EXPECT_NEAR(cut.buckets[1].ready_before_end, 0.150, kTolerance);
  EXPECT_NEAR(cut.buckets[2].ready_before_end, 0.100, kTolerance);
  EXPECT_NEAR(cut.buckets[3].ready_before_end, 0.050, kTolerance);
  // Merged: 15 MB buckets end at 15 MB (halfway between the launches at
  // 10 and 20 MB) and at 20 MB.
  const auto merged = vqa::train::profile_with_bucket_bytes(profile, 15e6);
  ASSERT_EQ(merged.buckets.size(), 2u);
  EXPECT_NEAR(merged.buckets[0].bytes, 15e6, 1e-6);
  EXPECT_NEAR(merged.buckets[0].ready_before_end, 0.100, kTolerance);
  EXPECT_NEAR(merged.buckets[1].bytes, 5e6, 1e-6);
  EXPECT_NEAR(merged.buckets[1].ready_before_end, 0.050, kTolerance);
  // Auto size: 20 ms of the bus bandwidth, between 1 and 25 MiB.
  EXPECT_NEAR(vqa::train::auto_bucket_bytes(Fabric{"f", 0.117, 0, ""}), 2.2 * 1024 * 1024, 1e-6);
  EXPECT_NEAR(vqa::train::auto_bucket_bytes(Fabric{"f", 0.01, 0, ""}), 1.0 * 1024 * 1024, 1e-6);
  EXPECT_NEAR(vqa::train::auto_bucket_bytes(Fabric{"f", 450, 0, ""}), 25.0 * 1024 * 1024, 1e-6);
}

TEST(Projection, JsonRoundTripAndFabricNames) {
  const auto profile = two_bucket_profile();
  const Fabric fabric{"f", 0.1, 1e-3, "test"};
  const auto json =
      vqa::train::projection_json(profile, fabric, vqa::train::project_scaling(profile, fabric, 4));
  ASSERT_EQ(json.at("rows").size(), 3u);
  const auto back = vqa::train::step_profile_from_json(json.at("profile"));
  EXPECT_EQ(back.buckets.size(), 2u);
  EXPECT_NEAR(vqa::train::project_step(back, fabric, 2).step_seconds, 0.374, kTolerance);
  EXPECT_THROW(vqa::train::step_profile_from_json(nlohmann::json::object()), std::runtime_error);
  EXPECT_TRUE(vqa::train::fabric_from_text("ib-ndr").has_value());
  const auto given = vqa::train::fabric_from_text("12.5:5");
  ASSERT_TRUE(given.has_value());
  EXPECT_EQ(given->bus_gbps, 12.5);
  EXPECT_NEAR(given->latency_seconds, 5e-6, 1e-18);
  EXPECT_FALSE(vqa::train::fabric_from_text("fast").has_value());
  EXPECT_FALSE(vqa::train::fabric_from_text("0:5").has_value());
  EXPECT_FALSE(vqa::train::fabric_from_text("1:2x").has_value());
  EXPECT_FALSE(vqa::train::fabric_from_text("1:2:3:4:5").has_value());
  EXPECT_FALSE(vqa::train::fabric_from_text("1:2:3:0").has_value());
  const auto with_cpu = vqa::train::fabric_from_text("0.119:20:900");
  ASSERT_TRUE(with_cpu.has_value());
  EXPECT_NEAR(with_cpu->cpu_seconds_per_byte, 900e-12, 1e-24);
  EXPECT_EQ(with_cpu->bus_gbps_in_backward, 0.0);
  const auto loaded = vqa::train::fabric_from_text("0.119:20:900:0.085");
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->bus_gbps, 0.119);
  EXPECT_EQ(loaded->bus_gbps_in_backward, 0.085);
  EXPECT_EQ(vqa::train::projection_json(profile, *loaded, {})
                .at("fabric")
                .at("bus_gbps_in_backward")
                .get<double>(),
            0.085);
}

TEST(Projection, TheLinkRunsAtItsBackwardRateUntilBackwardEnds) {
  // Half the bus bandwidth while backward computes (0.05 against 0.1 GB/s):
  // a bucket's 102 ms (100 ms of bytes, 2 latencies of 1 ms) take twice as
  // long before backward ends at 200 ms. Bucket 0 (ready at 50 ms) does 75
  // ms of its work in the 150 ms left and the other 27 ms after: 50 -> 227
  // ms. Bucket 1 (ready at 150 ms) waits for it and runs at the idle rate:
  // 227 -> 329 ms, 129 ms exposed.
  const Fabric fabric{"f", 0.1, 1e-3, "", 0.0, 0.05};
  const auto step = vqa::train::project_step(two_bucket_profile(), fabric, 2);
  EXPECT_NEAR(step.comm_seconds, 0.177 + 0.102, kTolerance);
  EXPECT_NEAR(step.exposed_seconds, 0.129, kTolerance);
  EXPECT_NEAR(step.step_seconds, 0.320 + 0.129, kTolerance);
  // With 1000 us of CPU per MB as well: the first schedule moves 75/102 of
  // bucket 0 inside backward (bucket 1 starts after it), which lengthens
  // backward; the second schedule, ready times stretched, again at half
  // speed until the longer backward ends.
  const Fabric with_cpu{"f", 0.1, 1e-3, "", 1e-9, 0.05};
  const double backward = 0.200 + 1e-9 * 10e6 * 0.075 / 0.102;
  const double stretch = backward / 0.200;
  const auto transfer_end = [&](double start) {
    const double before = std::clamp((backward - start) / 2.0, 0.0, 0.102);
    return start + 2.0 * before + (0.102 - before);
  };
  const double end0 = transfer_end(0.050 * stretch);
  const double end1 = transfer_end(std::max(end0, 0.150 * stretch));
  EXPECT_NEAR(vqa::train::project_step(two_bucket_profile(), with_cpu, 2).step_seconds,
              0.320 + (backward - 0.200) + std::max(0.0, end1 - backward), kTolerance);
  // The same rate in and after backward is the plain model (0.374 s above).
  const Fabric same{"f", 0.1, 1e-3, "", 0.0, 0.1};
  EXPECT_NEAR(vqa::train::project_step(two_bucket_profile(), same, 2).step_seconds, 0.374,
              kTolerance);
}

// The wait for the slowest rank: the expected maximum of n draws from the
// run's per-step compute times. Uniform steps on [0.5, 1.5] x mean have
// E[max of n] = 0.5 + n / (n + 1) (order statistics of the uniform
// distribution, independent of the code); 10,001 evenly spaced steps kept as
// 65 points approximate it within 1e-2. Equal steps never wait.
TEST(Projection, EveryStepWaitsForTheSlowestRanksCompute) {
  std::vector<double> seconds;
  for (int i = 0; i <= 10000; ++i) seconds.push_back(0.5 + i / 10000.0);
  const auto spread = vqa::train::compute_spread_of(seconds);
  ASSERT_EQ(spread.size(), vqa::train::kSpreadPoints);
  EXPECT_NEAR(spread.front(), 0.5, 1e-12);
  EXPECT_NEAR(spread.back(), 1.5, 1e-12);
  EXPECT_EQ(vqa::train::slowest_of(spread, 1), 1.0);
  for (int n : {2, 4, 64}) {
    EXPECT_NEAR(vqa::train::slowest_of(spread, n), 0.5 + n / (n + 1.0), 1e-2) << n << " ranks";
  }
  EXPECT_EQ(vqa::train::slowest_of(vqa::train::compute_spread_of({0.3, 0.3, 0.3}), 8), 1.0);
  EXPECT_TRUE(vqa::train::compute_spread_of({0.3}).empty());

  // In the step: 320 ms of compute x (E[max of 2] - 1) added, nothing at 1 rank.
  auto profile = two_bucket_profile();
  profile.compute_spread = spread;
  const Fabric fabric{"f", 0.1, 1e-3, ""};
  const double expected_wait = (vqa::train::slowest_of(spread, 2) - 1.0) * 0.320;
  const auto two = vqa::train::project_step(profile, fabric, 2);
  EXPECT_NEAR(two.straggler_seconds, expected_wait, kTolerance);
  EXPECT_NEAR(two.step_seconds, 0.374 + expected_wait, kTolerance);
  EXPECT_EQ(vqa::train::project_step(profile, fabric, 1).straggler_seconds, 0.0);
  const auto back = vqa::train::step_profile_from_json(
      vqa::train::projection_json(profile, fabric, {two}).at("profile"));
  EXPECT_EQ(back.compute_spread, spread);
}

// A 2-rank report shaped like a run on a slow link: 45 MB of gradients in
// two buckets, 380 ms of allreduce, 250 ms of it exposed after backward.
vqa::train::EpochReport slow_link_report(bool bf16_on, double rank1_cpu_share) {
  std::vector<vqa::train::RankSummary> ranks(2);
  for (int r = 0; r < 2; ++r) {
    auto& rank = ranks[r];
    rank.rank = r;
    rank.steps = 8;
    rank.phase_mean = {0.001, 0.0, 0.100, 0.200, 0.250, 0.012};
    rank.step_mean = rank.step_p50 = rank.step_p95 = 0.563;
    rank.own_mean = 0.563 - 0.250;
    rank.samples_per_second = 16 / 0.563;
    rank.allreduce_seconds = 0.380;
    rank.compute_cpu_share = r == 1 ? rank1_cpu_share : 0.99;
  }
  vqa::train::RemedySettings settings;
  settings.bf16_allreduce = bf16_on;
  settings.bucket_mb = 25;
  settings.batch_per_rank = 16;
  settings.global_batch = 32;
  settings.accumulation_steps = 1;
  const double wire = bf16_on ? 0.5 : 1.0;
  return vqa::train::epoch_report_build(
      /*epoch=*/0, /*gpu=*/false, ranks, static_cast<int64_t>(45e6 * wire), 0.12, 25000000,
      settings, {BucketProfile{25e6 * wire, 0.110}, BucketProfile{20e6 * wire, 0.0}});
}

const vqa::train::Diagnosis* find_rule(const vqa::train::EpochReport& report,
                                       const std::string& rule) {
  for (const auto& diagnosis : report.diagnoses) {
    if (diagnosis.rule == rule) return &diagnosis;
  }
  return nullptr;
}

TEST(DiagnosisRemedies, NamesOnlyWhatIsOffWithItsExpectedGain) {
  for (const bool bf16_on : {false, true}) {
    const auto report = slow_link_report(bf16_on, 0.99);
    const auto* comm = find_rule(report, "communication-bound");
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->message.find("--bf16-allreduce") != std::string::npos, !bf16_on)
        << comm->message;
    const auto& remedies = comm->numbers.at("remedies");
    ASSERT_FALSE(remedies.empty()) << comm->message;
    for (const auto& remedy : remedies) {
      // Every remedy named is priced and worth at least 5%.
      EXPECT_GE(remedy.at("gain").get<double>(), 1.0 + vqa::train::kMinimumGainShare)
          << comm->message;
      EXPECT_NE(remedy.at("option").get<std::string>().find("--"), std::string::npos);
    }
    EXPECT_EQ(find_rule(report, "compute-contention"), nullptr);
  }
  // bfloat16 halves 380 ms of allreduce: the model exposes much less.
  const auto report = slow_link_report(false, 0.99);
  const auto& first = find_rule(report, "communication-bound")->numbers.at("remedies").at(0);
  EXPECT_EQ(first.at("option"), "--bf16-allreduce");
  EXPECT_LT(first.at("exposed_seconds").get<double>(), 0.150);
}

TEST(DiagnosisRemedies, ContentionNamesTheRankWhoseComputeThreadLostItsCore) {
  // Rank 1's compute thread ran half of its 300 ms of forward + backward:
  // 150 ms lost, well over 5% of the 563 ms step.
  const auto report = slow_link_report(false, 0.5);
  const auto* contention = find_rule(report, "compute-contention");
  ASSERT_NE(contention, nullptr);
  EXPECT_EQ(contention->numbers.at("rank"), 1);
  EXPECT_NEAR(contention->numbers.at("lost_seconds").get<double>(), 0.150, 1e-9);
  EXPECT_NE(contention->message.find("rank 1's compute thread ran 50%"), std::string::npos)
      << contention->message;
  // Under 5% of the step lost: silent.
  EXPECT_EQ(find_rule(slow_link_report(false, 0.95), "compute-contention"), nullptr);
}

}  // namespace
