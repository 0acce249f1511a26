// The communicator the training loop sees: in-place collectives on tensors
// with a CPU backend (MPI, on a progress thread) and a GPU backend (NCCL, on a
// dedicated CUDA stream). Model code never sees it.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/types.h"    // RankInfo, ScalarOp, TrainingPosition
#include "util/mode_names.h"  // ModeNames, mode_name

namespace vqa::runtime {

enum class ReduceOp { kSum, kAverage };
enum class Backend { kAuto, kMpi, kNccl };
// How the MPI backend averages buffers of 64 KiB and more: per message
// size, whichever of the two below a start-up probe on the job's own fabric
// found faster (auto: allreduce_choice.h, Communicator::tune_allreduce); its
// own pipelined ring over point-to-point messages (ring_allreduce.h says
// why), or the MPI library's MPI_Allreduce (for an MPI whose allreduce is
// tuned to the site's fabric). Buffers under 64 KiB always use the library's.
enum class MpiAllreduce { kAuto, kRing, kLibrary };

// The modes' texts (--backend, --mpi-allreduce).
inline const util::ModeNames<Backend> kBackendNames = {
    {"auto", Backend::kAuto}, {"mpi", Backend::kMpi}, {"nccl", Backend::kNccl}};
inline const util::ModeNames<MpiAllreduce> kMpiAllreduceNames = {
    {"auto", MpiAllreduce::kAuto},
    {"ring", MpiAllreduce::kRing},
    {"library", MpiAllreduce::kLibrary}};
inline std::string backend_name(Backend backend) { return util::mode_name(backend, kBackendNames); }
inline std::string mpi_allreduce_name(MpiAllreduce algorithm) {
  return util::mode_name(algorithm, kMpiAllreduceNames);
}

// The backend that serves tensors on `device`: NCCL for CUDA, MPI for CPU.
Backend backend_for_device(const torch::Device& device);

// True when this build contains the NCCL backend (VQA_WITH_NCCL).
bool nccl_backend_built();
// The NCCL library this process loaded, e.g. "2.18.3" (ncclGetVersion; no
// GPU needed), or "" without the NCCL backend.
std::string nccl_version_loaded();
// CUDA devices this process can see; 0 without a GPU or without the NCCL build.
int cuda_device_count();

// Which visible CUDA device a rank drives, decided before anything else
// touches CUDA. One visible device: that one (sites that give each task its
// own GPU, e.g. Slurm's --gpus-per-task=1 or --gpu-bind, show every rank a
// single device 0). At least as many as the ranks on the host: the local
// rank's (devices beyond the ranks stay idle, which `note` says). Otherwise
// (none, or fewer than the ranks but more than one) `problem` says why no
// choice is safe and `index` is -1.
struct CudaDeviceChoice {
  int index = -1;
  std::string problem;  // empty when index >= 0
  std::string note;     // e.g. idle devices; empty when nothing to say
};
CudaDeviceChoice cuda_device_choice(int visible, int local_rank, int local_size);
// cuda_device_choice for this process (cuda_device_count(), RankInfo); on a
// problem, ends every rank with a message naming the rank, the host,
// CUDA_VISIBLE_DEVICES and the counts.
int cuda_device_for(const RankInfo& info);

// A launched collective. wait() returns once the result may be used by the
// caller: for MPI, when the reduction has finished on the host; for NCCL,
// once the compute stream is ordered after it (no host synchronisation).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;

  // After wait(): when the collective itself ran (queueing excluded), in
  // seconds of std::chrono::steady_clock's time_since_epoch. Both 0 when the
  // backend cannot tell without a host synchronisation (NCCL).
  double began_at() const { return began_at_; }
  double ended_at() const { return ended_at_; }

