#include "runtime/allreduce_choice.h"

#include <cmath>
#include <stdexcept>

namespace vqa::runtime {

std::string allreduce_method_name(const AllreduceMethod& method) {
  if (method.algorithm == AllreduceAlgorithm::kLibrary) return "library";
  if (method.algorithm == AllreduceAlgorithm::kReduceScatterAllgather) {
    return "reduce-scatter + allgather";
  }
  return "ring " + std::to_string(method.segment_bytes >> 10) + " KiB";
}

std::vector<int64_t> allreduce_probe_sizes(int64_t smallest, int64_t largest) {
  std::vector<int64_t> sizes;
  int64_t size = 1;
  while (size < smallest) size <<= 1;
  for (; size <= largest; size <<= 1) sizes.push_back(size);
  return sizes;
}

AllreduceMethod allreduce_method_fastest(const std::vector<AllreduceTiming>& timings) {
  const AllreduceTiming* library = nullptr;
  const AllreduceTiming* other = nullptr;
  for (const auto& timing : timings) {
    if (timing.method.algorithm == AllreduceAlgorithm::kLibrary) {
      library = &timing;
    } else if (other == nullptr || timing.seconds < other->seconds) {
      other = &timing;
    }
  }
  if (library == nullptr) throw std::logic_error("allreduce_method_fastest: no library timing");
  if (other != nullptr && other->seconds < kLibraryUnlessFasterBy * library->seconds) {
    return other->method;
  }
  return library->method;
}

AllreduceMethod AllreduceChoiceTable::lookup(int64_t bytes) const {
  if (bytes < smallest_ring_bytes_ || choices_.empty()) return AllreduceMethod{};
  const auto above = choices_.lower_bound(bytes);
  if (above == choices_.end()) return std::prev(above)->second;
  if (above == choices_.begin() || above->first == bytes) return above->second;
  const auto below = std::prev(above);
  const double to_above = std::log(static_cast<double>(above->first) / bytes);
  const double to_below = std::log(static_cast<double>(bytes) / below->first);
  return to_above <= to_below ? above->second : below->second;
}

}  // namespace vqa::runtime
