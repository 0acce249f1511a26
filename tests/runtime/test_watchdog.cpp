// The collective watchdog under real mpirun: rank 1 of the probe stops
// arriving at step 3; rank 0, waiting in that step's allreduce, must name
// rank 1 at half of --comm-timeout and end the job at the deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "process.h"  // run_process, mpirun_prefix

namespace {

using vqa::testing::contains;

const char* probe() { return VQA_FAILURE_PROBE; }

// Exit status of a job the watchdog ends (runtime/watchdog.h).
constexpr int kExitCollectiveTimeout = 124;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Seconds from the probe's "stalls ... at unix time T" line to `end`, or -1.
double seconds_since_stall(const std::string& output, double end) {
  const std::string marker = "at unix time ";
  const size_t at = output.find(marker);
  if (at == std::string::npos) return -1;
  return end - std::atof(output.c_str() + at + marker.size());
}

TEST(Watchdog, StalledRankIsNamedAtHalfTheTimeoutAndTheJobEndsAtTheDeadline) {
  constexpr double kTimeout = 4.0;
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + probe() + " stall --comm-timeout 4 --stall-step 3", 120);
  const double after_stall = seconds_since_stall(result.output, unix_now());
  std::printf("stall job: exit status %d %.2f s after rank 1 stalled (%.2f s in all)\n",
              result.exit_code, after_stall, result.seconds);
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, kExitCollectiveTimeout) << result.output;
  // Rank 0 starts waiting within a step (20 ms) of the stall, so the job
  // cannot end before the deadline; it must end within the deadline plus
  // mpirun's teardown (about 1 s; 10 s allows for a loaded 2-core machine).
  EXPECT_GE(after_stall, kTimeout) << result.output;
  EXPECT_LT(after_stall, kTimeout + 10.0) << result.output;

  const std::string& out = result.output;
  // Steps 0-2 are collectives #1-#3; rank 1 never starts #4.
  EXPECT_TRUE(contains(out, "[vqa] WARNING rank 0/2")) << out;
  EXPECT_TRUE(contains(out, "collective watchdog: allreduce #4 (4096 bytes) at epoch 0 step 3"))
      << out;
  EXPECT_TRUE(contains(out, "half of --comm-timeout 4 s")) << out;
  EXPECT_TRUE(contains(out, "ranks that have not arrived: rank 1 (")) << out;
  EXPECT_TRUE(contains(out, "at epoch 0 step 3 has started 3 collective(s) and has been in none"))
      << out;
  EXPECT_TRUE(contains(out, "[vqa] FATAL rank 0/2")) << out;
  EXPECT_TRUE(contains(out, "did not complete within --comm-timeout 4.0 s")) << out;
  EXPECT_TRUE(contains(out, "Aborting the job.")) << out;
  EXPECT_LT(out.find("WARNING rank 0/2"), out.find("FATAL rank 0/2")) << out;
}

TEST(Watchdog, StalledRankOfThreeIsTheOnlyOneNamed) {
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(3) + probe() + " stall --comm-timeout 3 --stall-rank 2", 120);
  const double after_stall = seconds_since_stall(result.output, unix_now());
  EXPECT_EQ(result.exit_code, kExitCollectiveTimeout) << result.output;
  EXPECT_GE(after_stall, 3.0) << result.output;
  EXPECT_LT(after_stall, 3.0 + 10.0) << result.output;
  EXPECT_TRUE(contains(result.output, "ranks that have not arrived: rank 2 (")) << result.output;
  EXPECT_FALSE(contains(result.output, "arrived: rank 1 (")) << result.output;
  EXPECT_FALSE(contains(result.output, "; rank 1 (")) << result.output;
}

TEST(Watchdog, HealthyJobIsNeverStopped) {
  // 100 steps 20 ms apart under a deadline of 1 s: the watchdog must stay
  // silent and the job must end normally.
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + probe() + " loop --comm-timeout 1 --step-ms 20 --steps 100",
      120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_FALSE(contains(result.output, "collective watchdog")) << result.output;
  EXPECT_FALSE(contains(result.output, "lost rank")) << result.output;
  EXPECT_TRUE(contains(result.output, "step 90")) << result.output;
}

}  // namespace
