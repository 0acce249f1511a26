// HDF5's error stack as one line, for every message about a failed HDF5 call
// (the runtime's VQA_CHECK_HDF5, the dataset reader's DataFormatError).
#pragma once

#include <string>

namespace vqa::util {

// The calling thread's HDF5 error stack, from the API call down to where it
// failed: the outer frames say which call failed, the innermost ones why
// ("data error detected by Fletcher32 checksum", "truncated file: eof =
// ..."), so a deep stack keeps its first three and its last two frames:
// "H5Dread: can't read data <- ... <- H5Z_filter_fletcher32: data error".
// "no HDF5 error on the stack" when it is empty.
std::string hdf5_error_stack();

}  // namespace vqa::util
