// The collective watchdog under real mpirun: rank 1 of the probe stops
// arriving at step 3; rank 0, waiting in that step's allreduce, must name
// rank 1 at half of --comm-timeout and end the job at the deadline.
//
// The times come from the job itself, not from when mpirun returns (its
// teardown would pad them by a second or more): each waiting rank prints the
// unix time at which it enters the stalled step's allreduce, and a clock
// thread in every rank prints the unix time every 20 ms on stderr, where the
// watchdog writes too. One process's stderr reaches the output in order, so
// the watchdog's warning lies between the clock line before it and the one
// after it, and the FATAL line after the last clock line the rank printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "process.h"  // run_process, mpirun_prefix

namespace {

using vqa::testing::contains;

const char* probe() { return VQA_FAILURE_PROBE; }

// Exit status of a job the watchdog ends (runtime/watchdog.h).
constexpr int kExitCollectiveTimeout = 124;
// How often the watchdog thread looks at a deadline (runtime/watchdog.cpp:
// every 0.1 s, or timeout/40 when that is shorter).
constexpr double kWatchdogWakeSeconds = 0.1;
// The probe's clock period (--clock-ms).
constexpr int kClockMs = 20;
// Added to the lateness this run's own clock shows: a warning or deadline
// this much later than the clock's worst delay is the watchdog's doing. A
// watchdog firing at 3/4 instead of 1/2 of an 8 s timeout is 2 s off.
constexpr double kMargin = 0.25;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The output without the probe's clock lines, for failure messages.
std::string without_clock_lines(const std::string& output) {
  std::istringstream lines(output);
  std::string kept, line;
  while (std::getline(lines, line)) {
    if (!contains(line, " clock ")) kept += line + "\n";
  }
  return kept;
}

// Where in the output and when one rank's lines of interest appeared.
struct RankTimes {
  double entered = -1;  // unix time it entered the stalled step's allreduce
  std::vector<std::pair<size_t, double>> clocks;  // (offset in the output, unix time)
  size_t warning = std::string::npos;             // offset of its watchdog WARNING
  size_t fatal = std::string::npos;               // offset of its watchdog FATAL
  double waited = -1;                             // the "has waited X s" its warning printed

  // Unix time of the last clock line before `offset` / the first after it, or -1.
  double clock_before(size_t offset) const {
    double time = -1;
    for (const auto& [at, when] : clocks) {
      if (at < offset) time = when;
    }
    return time;
  }
  double clock_after(size_t offset) const {
    for (const auto& [at, when] : clocks) {
      if (at > offset) return when;
    }
    return -1;
  }
  // The longest interval between two clock lines after `entered`: how late
  // this run's load made a thread of this rank.
  double longest_clock_gap() const {
    double longest = 0, previous = -1;
    for (const auto& [at, when] : clocks) {
      if (previous >= entered) longest = std::max(longest, when - previous);
      previous = when;
    }
    return longest;
  }
};

RankTimes rank_times(const std::string& output, int rank, int world) {
  RankTimes times;
  const std::string me = "probe: rank " + std::to_string(rank);
  const std::string entered = me + " enters step ";
  const std::string clock = me + " clock ";
  size_t at = 0;
  for (size_t end; at < output.size(); at = end + 1) {
    end = output.find('\n', at);
    if (end == std::string::npos) end = output.size();
    const std::string line = output.substr(at, end - at);
    if (line.rfind(clock, 0) == 0) {
      times.clocks.emplace_back(at, std::atof(line.c_str() + clock.size()));
    } else if (line.rfind(entered, 0) == 0) {
      times.entered = std::atof(line.c_str() + line.find("unix time ") + 10);
    }
  }
  const std::string label = " rank " + std::to_string(rank) + "/" + std::to_string(world) + " ";
  times.warning = output.find("[vqa] WARNING" + label);
  times.fatal = output.find("[vqa] FATAL" + label);
  if (times.warning != std::string::npos) {
    const size_t waited = output.find("has waited ", times.warning);
    if (waited != std::string::npos) times.waited = std::atof(output.c_str() + waited + 11);
  }
  return times;
}

// Checks that `rank` warned at half of `timeout` and, if it printed the
// FATAL line, that it did so at `timeout`, all timed from when it entered
// the allreduce that never completes.
void expect_timed_by_the_watchdog(const std::string& output, int rank, int world, double timeout) {
  SCOPED_TRACE("rank " + std::to_string(rank));
  const RankTimes times = rank_times(output, rank, world);
  const std::string shown = without_clock_lines(output);
  ASSERT_GT(times.entered, 0) << shown;
  ASSERT_NE(times.warning, std::string::npos) << shown;
  ASSERT_FALSE(times.clocks.empty()) << output;
  // The rank's own threads were at most this late on this run.
  const double late = kWatchdogWakeSeconds + times.longest_clock_gap() + kMargin;
  const double warned_after = times.clock_after(times.warning) - times.entered;
  const double warned_before = times.clock_before(times.warning) - times.entered;
  std::printf(
      "rank %d: warned between %.3f and %.3f s after entering the allreduce (\"has waited "
      "%.1f s\"); longest clock gap %.3f s\n",
      rank, warned_before, warned_after, times.waited, times.longest_clock_gap());
  // The clock line after the warning was printed after it, so this bound
  // holds however loaded the machine is.
  EXPECT_GE(warned_after, timeout / 2) << shown;
  EXPECT_LE(warned_before, timeout / 2 + late) << shown;
  // What the warning says it waited is what it did (printed to 0.1 s).
  EXPECT_GE(times.waited, timeout / 2 - 0.05) << shown;
  EXPECT_LE(times.waited, warned_after + 0.05) << shown;
  if (times.fatal == std::string::npos) return;
  ASSERT_LT(times.warning, times.fatal) << shown;
  // The process ends at the FATAL line, so no clock line follows it; the
  // last one before it is at most one clock period plus the load's delay
  // earlier.
  const double ended_before = times.clock_before(times.fatal) - times.entered;
  std::printf(
      "rank %d: ended the job %.3f s or a clock period later after entering the allreduce\n", rank,
      ended_before);
  EXPECT_GE(ended_before, timeout - kClockMs / 1000.0 - times.longest_clock_gap() - kMargin)
      << shown;
  EXPECT_LE(ended_before, timeout + late) << shown;
}

TEST(Watchdog, StalledRankIsNamedAtHalfTheTimeoutAndTheJobEndsAtTheDeadline) {
  // 8 s: the watchdog waits min(1 s, timeout/8) for the stalled rank's
  // answer, and a second is what a loaded machine needs to answer surely.
  constexpr double kTimeout = 8.0;
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + probe() +
          " stall --comm-timeout 8 --stall-step 3 --clock-ms " + std::to_string(kClockMs),
      120);
  const double returned = unix_now();
  const std::string out = without_clock_lines(result.output);
  std::printf(
      "stall job: exit status %d, mpirun returned %.2f s after rank 0 entered the "
      "allreduce (%.2f s in all)\n",
      result.exit_code, returned - rank_times(result.output, 0, 2).entered, result.seconds);
  EXPECT_FALSE(result.timed_out) << out;
  EXPECT_EQ(result.exit_code, kExitCollectiveTimeout) << out;
  expect_timed_by_the_watchdog(result.output, 0, 2, kTimeout);
  // mpirun itself returns within the deadline plus its teardown (about 1 s;
  // 10 s for a loaded 2-core machine).
  EXPECT_LT(returned - rank_times(result.output, 0, 2).entered, kTimeout + 10.0) << out;

