// A failure on one rank ends all ranks with a non-zero exit within seconds.
#include <gtest/gtest.h>

#include "process.h"  // run_process, mpirun_prefix

namespace {

const char* probe() { return VQA_FAILURE_PROBE; }

TEST(Failure, FailedCheckOnOneRankEndsEveryRank) {
  const auto result =
      vqa::testing::run_process(vqa::testing::mpirun_prefix(2) + probe() + " internal", 60);
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  // mpirun tears the job down within a few seconds of MPI_Abort.
  EXPECT_LT(result.seconds, 20.0) << result.output;
  EXPECT_NE(result.output.find("FATAL rank 1/2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("probe: failing on purpose"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("failure_probe.cpp:"), std::string::npos) << result.output;
}

TEST(Failure, UserErrorOnOneRankEndsEveryRankWithItsStatus) {
  const auto result =
      vqa::testing::run_process(vqa::testing::mpirun_prefix(3) + probe() + " user", 60);
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_LT(result.seconds, 20.0) << result.output;
  EXPECT_NE(result.output.find("error on rank 2/3"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("bad input on purpose"), std::string::npos) << result.output;
}

}  // namespace
