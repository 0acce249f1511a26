// The MPI (CPU) backend, shared by its two files: mpi_communicator.cpp (the
// collectives, and the progress thread that runs them so that
// allreduce_async really overlaps the caller's work) and
// mpi_allreduce_tuning.cpp (--mpi-allreduce ring and auto: timing the
// allreduce methods and choosing one per size). Private to the runtime
// folder; the training loop sees Communicator (communicator.h).
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/allreduce_choice.h"  // AllreduceChoiceTable, AllreduceMethod
#include "runtime/communicator.h"      // Communicator, Work
#include "runtime/ring_allreduce.h"    // kRingSegmentLarge
#include "runtime/watchdog_impl.h"     // CollectiveTracker, CollectiveKind

namespace vqa::runtime {

// MPI counts are int; larger buffers go in pieces of this many elements.
constexpr int64_t kMaxElementsPerCall = int64_t{1} << 30;

// The library's allreduce, reduce-scatter + allgather and ZeRO-1's
// reduce-scatter run in pieces of at most this many bytes: Open MPI's
// allreduce and reduce-scatter take a temporary buffer the size of the
// message, and at 32 MiB and more glibc maps and unmaps it on every call
// (its largest mmap threshold), which made messages of 32 MiB and more ~10x
// slower over shared memory (0.25 against 3-4 GB/s bus bandwidth, on the
// progress thread already from 32 MiB). Pieces of 8 MiB run at the
// library's full speed.
constexpr int64_t kLibraryPieceBytes = int64_t{8} << 20;

// Below this the library's allreduce (latency-optimal algorithms) is faster
// than a ring of 2(n-1) messages.
constexpr int64_t kRingMinBytes = int64_t{64} << 10;

class MpiWork final : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
  }
  void set_times(double began, double ended) {
    began_at_ = began;
    ended_at_ = ended;
  }
  void mark_done() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
};

// A collective queued for the progress thread (kAllreduce, kReduceScatter
// or kAllgather).
struct PendingCollective {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  torch::Tensor buffer;
  ReduceOp op = ReduceOp::kSum;
  std::shared_ptr<MpiWork> work;
};

// Collectives on a duplicate of MPI_COMM_WORLD, run by one progress thread
// (Open MPI's non-blocking collectives only progress inside MPI calls).
// Every collective is reported to the watchdog (watchdog.h) by the thread
// that runs it, around the MPI call.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const RankInfo& info, MpiAllreduce algorithm);
  ~MpiCommunicator() override;

  Backend backend() const override { return Backend::kMpi; }

  WorkHandle allreduce_async(const torch::Tensor& buffer, ReduceOp op) override;
  WorkHandle reduce_scatter_async(const torch::Tensor& buffer, ReduceOp op) override;
  WorkHandle allgather_async(const torch::Tensor& buffer) override;
  // Runs on the calling thread once earlier work is done: a blocking call
  // gains nothing from the hand-off to the progress thread.
  void allreduce(const torch::Tensor& buffer, ReduceOp op) override;
  // --mpi-allreduce auto: every power of two from 64 KiB up to `bytes` not
  // probed yet, each timed with the ring at both segment sizes, the
  // library's reduce-scatter + allgather and its allreduce; later allreduces
  // use the nearest size's choice. ring: the ring's segment size at `bytes`.
  // library: nothing to choose.
  std::string tune_allreduce(int64_t bytes) override;
  // --mpi-allreduce auto: the four methods tune_allreduce times.
  std::vector<std::string> allreduce_methods(int64_t bytes) const override;
  std::string allreduce_method_in_use(int64_t bytes) const override;
  void allreduce_method_set(int64_t bytes, const std::string& method) override;
  void library_allreduce_sum(const torch::Tensor& buffer) override;
  void broadcast(const torch::Tensor& buffer, int root) override;
  void barrier() override;
  double allreduce_scalar(double value, ScalarOp op) override;
  std::vector<std::string> gather_strings(const std::string& value) override;

 private:
  // mpi_communicator.cpp: the collectives and the progress thread.
  void check_buffer(const torch::Tensor& buffer, const char* what) const;
  void check_blocks(const torch::Tensor& buffer, const char* what) const;
  WorkHandle enqueue(PendingCollective pending);
  // Collectives on comm_ must not interleave with the progress thread's, so
  // blocking calls from the main thread first wait for the queue to empty.
  void drain();
  void progress_loop();
  void run_collective(PendingCollective& pending);
  // Rank r's block of the sum, into place, in pieces of at most
  // kLibraryPieceBytes (Open MPI's reduce-scatter takes a temporary buffer
  // the size of the whole message too): piece p of every block, packed side
  // by side, is reduce-scattered into the scratch buffer, then copied into
  // rank r's block (MPI_IN_PLACE would put it at the buffer's start). A
  // bucket of at most kLibraryPieceBytes goes in one call, unpacked.
  // (The allgather stays one call: in place it runs at full speed at every
  // size, 4.5 ms for 64 MiB at 2 ranks over shared memory.)
  void reduce_scatter_in_place(char* data, int64_t block, int64_t element_size, MPI_Datatype type,
                               MPI_Op op);
  AllreduceMethod method_for(int64_t bytes) const;
  void sum_in_place(char* data, int64_t count, bool is_bf16, const AllreduceMethod& method);

  // mpi_allreduce_tuning.cpp: the timings behind tune_allreduce.
  // Seconds per float32 sum-allreduce of `buffer` with `method`, the slowest
  // rank's median of `rounds`, each the mean of `repeats` calls after a barrier.
  // Collective; the caller has drained the queue.
  double time_method(const torch::Tensor& buffer, const AllreduceMethod& method, int rounds,
                     int repeats);
  double bus_gbps(int64_t bytes, double seconds) const;
  std::string tune_ring_segment(int64_t bytes);
  std::string tune_by_size(int64_t bytes);

  MpiAllreduce algorithm_;
  int64_t segment_bytes_ = kRingSegmentLarge;  // --mpi-allreduce ring: tune_allreduce may change it
  AllreduceChoiceTable choices_{kRingMinBytes};  // --mpi-allreduce auto: filled by tune_allreduce
  // The ring's receive buffer and reduce-scatter's block, reused (progress
  // thread or drained caller).
  std::vector<char> ring_scratch_;
  std::vector<char> library_pack_;  // reduce_scatter_in_place's pieces, side by side
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;
  std::unique_ptr<CollectiveTracker> tracker_;
  std::thread progress_thread_;
  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::condition_variable idle_cv_;
  std::deque<PendingCollective> queue_;
  bool busy_ = false;
  bool stopping_ = false;
};

}  // namespace vqa::runtime
