// main() for GoogleTest suites started under mpirun: every rank runs every
// test in the same order; rank 0 prints the usual report, other ranks print
// only their failures, and the exit status is non-zero when any rank failed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/distributed.h"  // DistributedSession, distributed_gather_strings

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
  const int local_failed = RUN_ALL_TESTS();
  const auto outcomes = vqa::runtime::distributed_gather_strings(local_failed != 0 ? "F" : "ok");
  const auto failed_ranks = std::count(outcomes.begin(), outcomes.end(), std::string("F"));
  if (info.rank == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "%d of %d ranks had failures\n", static_cast<int>(failed_ranks),
                 info.world_size);
  }
  return failed_ranks > 0 ? 1 : 0;
}
