// main() for GoogleTest suites started under mpirun: every rank runs every
// test in the same order; rank 0 prints the usual report, other ranks print
// only their failures. The exit status is the same on every rank: 1 when any
// rank failed, 77 (test_outcome.h: CTest shows it as skipped) when none failed
// and one skipped a case, else 0.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/distributed.h"  // DistributedSession, distributed_gather_strings
#include "test_outcome.h"         // test_outcome_of_this_process, test_exit_status

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  vqa::runtime::DistributedSession session(&argc, &argv);
  const auto& info = session.rank_info();
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);
  if (info.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(info.rank));
  }
  const int run_status = RUN_ALL_TESTS();
  auto outcome = vqa::testing::test_outcome_of_this_process();
  if (run_status != 0) outcome = vqa::testing::TestOutcome::kFailed;
  const char* const kOutcomeNames[] = {"passed", "skipped", "failed"};
  const auto outcomes =
      vqa::runtime::distributed_gather_strings(kOutcomeNames[static_cast<int>(outcome)]);
  const auto ranks_with = [&](const char* name) {
    return static_cast<int>(std::count(outcomes.begin(), outcomes.end(), std::string(name)));
  };
  if (ranks_with("failed") > 0) {
    if (info.rank == 0) {
      std::fprintf(stderr, "%d of %d ranks had failures\n", ranks_with("failed"), info.world_size);
    }
    return 1;
  }
  if (ranks_with("skipped") == 0) return 0;
  // Every rank exits alike, and rank 0 says which cases skipped there.
  return info.rank == 0 && outcome == vqa::testing::TestOutcome::kSkipped
             ? vqa::testing::test_exit_status(outcome)
             : vqa::testing::kSkippedExitCode;
}
