// Facts about the process's environment that change performance.
#pragma once

#include <string>

namespace vqa::runtime {

// Which BLAS the process loaded: "OpenBLAS <config>", "reference BLAS (<path>)",
// or the path of another libblas. LibTorch's CPU matrix products run about 16x
// slower on Debian's reference BLAS than on OpenBLAS.
std::string blas_description();
bool blas_is_reference();

// Prints a warning with the remedy on stderr when the reference BLAS is loaded.
// Returns true when it warned.
bool warn_if_reference_blas();

}  // namespace vqa::runtime
