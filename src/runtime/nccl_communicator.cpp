// GPU backend: NCCL collectives on a dedicated CUDA stream. Rank 0 makes the
// unique id and MPI_Bcast shares its bytes; each rank drives GPU local_rank.
// Ordering with the compute stream uses CUDA events only: launching waits for
// the compute stream's work so far, and Work::wait() makes the compute stream
// wait for the collective. The host never blocks on the hot path.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#ifdef VQA_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "runtime/check.h"              // fatal_user_error, VQA_CHECK_MPI
#include "runtime/communicator.h"       // Communicator, Work
#include "runtime/communicator_impl.h"  // nccl_communicator_create
#include "runtime/gpu_check.h"          // VQA_CHECK_CUDA, VQA_CHECK_NCCL

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

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, cudaStream_t compute) : done_(done), compute_(compute) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  void wait() override { VQA_CHECK_CUDA(cudaStreamWaitEvent(compute_, done_, 0)); }

 private:
  cudaEvent_t done_;
  cudaStream_t compute_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const RankInfo& info) : Communicator(info), device_(info.local_rank) {
    const int visible = nccl_cuda_device_count();
    if (info.local_size > visible) {
      fatal_user_error(std::to_string(info.local_size) + " ranks run on host " + info.host +
                       " but it has " + std::to_string(visible) +
                       " visible CUDA device(s); start one rank per GPU (or check "
                       "CUDA_VISIBLE_DEVICES)");
    }
    VQA_CHECK_CUDA(cudaSetDevice(device_));

    ncclUniqueId id;
    if (info.rank == 0) VQA_CHECK_NCCL(ncclGetUniqueId(&id));
    VQA_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    VQA_CHECK_NCCL(ncclCommInitRank(&comm_, info.world_size, id, info.rank));
    VQA_CHECK_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  }

  ~NcclCommunicator() override {
    cudaStreamSynchronize(comm_stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(comm_stream_);
  }

  Backend backend() const override { return Backend::kNccl; }

  WorkHandle allreduce_async(const torch::Tensor& buffer, ReduceOp op) override {
    check_buffer(buffer);
    cudaStream_t compute = compute_stream(device_);
    order_after(compute);
    VQA_CHECK_NCCL(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(),
                                 nccl_type(buffer), op == ReduceOp::kAverage ? ncclAvg : ncclSum,
                                 comm_, comm_stream_));
    cudaEvent_t done;
    VQA_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    VQA_CHECK_CUDA(cudaEventRecord(done, comm_stream_));
    return std::make_shared<NcclWork>(done, compute);
  }

  void broadcast(const torch::Tensor& buffer, int root) override {
    check_buffer(buffer);
    order_after(compute_stream(device_));
    VQA_CHECK_NCCL(ncclBroadcast(buffer.data_ptr(), buffer.data_ptr(),
                                 buffer.numel() * buffer.element_size(), ncclUint8, root, comm_,
                                 comm_stream_));
    VQA_CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
  }

  void barrier() override {
    VQA_CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
    VQA_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  }

  double sum_scalar(double value) override {
    VQA_CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
    double total = 0.0;
    VQA_CHECK_MPI(MPI_Allreduce(&value, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    return total;
  }

 private:
  void check_buffer(const torch::Tensor& buffer) const {
    VQA_CHECK(buffer.device().is_cuda() && buffer.device().index() == device_,
              "NCCL communicator needs a tensor on cuda:" + std::to_string(device_) + ", got " +
                  buffer.device().str());
    VQA_CHECK(buffer.is_contiguous(), "NCCL collectives need a contiguous tensor");
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

std::unique_ptr<Communicator> nccl_communicator_create(const RankInfo& info) {
  return std::make_unique<NcclCommunicator>(info);
}

}  // namespace vqa::runtime