 protected:
  double began_at_ = 0.0;
  double ended_at_ = 0.0;
};
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual Backend backend() const = 0;
  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  const std::string& host() const { return info_.host; }

  // In place on `buffer` (contiguous, float32 or bfloat16, on the backend's
  // device). The caller keeps the tensor alive and does not touch it until
  // wait() returns. Every rank must launch the same collectives in the same
  // order. Main thread only.
  virtual WorkHandle allreduce_async(const torch::Tensor& buffer, ReduceOp op) = 0;
  // Blocking form: returns when the result is ready. Ordered after every
  // collective launched before it.
  virtual void allreduce(const torch::Tensor& buffer, ReduceOp op) {
    allreduce_async(buffer, op)->wait();
  }

  // The two halves of an allreduce, for sharded optimiser state (ZeRO-1),
  // in place on `buffer` (contiguous, float32 or bfloat16, numel a multiple
  // of world_size(), split into world_size() equal blocks, block r being
  // rank r's), launched and waited for like allreduce_async:
  // reduce_scatter_async leaves in this rank's block the sum (or average)
  // over ranks of that block (the other blocks are left undefined);
  // allgather_async copies every rank's own block into that block of every
  // rank's buffer.
  virtual WorkHandle reduce_scatter_async(const torch::Tensor& buffer, ReduceOp op) = 0;
  virtual WorkHandle allgather_async(const torch::Tensor& buffer) = 0;
  // This rank's block of a buffer split as above.
  torch::Tensor own_block(const torch::Tensor& buffer) const {
    const int64_t block = buffer.numel() / world_size();
    return buffer.narrow(0, block * rank(), block);
  }

  // Collective: lets the backend measure its choices for allreduces of up to
  // `bytes` on this fabric and keep the fastest (the MPI backend's algorithm
  // per message size, or the ring's segment size); returns one line for the
  // log saying what it chose and why ("" when there was nothing new to
  // choose). Call before training, on every rank; calling it again with a
  // larger size probes only the sizes not yet measured.
  virtual std::string tune_allreduce(int64_t bytes) { return ""; }

  // The choice in training (train/allreduce_autotune.h): the methods an
  // allreduce of `bytes` may use, by name, where the backend chooses one per
  // message size (the MPI backend with --mpi-allreduce auto, 2+ ranks,
  // 64 KiB and more); otherwise none.
  virtual std::vector<std::string> allreduce_methods(int64_t bytes) const { return {}; }
  // The method allreduces of `bytes` use now ("" where allreduce_methods
  // offers none).
  virtual std::string allreduce_method_in_use(int64_t bytes) const { return ""; }
  // From now on allreduces in the size class of `bytes` (the probed size
  // that answers for it) use `method`, one of allreduce_methods(bytes).
  // Every rank calls it alike, between two steps; it first waits for the
  // collectives in flight. Main thread only.
  virtual void allreduce_method_set(int64_t bytes, const std::string& method) {}

  // The baseline vqa_allreduce_bench compares with: one blocking
  // MPI_Allreduce(MPI_SUM) per 2^30 elements, in place on a contiguous
  // float32 CPU tensor, on this communicator's own MPI communicator (Open
  // MPI's speed at one size differed by up to 2x between two communicators
  // of the same ranks, lastingly within a run), without this layer's choice
  // of algorithm, pieces or tracking. MPI backend only; others throw.
  virtual void library_allreduce_sum(const torch::Tensor& buffer);

  // CUDA graphs (cuda_graph.h): a collective launched while torch's current
  // stream is being captured becomes part of the graph and is not watched on
  // its own (an event recorded in a capture cannot be queried). After each
  // replay of such a graph on the current stream, call this: the watchdog
  // then watches the replay as one collective of `bytes`, so a peer that
  // never joins is found and named as for any other. A no-op where nothing
  // is captured (the MPI backend).
  virtual void watch_replayed_graph(int64_t bytes) {}

  // Root's values replace every other rank's, in place; blocks until done.
  virtual void broadcast(const torch::Tensor& buffer, int root) = 0;
  // Returns once every rank has called it and all collectives launched
  // before it on this communicator have completed.
  virtual void barrier() = 0;
  // `value` combined over all ranks, on every rank's host. Blocks; ordered
  // after every collective launched before it. Main thread only.
  virtual double allreduce_scalar(double value, ScalarOp op) = 0;
  double sum(double value) { return allreduce_scalar(value, ScalarOp::kSum); }
  double max(double value) { return allreduce_scalar(value, ScalarOp::kMax); }
  double min(double value) { return allreduce_scalar(value, ScalarOp::kMin); }
  // Every rank's string, in rank order, on every rank (the lengths may
  // differ). Blocks like allreduce_scalar. Main thread only.
  virtual std::vector<std::string> gather_strings(const std::string& value) = 0;
  // gather_strings for host bytes that no device work produces or reads (a
  // batch's token ids): ordered after the host collectives launched before
  // it, not after the device's, so on a GPU the host waits for the other
  // ranks' hosts only, never for the device (NCCL: no stream drain). Blocks.
  // Main thread only. The MPI backend's collectives are host work: as
  // gather_strings.
  virtual std::vector<std::string> gather_host_strings(const std::string& value) {
    return gather_strings(value);
  }

  // Where the training loop is (epoch, optimiser step of the run), so that
  // messages about a stuck or failed collective can say when it happened.
  // Cheap: two relaxed atomic stores; call it every step.
  void set_position(int64_t epoch, int64_t step) {
    position_.epoch.store(epoch, std::memory_order_relaxed);
    position_.step.store(step, std::memory_order_relaxed);
  }
  const TrainingPosition& position() const { return position_; }

 protected:
  explicit Communicator(const RankInfo& info) : info_(info) {}
  RankInfo info_;

 private:
  TrainingPosition position_;
};

// "" when the collectives of backend `requested` (kAuto: from the device)
// can be captured into a CUDA graph, else why not, for the log: the MPI
// backend's run on the host; NCCL's can from NCCL 2.9.6 on (the library
// this process loaded, not the header it was built with). Needs no
// communicator: the run decides before it makes one.
std::string graph_capture_unavailable(Backend requested, const torch::Device& device);
// The reason NCCL of version code `version` (ncclGetVersion's) cannot be
// captured, or "" from 2.9.6 on.
std::string nccl_graph_capture_unavailable(int version);

// Creates the communicator for `requested` (kAuto: from the device). Every
// rank must call it at the same point; the NCCL backend shares rank 0's
// unique id with MPI_Bcast and binds this rank to GPU local_rank.
std::unique_ptr<Communicator> communicator_create(Backend requested, const torch::Device& device,
                                                  MpiAllreduce mpi_allreduce = MpiAllreduce::kAuto);

}  // namespace vqa::runtime
