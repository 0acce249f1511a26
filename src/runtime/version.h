// The code version compiled into every binary, so that a job whose ranks run
// different builds is refused at start-up (distributed_init) instead of
// failing later in ways that are hard to trace.
#pragma once

#include <string>

namespace vqa::runtime {

// `git describe --always --dirty --tags` of the source tree when this binary
// was built (cmake/VqaCodeVersion.cmake), or "unknown" outside a git checkout.
// For tests only, the environment variable VQA_TEST_CODE_VERSION replaces it,
// so that one rank can pretend to be another build.
std::string code_version();

}  // namespace vqa::runtime
