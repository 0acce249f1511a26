// --mpi-allreduce ring and auto on the MPI backend (mpi_communicator.h):
// each allreduce method timed on this job's ranks, the ring's segment size
// or the fastest method per message size chosen from the slowest rank's
// timings, so that every rank chooses alike.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/allreduce_choice.h"  // allreduce_probe_sizes, allreduce_method_fastest
#include "runtime/check.h"             // VQA_CHECK
#include "runtime/mpi_communicator.h"  // MpiCommunicator
#include "runtime/ring_allreduce.h"    // kRingSegmentLarge, kRingSegmentEager
#include "util/clock.h"                // steady_seconds

namespace vqa::runtime {

std::string MpiCommunicator::tune_allreduce(int64_t bytes) {
  if (info_.world_size < 2 || bytes < kRingMinBytes) return "";
  if (algorithm_ == MpiAllreduce::kRing) return tune_ring_segment(bytes);
  if (algorithm_ == MpiAllreduce::kAuto) return tune_by_size(bytes);
  return "";
}

namespace {

// What --mpi-allreduce auto chooses from, at start-up and in training.
const std::vector<AllreduceMethod>& auto_candidates() {
  static const std::vector<AllreduceMethod> candidates = {
      AllreduceMethod{AllreduceAlgorithm::kRing, kRingSegmentLarge},
      AllreduceMethod{AllreduceAlgorithm::kRing, kRingSegmentEager},
      AllreduceMethod{AllreduceAlgorithm::kReduceScatterAllgather, 0}, AllreduceMethod{}};
  return candidates;
}

}  // namespace

std::vector<std::string> MpiCommunicator::allreduce_methods(int64_t bytes) const {
  if (algorithm_ != MpiAllreduce::kAuto || info_.world_size < 2 || bytes < kRingMinBytes) return {};
  std::vector<std::string> names;
  for (const auto& method : auto_candidates()) names.push_back(allreduce_method_name(method));
  return names;
}

std::string MpiCommunicator::allreduce_method_in_use(int64_t bytes) const {
  if (allreduce_methods(bytes).empty()) return "";
  return allreduce_method_name(method_for(bytes));
}

void MpiCommunicator::allreduce_method_set(int64_t bytes, const std::string& method) {
  const auto offered = allreduce_methods(bytes);
  VQA_CHECK(std::find(offered.begin(), offered.end(), method) != offered.end(),
            "allreduce_method_set: '" + method + "' is not offered at " + std::to_string(bytes) +
                " bytes");
  // The progress thread reads the table for every allreduce it runs.
  drain();
  const int64_t size = choices_.size_class(bytes);
  choices_.set(size > 0 ? size : bytes, allreduce_method_from_name(method));
}

double MpiCommunicator::time_method(const torch::Tensor& buffer, const AllreduceMethod& method,
                                    int rounds, int repeats) {
  std::vector<double> seconds;
  for (int round = 0; round < rounds; ++round) {
    barrier();
    const double start = util::steady_seconds();
    for (int i = 0; i < repeats; ++i) {
      const int64_t sequence = tracker_->begin(CollectiveKind::kAllreduce, buffer.nbytes());
      sum_in_place(static_cast<char*>(buffer.data_ptr()), buffer.numel(), false, method);
      tracker_->end(sequence);
    }
    seconds.push_back((util::steady_seconds() - start) / repeats);
  }
  std::sort(seconds.begin(), seconds.end());
  // Every rank decides on the slowest rank's median, so all choose alike.
  return allreduce_scalar(seconds[seconds.size() / 2], ScalarOp::kMax);
}

double MpiCommunicator::bus_gbps(int64_t bytes, double seconds) const {
  return static_cast<double>(bytes) / seconds * 2.0 * (info_.world_size - 1) / info_.world_size /
         1e9;
}

std::string MpiCommunicator::tune_ring_segment(int64_t bytes) {
  drain();
  auto buffer = torch::zeros({bytes / 4}, torch::kFloat32);
  char size[32];
  std::snprintf(size, sizeof(size), "%.1f MB", static_cast<double>(buffer.nbytes()) / 1e6);
  std::string text = std::string("ring allreduce segments at ") + size + ":";
  std::vector<AllreduceTiming> timings;
  for (const int64_t segment : {kRingSegmentLarge, kRingSegmentEager}) {
    const AllreduceMethod ring{AllreduceAlgorithm::kRing, segment};
    time_method(buffer, ring, 1, 1);  // warm-up
    timings.push_back({ring, time_method(buffer, ring, 3, 1)});
    char line[96];
    std::snprintf(line, sizeof(line), " %lld KiB %.3f GB/s bus bandwidth;",
                  static_cast<long long>(segment >> 10),
                  bus_gbps(buffer.nbytes(), timings.back().seconds));
    text += line;
  }
  segment_bytes_ = timings[1].seconds < timings[0].seconds ? kRingSegmentEager : kRingSegmentLarge;
  return text + " using " + std::to_string(segment_bytes_ >> 10) + " KiB";
}

std::string MpiCommunicator::tune_by_size(int64_t bytes) {
  std::vector<int64_t> sizes;
  for (const int64_t size : allreduce_probe_sizes(kRingMinBytes, bytes)) {
    if (!choices_.has(size)) sizes.push_back(size);
  }
  if (sizes.empty()) return "";
  drain();
  auto buffer = torch::zeros({sizes.back() / 4}, torch::kFloat32);
  // The library runs in pieces of kLibraryPieceBytes here as in training.
  const std::vector<AllreduceMethod>& candidates = auto_candidates();
  std::string text =
      "allreduce per size (--mpi-allreduce auto; bus GB/s of ring 1024 KiB / ring 60 KiB / "
      "reduce-scatter + allgather / library -> choice):";
  for (const int64_t size : sizes) {
    const auto view = buffer.narrow(0, 0, size / 4);
    // Small messages are timed over several calls, so a timing is not one
    // clock tick.
    const int repeats = static_cast<int>(std::clamp<int64_t>((4 << 20) / size, 1, 16));
    // An untimed call of each first: the first message of a size may set
    // up connections or fault in the library's temporary buffers. Then 3
    // rounds, the candidates in a rotating order within each, so a slow
    // spell of a shared machine falls on all of them alike; the median
    // round counts.
    for (const auto& method : candidates) time_method(view, method, 1, 1);
    constexpr int kRounds = 3;
    std::vector<std::vector<double>> rounds(candidates.size());
    for (int round = 0; round < kRounds; ++round) {
      for (size_t i = 0; i < candidates.size(); ++i) {
        const size_t c = (i + round) % candidates.size();
        rounds[c].push_back(time_method(view, candidates[c], 1, repeats));
      }
    }
    std::vector<AllreduceTiming> timings;
    for (size_t c = 0; c < candidates.size(); ++c) {
      std::sort(rounds[c].begin(), rounds[c].end());
      timings.push_back({candidates[c], rounds[c][kRounds / 2]});
    }
    const AllreduceMethod choice = allreduce_method_fastest(timings);
    choices_.set(size, choice);
    char line[200];
    std::snprintf(line, sizeof(line), " %lld KiB %.3f/%.3f/%.3f/%.3f -> %s;",
                  static_cast<long long>(size >> 10), bus_gbps(size, timings[0].seconds),
                  bus_gbps(size, timings[1].seconds), bus_gbps(size, timings[2].seconds),
                  bus_gbps(size, timings[3].seconds), allreduce_method_name(choice).c_str());
    text += line;
  }
  text.pop_back();
  return text;
}

}  // namespace vqa::runtime
