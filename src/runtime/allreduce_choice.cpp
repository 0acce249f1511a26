#include "runtime/allreduce_choice.h"

#include <cmath>
#include <cstdio>
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

AllreduceMethod allreduce_method_from_name(const std::string& name) {
  if (name == "library") return AllreduceMethod{};
  if (name == "reduce-scatter + allgather") {
    return AllreduceMethod{AllreduceAlgorithm::kReduceScatterAllgather, 0};
  }
  long long kib = 0;
  char unit[8] = {};
  if (std::sscanf(name.c_str(), "ring %lld %7s", &kib, unit) == 2 && kib > 0 &&
      std::string(unit) == "KiB") {
    return AllreduceMethod{AllreduceAlgorithm::kRing, static_cast<int64_t>(kib) << 10};
  }
  throw std::invalid_argument("not an allreduce method: '" + name + "'");
}

int64_t AllreduceChoiceTable::size_class(int64_t bytes) const {
  if (bytes < smallest_ring_bytes_ || choices_.empty()) return 0;
  const auto above = choices_.lower_bound(bytes);
  if (above == choices_.end()) return std::prev(above)->first;
  if (above == choices_.begin() || above->first == bytes) return above->first;
  const auto below = std::prev(above);
  const double to_above = std::log(static_cast<double>(above->first) / bytes);
  const double to_below = std::log(static_cast<double>(bytes) / below->first);
  return to_above <= to_below ? above->first : below->first;
}

AllreduceMethod AllreduceChoiceTable::lookup(int64_t bytes) const {
  const int64_t size = size_class(bytes);
  return size > 0 ? choices_.at(size) : AllreduceMethod{};
}

}  // namespace vqa::runtime
