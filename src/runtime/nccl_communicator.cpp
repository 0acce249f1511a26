// GPU backend: NCCL collectives on a dedicated CUDA stream. Rank 0 makes the
// unique id and MPI_Bcast shares its bytes; each rank drives the GPU cuda_device_for picks.
// Ordering with the compute stream uses CUDA events only: launching waits for
// the compute stream's work so far, and Work::wait() makes the compute stream
// wait for the collective. The host never blocks on the hot path.
// The watchdog (watchdog.h) learns of completion by polling each
// collective's event with cudaEventQuery on its own thread, and on its
// deadline calls ncclCommAbort before ending the job.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#ifdef VQA_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <deque>
#include <mutex>

#include "runtime/check.h"              // fatal_user_error, VQA_CHECK_MPI
#include "runtime/communicator.h"       // Communicator, Work
#include "runtime/communicator_impl.h"  // nccl_communicator_create
#include "runtime/gpu_check.h"          // VQA_CHECK_CUDA, VQA_CHECK_NCCL
#include "runtime/mpi_collectives.h"    // mpi_allreduce_scalar, mpi_allgather_strings
#include "runtime/tracked_check.h"      // VQA_CHECK_NCCL_IN
#include "runtime/watchdog_impl.h"      // CollectiveTracker

namespace vqa::runtime {

namespace {

// The stream torch computes on: the current stream of a CUDA LibTorch, the
// legacy default stream otherwise.
cudaStream_t compute_stream(int device) {
#ifdef VQA_TORCH_HAS_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  return cudaStreamLegacy;
#endif
}

ncclDataType_t nccl_type(const torch::Tensor& buffer) {
  switch (buffer.scalar_type()) {
    case torch::kFloat32:
      return ncclFloat32;
    case torch::kBFloat16:
      return ncclBfloat16;
    default:
      fatal_user_error(std::string("NCCL communicator supports float32 and bfloat16, got ") +
                       c10::toString(buffer.scalar_type()));
  }
}

// A CUDA event shared by the Work handle and the watchdog's pending list.
using SharedEvent = std::shared_ptr<CUevent_st>;

SharedEvent event_create() {
  cudaEvent_t event;
  VQA_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return SharedEvent(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
}

class NcclWork final : public Work {
 public:
  NcclWork(SharedEvent done, cudaStream_t compute) : done_(std::move(done)), compute_(compute) {}
  void wait() override { VQA_CHECK_CUDA(cudaStreamWaitEvent(compute_, done_.get(), 0)); }

 private:
  SharedEvent done_;
  cudaStream_t compute_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const RankInfo& info)
      : Communicator(info), device_(cuda_device_for(info)) {
    VQA_CHECK_CUDA(cudaSetDevice(device_));

    ncclUniqueId id;
    if (info.rank == 0) VQA_CHECK_NCCL(ncclGetUniqueId(&id));
    VQA_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    VQA_CHECK_NCCL(ncclCommInitRank(&comm_, info.world_size, id, info.rank));
    VQA_CHECK_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    tracker_ = std::make_unique<CollectiveTracker>(position());
    // The raw pointer stays valid while the watchdog may call: the tracker's
    // destructor waits for the watchdog's current cycle.
    tracker_->set_completion_poll(
        [this, tracker = tracker_.get()] { return poll_completion(*tracker); });
    tracker_->set_abort_hook([this] { ncclCommAbort(comm_); });
  }

  ~NcclCommunicator() override {
    tracker_.reset();  // no watchdog calls from here on
    cudaStreamSynchronize(comm_stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(comm_stream_);
  }

  Backend backend() const override { return Backend::kNccl; }

  WorkHandle allreduce_async(const torch::Tensor& buffer, ReduceOp op) override {
    check_buffer(buffer);
    cudaStream_t compute = compute_stream(device_);
    order_after(compute);
    const int64_t sequence =
        begin_watch(compute, CollectiveKind::kAllreduce, buffer.numel() * buffer.element_size());
    VQA_CHECK_NCCL_IN(
        watching(sequence),
        ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), nccl_type(buffer),
                      op == ReduceOp::kAverage ? ncclAvg : ncclSum, comm_, comm_stream_));
    SharedEvent done = record_completion(sequence, comm_stream_);
    return std::make_shared<NcclWork>(std::move(done), compute);
  }

