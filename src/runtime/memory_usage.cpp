#include "runtime/memory_usage.h"

#include <fstream>
#include <sstream>

#ifdef VQA_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace vqa::runtime {

namespace {

// VmHWM of /proc/self/status in bytes, or 0.
int64_t resident_high_water_mark() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

MemoryPeak memory_peak_and_reset(const torch::Device& device) {
  MemoryPeak peak;
#ifdef VQA_TORCH_HAS_CUDA
  if (device.is_cuda()) {
    namespace allocator = c10::cuda::CUDACachingAllocator;
    const auto index = device.index();
    const auto stats = allocator::getDeviceStats(index);
    // Entry 0 is StatType::AGGREGATE (all pools), whose enum moved from
    // c10::cuda::CUDACachingAllocator (1.x) to c10::CachingDeviceAllocator (2.x).
    peak.bytes = stats.allocated_bytes[0].peak;
    peak.source = "GPU allocated (LibTorch)";
    allocator::resetPeakStats(index);
    return peak;
  }
#endif
  peak.bytes = resident_high_water_mark();
  peak.source = "resident set (VmHWM)";
  // "5" resets the high-water mark to the current resident set (Linux 4.0+).
  std::ofstream("/proc/self/clear_refs") << "5";
  return peak;
}

}  // namespace vqa::runtime
