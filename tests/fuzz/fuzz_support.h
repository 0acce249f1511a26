// Shared pieces of the fuzz targets (tests/fuzz/fuzz_*.cpp). Each target
// defines LLVMFuzzerTestOneInput; libFuzzer drives it in a VQA_FUZZ build, and
// replay_main.cpp feeds it the seed corpus and the regression inputs in the
// normal build. A target returns normally for every input, accepted or
// refused; a crash, a sanitizer report or fuzz_require failing (abort) is a
// finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace vqa::fuzz {

// Prints "fuzz invariant violated: <what>" and aborts (the fuzzer's crash).
[[noreturn]] void fuzz_fail(const std::string& what);

inline void fuzz_require(bool condition, const std::string& what) {
  if (!condition) fuzz_fail(what);
}

// A file path private to this process, in /dev/shm when it exists (every
// input is written once: memory is faster than disk), else the temp folder.
std::string fuzz_scratch_path(const std::string& name);

// Opens `path` with DatasetReader as the loader does (default driver here),
// for both splits; on success reads every question row, the records and the
// first images, and checks what the reader promises about them; on refusal
// checks that the error is a DataFormatError naming the file. Also checks
// that no HDF5 object is left open afterwards. Returns the number of splits
// the reader accepted (0..2).
int fuzz_exercise_reader(const std::string& path);

}  // namespace vqa::fuzz
