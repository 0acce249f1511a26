// How a GoogleTest program ends, so that CTest tells a skipped test from a
// passed one: a program whose cases all passed or skipped, with at least one
// skipped, exits with kSkippedExitCode, which every vqa_add_*test registers as
// SKIP_RETURN_CODE. A program whose cases are partly skipped therefore shows
// as skipped as a whole; the CMake files register such cases as a test of
// their own (see vqa_add_test's APART) so that the rest still shows as passed.
#pragma once

namespace vqa::testing {

inline constexpr int kSkippedExitCode = 77;

enum class TestOutcome { kPassed, kSkipped, kFailed };

// This process's outcome after RUN_ALL_TESTS().
TestOutcome test_outcome_of_this_process();

// The exit status for an outcome; on kSkipped it also prints which cases
// skipped and why CTest shows the test as skipped.
int test_exit_status(TestOutcome outcome);

}  // namespace vqa::testing
