// Fuzz target: a dataset file as raw bytes. The input is written to a file
// and opened with DatasetReader as the loader opens it; see
// fuzz_exercise_reader for what is read and checked. Seeded with small valid
// files, so that most mutations land in the stored values and attributes
// that the reader's own checks judge. (HDF5 itself is not instrumented:
// coverage feedback sees only the reader, which is why fuzz_hdf5_edits builds
// files from structured edits as well.)
#include <cstdio>

#include "fuzz_support.h"  // fuzz_exercise_reader, fuzz_scratch_path

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = vqa::fuzz::fuzz_scratch_path("bytes.h5");
  std::FILE* file = std::fopen(path.c_str(), "wb");
  vqa::fuzz::fuzz_require(file != nullptr, "cannot write " + path);
  const bool written = std::fwrite(data, 1, size, file) == size;
  vqa::fuzz::fuzz_require(std::fclose(file) == 0 && written, "cannot write " + path);
  vqa::fuzz::fuzz_exercise_reader(path);
  std::remove(path.c_str());
  return 0;
}