  // In place as NCCL defines it: the receive buffer is the send buffer's
  // block of this rank.
  WorkHandle reduce_scatter_async(const torch::Tensor& buffer, ReduceOp op) override {
    check_buffer(buffer);
    check_blocks(buffer);
    cudaStream_t compute = compute_stream(device_);
    order_after(compute);
    const int64_t sequence = begin_watch(compute, CollectiveKind::kReduceScatter,
                                         buffer.numel() * buffer.element_size());
    const torch::Tensor block = own_block(buffer);
    VQA_CHECK_NCCL_IN(
        watching(sequence),
        ncclReduceScatter(buffer.data_ptr(), block.data_ptr(), block.numel(), nccl_type(buffer),
                          op == ReduceOp::kAverage ? ncclAvg : ncclSum, comm_, comm_stream_));
    SharedEvent done = record_completion(sequence, comm_stream_);
    return std::make_shared<NcclWork>(std::move(done), compute);
  }

  WorkHandle allgather_async(const torch::Tensor& buffer) override {
    check_buffer(buffer);
    check_blocks(buffer);
    cudaStream_t compute = compute_stream(device_);
    order_after(compute);
    const int64_t sequence =
        begin_watch(compute, CollectiveKind::kAllgather, buffer.numel() * buffer.element_size());
    const torch::Tensor block = own_block(buffer);
    VQA_CHECK_NCCL_IN(watching(sequence),
                      ncclAllGather(block.data_ptr(), buffer.data_ptr(), block.numel(),
                                    nccl_type(buffer), comm_, comm_stream_));
    SharedEvent done = record_completion(sequence, comm_stream_);
    return std::make_shared<NcclWork>(std::move(done), compute);
  }

  void broadcast(const torch::Tensor& buffer, int root) override {
    check_buffer(buffer);
    order_after(compute_stream(device_));
    const int64_t bytes = buffer.numel() * buffer.element_size();
    const int64_t sequence = tracker_->begin(CollectiveKind::kBroadcast, bytes);
    VQA_CHECK_NCCL_IN(tracker_.get(), ncclBroadcast(buffer.data_ptr(), buffer.data_ptr(), bytes,
                                                    ncclUint8, root, comm_, comm_stream_));
    record_completion(sequence, comm_stream_);
    VQA_CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
  }

  // MPI on MPI_COMM_WORLD after the NCCL stream is drained; tracked like the
  // NCCL collectives, so a rank missing from it is named the same way.
  void barrier() override {
    VQA_CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
    const int64_t sequence = tracker_->begin(CollectiveKind::kBarrier, 0);
    VQA_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    tracker_->end(sequence);
  }

  // On the host over MPI_COMM_WORLD, after the NCCL stream is drained, as barrier().
  double allreduce_scalar(double value, ScalarOp op) override {
    VQA_CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
    const int64_t sequence = tracker_->begin(CollectiveKind::kScalar, sizeof(double));
    const double result = mpi_allreduce_scalar(MPI_COMM_WORLD, value, op, tracker_.get());
    tracker_->end(sequence);
    return result;
  }

  void watch_replayed_graph(int64_t bytes) override {
    cudaStream_t compute = compute_stream(device_);
    record_completion(tracker_->begin(CollectiveKind::kGraphReplay, bytes), compute);
  }

  std::vector<std::string> gather_strings(const std::string& value) override {
    VQA_CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
    const int64_t sequence = tracker_->begin(CollectiveKind::kGather, value.size());
    auto result = mpi_allgather_strings(MPI_COMM_WORLD, value, tracker_.get());
    tracker_->end(sequence);
    return result;
  }

  // Host bytes only: nothing on the NCCL stream is read or written, so the
  // stream is not drained and the host does not wait for the device. Every
  // rank has queued the same NCCL work before it reaches this call, so a
  // peer blocked here never holds up a collective another rank waits for.
  std::vector<std::string> gather_host_strings(const std::string& value) override {
    const int64_t sequence = tracker_->begin(CollectiveKind::kGather, value.size());
    auto result = mpi_allgather_strings(MPI_COMM_WORLD, value, tracker_.get());
    tracker_->end(sequence);
    return result;
  }

