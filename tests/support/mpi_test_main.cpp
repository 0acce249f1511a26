// main() for GoogleTest suites started under mpirun: every rank runs every
// test in the same order; rank 0 prints the usual report, other ranks print
// only their failures, and the exit status is non-zero when any rank failed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "runtime/distributed.h"  // distributed_init, distributed_sum

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
  const auto& info = vqa::runtime::distributed_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);
  if (info.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(info.rank));
  }
  const int local_failed = RUN_ALL_TESTS();
  const double failed_ranks = vqa::runtime::distributed_sum(local_failed != 0 ? 1.0 : 0.0);
  if (info.rank == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "%d of %d ranks had failures\n", static_cast<int>(failed_ranks),
                 info.world_size);
  }
  vqa::runtime::distributed_finalize();
  return failed_ranks > 0 ? 1 : 0;
}