  // Steps 0-2 are collectives #1-#3; rank 1 never starts #4.
  EXPECT_TRUE(contains(out, "[vqa] WARNING rank 0/2")) << out;
  EXPECT_TRUE(contains(out, "collective watchdog: allreduce #4 (4096 bytes) at epoch 0 step 3"))
      << out;
  EXPECT_TRUE(contains(out, "half of --comm-timeout 8 s")) << out;
  EXPECT_TRUE(contains(out, "ranks that have not arrived: rank 1 (")) << out;
  EXPECT_TRUE(contains(out, "at epoch 0 step 3 has started 3 collective(s) and has been in none"))
      << out;
  EXPECT_TRUE(contains(out, "[vqa] FATAL rank 0/2")) << out;
  EXPECT_TRUE(contains(out, "did not complete within --comm-timeout 8.0 s")) << out;
  EXPECT_TRUE(contains(out, "Aborting the job.")) << out;
}

TEST(Watchdog, StalledRankOfThreeIsTheOnlyOneNamed) {
  constexpr double kTimeout = 8.0;  // as above: a second for every answer
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(3) + probe() +
          " stall --comm-timeout 8 --stall-rank 2 --clock-ms " + std::to_string(kClockMs),
      120);
  const std::string out = without_clock_lines(result.output);
  EXPECT_EQ(result.exit_code, kExitCollectiveTimeout) << out;
  // Ranks 0 and 1 both wait; each warns, and whichever reaches its deadline
  // first ends the job.
  expect_timed_by_the_watchdog(result.output, 0, 3, kTimeout);
  expect_timed_by_the_watchdog(result.output, 1, 3, kTimeout);
  EXPECT_TRUE(contains(out, "[vqa] FATAL rank 0/3") || contains(out, "[vqa] FATAL rank 1/3"))
      << out;
  EXPECT_TRUE(contains(out, "ranks that have not arrived: rank 2 (")) << out;
  EXPECT_FALSE(contains(out, "arrived: rank 0 (")) << out;
  EXPECT_FALSE(contains(out, "arrived: rank 1 (")) << out;
  EXPECT_FALSE(contains(out, "; rank 0 (")) << out;
  EXPECT_FALSE(contains(out, "; rank 1 (")) << out;
}

TEST(Watchdog, HealthyJobIsNeverStopped) {
  // 200 steps 20 ms apart under a deadline of 2 s: the run lasts more than
  // twice the deadline, so a deadline that counted across collectives would
  // end it, while each collective takes milliseconds.
  constexpr double kTimeout = 2.0;
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + probe() + " loop --comm-timeout 2 --step-ms 20 --steps 200",
      120);
  const std::string& out = result.output;
  EXPECT_EQ(result.exit_code, 0) << out;
  EXPECT_FALSE(contains(out, "lost rank")) << out;
  EXPECT_FALSE(contains(out, "[vqa] FATAL")) << out;
  EXPECT_TRUE(contains(out, "step 190")) << out;
  // Each rank measures its own longest wait in an allreduce. Only a wait of
  // half the deadline (a rank starved that long by the machine's load) may
  // draw a warning; one without such a wait is the watchdog's mistake.
  double longest = -1;
  for (int rank = 0; rank < 2; ++rank) {
    const double wait = vqa::testing::value_after(
        out, "probe: rank " + std::to_string(rank) + " longest allreduce");
    ASSERT_GE(wait, 0) << out;
    longest = std::max(longest, wait);
  }
  std::printf("healthy job: longest allreduce %.3f s\n", longest);
  if (longest < kTimeout / 2) {
    EXPECT_FALSE(contains(out, "collective watchdog")) << out;
  }
}

}  // namespace
