#include "runtime/version.h"

#include <cstdlib>

namespace vqa::runtime {

// Defined in the file cmake/VqaCodeVersion.cmake writes at build time.
extern const char kBuiltCodeVersion[];

std::string code_version() {
  const char* fake = std::getenv("VQA_TEST_CODE_VERSION");
  return fake != nullptr && fake[0] != '\0' ? fake : kBuiltCodeVersion;
}

}  // namespace vqa::runtime
