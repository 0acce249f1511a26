// The runtime's plain types, shared by every floor of the runtime folder
// (see tests/runtime/include_floors.sh): who this rank is, the scalar
// reductions, and where the training loop is.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace vqa::runtime {

struct RankInfo {
  int rank = 0;  // 0 .. world_size-1 in MPI_COMM_WORLD
  int world_size = 1;
  int local_rank = 0;  // index among the ranks on this host (MPI_COMM_TYPE_SHARED); GPU index
  int local_size = 1;  // ranks on this host
  std::string host;    // MPI_Get_processor_name
};

enum class ScalarOp { kSum, kMax, kMin };

// Where the training loop is (epoch, optimiser step of the run), so that
// messages about a stuck or failed collective can say when it happened. The
// loop's thread writes, the watchdog thread reads: relaxed atomics.
struct TrainingPosition {
  std::atomic<int64_t> epoch{-1};  // -1: before training starts
  std::atomic<int64_t> step{-1};
};

}  // namespace vqa::runtime