 private:
  void check_buffer(const torch::Tensor& buffer) const {
    VQA_CHECK(buffer.device().is_cuda() && buffer.device().index() == device_,
              "NCCL communicator needs a tensor on cuda:" + std::to_string(device_) + ", got " +
                  buffer.device().str());
    VQA_CHECK(buffer.is_contiguous(), "NCCL collectives need a contiguous tensor");
  }

  void check_blocks(const torch::Tensor& buffer) const {
    VQA_CHECK(buffer.numel() % info_.world_size == 0,
              "NCCL reduce-scatter and allgather need a multiple of " +
                  std::to_string(info_.world_size) + " elements, got " +
                  std::to_string(buffer.numel()));
  }

  // The watchdog's sequence number for a collective about to be launched, or
  // kCaptured when `compute` is being captured into a CUDA graph: such a
  // collective is watched as part of the graph's replays
  // (watch_replayed_graph), since its event cannot be queried.
  static constexpr int64_t kCaptured = -1;
  int64_t begin_watch(cudaStream_t compute, CollectiveKind kind, int64_t bytes) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    VQA_CHECK_CUDA(cudaStreamIsCapturing(compute, &status));
    if (status != cudaStreamCaptureStatusNone) return kCaptured;
    return tracker_->begin(kind, bytes);
  }
  const CollectiveTracker* watching(int64_t sequence) const {
    return sequence == kCaptured ? nullptr : tracker_.get();
  }

  // Records an event after collective `sequence` on `stream` and, unless the
  // collective is being captured, hands it to the watchdog's pending list.
  SharedEvent record_completion(int64_t sequence, cudaStream_t stream) {
    SharedEvent done = event_create();
    VQA_CHECK_CUDA(cudaEventRecord(done.get(), stream));
    if (sequence == kCaptured) return done;
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_.emplace_back(sequence, done);
    return done;
  }

  // Watchdog thread: retires the collectives whose event has fired; returns
  // NCCL's asynchronous error (a peer lost, a network failure), if any.
  std::string poll_completion(CollectiveTracker& tracker) {
    cudaSetDevice(device_);  // the watchdog thread's current device
    for (;;) {
      std::pair<int64_t, SharedEvent> front;
      {
        std::lock_guard<std::mutex> lock(pending_mutex_);
        if (pending_.empty()) break;
        front = pending_.front();
      }
      const cudaError_t state = cudaEventQuery(front.second.get());
      if (state == cudaErrorNotReady) break;
      if (state != cudaSuccess) return std::string("CUDA: ") + cudaGetErrorString(state);
      tracker.end(front.first);
      std::lock_guard<std::mutex> lock(pending_mutex_);
      pending_.pop_front();
    }
    ncclResult_t async_error = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async_error) != ncclSuccess) return "";
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    if (async_error == ncclInProgress) return "";
#endif
    if (async_error == ncclSuccess) return "";
    std::string text = std::string("NCCL asynchronous error: ") + ncclGetErrorString(async_error);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    text += std::string(" (") + ncclGetLastError(comm_) + ")";
#endif
    return text;
  }

  // Makes the communication stream wait for everything queued on `compute` so far.
  void order_after(cudaStream_t compute) {
    cudaEvent_t ready;
    VQA_CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    VQA_CHECK_CUDA(cudaEventRecord(ready, compute));
    VQA_CHECK_CUDA(cudaStreamWaitEvent(comm_stream_, ready, 0));
    VQA_CHECK_CUDA(cudaEventDestroy(ready));  // released once the wait is satisfied
  }

  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  std::mutex pending_mutex_;
  std::deque<std::pair<int64_t, SharedEvent>> pending_;  // (sequence, event), in stream order
  std::unique_ptr<CollectiveTracker> tracker_;
};

}  // namespace

int nccl_cuda_device_count() {
  int count = 0;
  // No driver or no GPU is not an error here: it means "no CUDA devices".
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

int nccl_runtime_version() {
  int version = 0;
  VQA_CHECK_NCCL(ncclGetVersion(&version));
  return version;
}

std::unique_ptr<Communicator> nccl_communicator_create(const RankInfo& info) {
  return std::make_unique<NcclCommunicator>(info);
}

}  // namespace vqa::runtime
