// The peak memory of this process since the last reset: on a GPU, what
// LibTorch's caching allocator had allocated on the device at most; on the
// CPU, the resident set's high-water mark (VmHWM, which counts everything:
// tensors, libraries, MPI and loader buffers).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace vqa::runtime {

struct MemoryPeak {
  int64_t bytes = 0;   // 0 when it cannot be read
  std::string source;  // "GPU allocated (LibTorch)" | "resident set (VmHWM)"
};

// Reads the peak for `device` and starts a new measuring period (resets the
// allocator's peak statistics, or VmHWM through /proc/self/clear_refs, where
// the kernel allows it). Main thread.
MemoryPeak memory_peak_and_reset(const torch::Device& device);

}  // namespace vqa::runtime
