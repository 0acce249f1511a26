// Which allreduce the CPU backend runs for a message of a given size: the
// MPI library's MPI_Allreduce or the project's pipelined ring (and the
// ring's segment size), chosen per size from a start-up probe of each on
// the job's own fabric, as NCCL's tuner and Open MPI's tuned decisions pick
// per message size. Plain data and rules; the probe itself runs in the MPI
// communicator (Communicator::tune_allreduce).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace vqa::runtime {

// kLibrary: MPI_Allreduce. kRing: the project's pipelined ring
// (ring_allreduce.h). kReduceScatterAllgather: the library's
// MPI_Reduce_scatter then MPI_Allgatherv, the ring's two halves as the
// library runs them (over shared memory one large message each way, where
// Open MPI's allreduce of 2-3 ranks reduces then broadcasts).
enum class AllreduceAlgorithm { kLibrary, kRing, kReduceScatterAllgather };

struct AllreduceMethod {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kLibrary;
  int64_t segment_bytes = 0;  // the ring's segment size; 0 for the library
  bool operator==(const AllreduceMethod& other) const {
    return algorithm == other.algorithm && segment_bytes == other.segment_bytes;
  }
};

// "library", "ring 1024 KiB", "ring 60 KiB", "reduce-scatter + allgather".
std::string allreduce_method_name(const AllreduceMethod& method);
// The method allreduce_method_name gave `name`; throws std::invalid_argument
// for any other text.
AllreduceMethod allreduce_method_from_name(const std::string& name);

// Another method must beat the library by this factor to be chosen: where
// they are within the probe's noise the library is kept. Over shared memory
// the probe measured reduce-scatter + allgather 5-30% faster than the
// library at 128 KiB-4 MiB where a longer side-by-side run found them
// equal; over a 1 Gbit/s link the ring is 2x faster at 4 MiB and more.
constexpr double kLibraryUnlessFasterBy = 0.85;

// The probe's sizes: powers of two from `smallest` (rounded up to one) up to
// `largest`; none when that leaves none. A larger message takes the largest
// one's choice (AllreduceChoiceTable::lookup).
std::vector<int64_t> allreduce_probe_sizes(int64_t smallest, int64_t largest);

// Seconds each candidate took at one size (the slowest rank's median).
struct AllreduceTiming {
  AllreduceMethod method;
  double seconds = 0.0;
};

// The fastest candidate, with the library kept unless another is faster by
// kLibraryUnlessFasterBy. `timings` must hold the library.
AllreduceMethod allreduce_method_fastest(const std::vector<AllreduceTiming>& timings);

// The probed sizes and their choices. lookup(bytes) answers with the choice
// of the probed size nearest to `bytes` on a log scale (the larger one on a
// tie), the library below `smallest_ring_bytes` or before any probe.
class AllreduceChoiceTable {
 public:
  explicit AllreduceChoiceTable(int64_t smallest_ring_bytes)
      : smallest_ring_bytes_(smallest_ring_bytes) {}
  void set(int64_t bytes, const AllreduceMethod& method) { choices_[bytes] = method; }
  bool has(int64_t bytes) const { return choices_.count(bytes) > 0; }
  bool empty() const { return choices_.empty(); }
  AllreduceMethod lookup(int64_t bytes) const;
  // The probed size whose choice lookup(bytes) answers with; 0 below
  // `smallest_ring_bytes` or before any probe.
  int64_t size_class(int64_t bytes) const;

 private:
  int64_t smallest_ring_bytes_;
  std::map<int64_t, AllreduceMethod> choices_;
};

}  // namespace vqa::runtime
