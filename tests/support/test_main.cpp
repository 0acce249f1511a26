// main() for GoogleTest programs that run as one process (in place of
// gtest_main): the same report, and exit status 77 when cases were skipped
// and none failed (test_outcome.h), so that CTest shows a skip as a skip.
#include <gtest/gtest.h>

#include "test_outcome.h"  // test_outcome_of_this_process, test_exit_status

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (RUN_ALL_TESTS() != 0) return 1;
  return vqa::testing::test_exit_status(vqa::testing::test_outcome_of_this_process());
}
