// The MPI (CPU) backend's collectives (mpi_communicator.h): blocking calls
// on the caller's thread, asynchronous ones queued for the progress thread,
// large buffers in pieces, and bfloat16 sums through a user-defined MPI op.
#include "runtime/mpi_communicator.h"

#include <mpi.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include "runtime/check.h"              // VQA_CHECK_MPI, VQA_CHECK
#include "runtime/communicator_impl.h"  // mpi_communicator_create
#include "runtime/mpi_collectives.h"    // mpi_allreduce_scalar, mpi_allgather_strings
#include "runtime/ring_allreduce.h"     // ring_allreduce_sum
#include "runtime/tracked_check.h"      // VQA_CHECK_MPI_IN
#include "util/clock.h"                 // steady_seconds

namespace vqa::runtime {

namespace {

// Sum for bfloat16 stored as 16-bit words: MPI has no bf16 type. Accumulates
// in float and rounds to nearest even, as torch does.
void bf16_sum(void* in, void* inout, int* count, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const c10::BFloat16*>(in);
  auto* b = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *count; ++i) b[i] = c10::BFloat16(float(a[i]) + float(b[i]));
}

}  // namespace

MpiCommunicator::MpiCommunicator(const RankInfo& info, MpiAllreduce algorithm)
    : Communicator(info), algorithm_(algorithm) {
  VQA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  VQA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  VQA_CHECK_MPI(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_));
  tracker_ = std::make_unique<CollectiveTracker>(position());
  progress_thread_ = std::thread([this] { progress_loop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  progress_thread_.join();
  tracker_.reset();
  MPI_Op_free(&bf16_sum_op_);
  MPI_Comm_free(&comm_);
}

WorkHandle MpiCommunicator::allreduce_async(const torch::Tensor& buffer, ReduceOp op) {
  check_buffer(buffer, "allreduce_async");
  return enqueue(PendingCollective{CollectiveKind::kAllreduce, buffer, op, nullptr});
}

WorkHandle MpiCommunicator::reduce_scatter_async(const torch::Tensor& buffer, ReduceOp op) {
  check_buffer(buffer, "reduce_scatter_async");
  check_blocks(buffer, "reduce_scatter_async");
  return enqueue(PendingCollective{CollectiveKind::kReduceScatter, buffer, op, nullptr});
}

WorkHandle MpiCommunicator::allgather_async(const torch::Tensor& buffer) {
  check_buffer(buffer, "allgather_async");
  check_blocks(buffer, "allgather_async");
  return enqueue(PendingCollective{CollectiveKind::kAllgather, buffer, ReduceOp::kSum, nullptr});
}

void MpiCommunicator::allreduce(const torch::Tensor& buffer, ReduceOp op) {
  check_buffer(buffer, "allreduce");
  drain();
  PendingCollective pending{CollectiveKind::kAllreduce, buffer, op, nullptr};
  run_collective(pending);
}

void MpiCommunicator::library_allreduce_sum(const torch::Tensor& buffer) {
  VQA_CHECK(
      buffer.device().is_cpu() && buffer.is_contiguous() && buffer.scalar_type() == torch::kFloat32,
      "library_allreduce_sum needs a contiguous float32 CPU tensor");
  drain();
  auto* data = buffer.data_ptr<float>();
  for (int64_t offset = 0; offset < buffer.numel(); offset += kMaxElementsPerCall) {
    const int part = static_cast<int>(std::min(kMaxElementsPerCall, buffer.numel() - offset));
    VQA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data + offset, part, MPI_FLOAT, MPI_SUM, comm_));
  }
}

void MpiCommunicator::broadcast(const torch::Tensor& buffer, int root) {
  check_buffer(buffer, "broadcast");
  drain();
  auto* bytes = static_cast<char*>(buffer.data_ptr());
  const int64_t total = buffer.numel() * buffer.element_size();
  const int64_t sequence = tracker_->begin(CollectiveKind::kBroadcast, total);
  for (int64_t offset = 0; offset < total; offset += kMaxElementsPerCall) {
    const int count = static_cast<int>(std::min(kMaxElementsPerCall, total - offset));
    VQA_CHECK_MPI_IN(tracker_.get(), MPI_Bcast(bytes + offset, count, MPI_BYTE, root, comm_));
  }
  tracker_->end(sequence);
}

void MpiCommunicator::barrier() {
  drain();
  const int64_t sequence = tracker_->begin(CollectiveKind::kBarrier, 0);
  VQA_CHECK_MPI_IN(tracker_.get(), MPI_Barrier(comm_));
  tracker_->end(sequence);
}

double MpiCommunicator::allreduce_scalar(double value, ScalarOp op) {
  drain();
  const int64_t sequence = tracker_->begin(CollectiveKind::kScalar, sizeof(double));
  const double result = mpi_allreduce_scalar(comm_, value, op, tracker_.get());
  tracker_->end(sequence);
  return result;
}

std::vector<std::string> MpiCommunicator::gather_strings(const std::string& value) {
  drain();
  const int64_t sequence = tracker_->begin(CollectiveKind::kGather, value.size());
  auto result = mpi_allgather_strings(comm_, value, tracker_.get());
  tracker_->end(sequence);
  return result;
}

void MpiCommunicator::check_buffer(const torch::Tensor& buffer, const char* what) const {
  VQA_CHECK(buffer.device().is_cpu(), std::string("MPI communicator ") + what +
                                          " needs a CPU tensor, got " + buffer.device().str());
  VQA_CHECK(buffer.is_contiguous(), std::string(what) + " needs a contiguous tensor");
  VQA_CHECK(buffer.scalar_type() == torch::kFloat32 || buffer.scalar_type() == torch::kBFloat16,
            std::string(what) + " supports float32 and bfloat16, got " +
                std::string(c10::toString(buffer.scalar_type())));
}

void MpiCommunicator::check_blocks(const torch::Tensor& buffer, const char* what) const {
  VQA_CHECK(buffer.numel() % info_.world_size == 0,
            std::string(what) + " needs a buffer of a multiple of " +
                std::to_string(info_.world_size) + " elements, got " +
                std::to_string(buffer.numel()));
  VQA_CHECK(buffer.numel() / info_.world_size <= std::numeric_limits<int>::max(),
            std::string(what) + ": blocks of more than 2^31 - 1 elements");
}

WorkHandle MpiCommunicator::enqueue(PendingCollective pending) {
  pending.work = std::make_shared<MpiWork>();
  WorkHandle work = pending.work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(pending));
  }
  queue_cv_.notify_one();
  return work;
}

void MpiCommunicator::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

void MpiCommunicator::progress_loop() {
  for (;;) {
    PendingCollective next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    run_collective(next);
    next.work->mark_done();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void MpiCommunicator::run_collective(PendingCollective& pending) {
  torch::Tensor& buffer = pending.buffer;
  const bool is_bf16 = buffer.scalar_type() == torch::kBFloat16;
  char* data = static_cast<char*>(buffer.data_ptr());
  const int64_t element_size = buffer.element_size();
  const int64_t bytes = buffer.numel() * element_size;
  const MPI_Datatype type = is_bf16 ? MPI_UINT16_T : MPI_FLOAT;
  const int block = static_cast<int>(buffer.numel() / info_.world_size);
  const double began = util::steady_seconds();
  const int64_t sequence = tracker_->begin(pending.kind, bytes);
  switch (pending.kind) {
    case CollectiveKind::kReduceScatter:
      reduce_scatter_in_place(data, block, element_size, type, is_bf16 ? bf16_sum_op_ : MPI_SUM);
      break;
    case CollectiveKind::kAllgather:
      VQA_CHECK_MPI_IN(tracker_.get(),
                       MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, block, type, comm_));
      break;
    default:
      sum_in_place(data, buffer.numel(), is_bf16, method_for(bytes));
      break;
  }
  tracker_->end(sequence);
  if (pending.op == ReduceOp::kAverage && info_.world_size > 1 &&
      pending.kind != CollectiveKind::kAllgather) {
    (pending.kind == CollectiveKind::kReduceScatter ? own_block(buffer) : buffer)
        .div_(static_cast<double>(info_.world_size));
  }
  if (pending.work) pending.work->set_times(began, util::steady_seconds());  // null: blocking call
}

void MpiCommunicator::reduce_scatter_in_place(char* data, int64_t block, int64_t element_size,
                                              MPI_Datatype type, MPI_Op op) {
  const int n = info_.world_size;
  const int64_t piece = std::max<int64_t>(1, kLibraryPieceBytes / (element_size * n));
  char* own = data + block * info_.rank * element_size;
  for (int64_t begin = 0; begin < block; begin += piece) {
    const int64_t length = std::min(piece, block - begin);
    const int64_t piece_bytes = length * element_size;
    const char* send = data;
    if (length < block) {
      library_pack_.resize(static_cast<size_t>(piece_bytes * n));
      for (int r = 0; r < n; ++r) {
        std::memcpy(library_pack_.data() + r * piece_bytes,
                    data + (r * block + begin) * element_size, static_cast<size_t>(piece_bytes));
      }
      send = library_pack_.data();
    }
    ring_scratch_.resize(static_cast<size_t>(piece_bytes));
    VQA_CHECK_MPI_IN(tracker_.get(),
                     MPI_Reduce_scatter_block(send, ring_scratch_.data(), static_cast<int>(length),
                                              type, op, comm_));
    std::memcpy(own + begin * element_size, ring_scratch_.data(), static_cast<size_t>(piece_bytes));
  }
}

AllreduceMethod MpiCommunicator::method_for(int64_t bytes) const {
  if (bytes < kRingMinBytes) return AllreduceMethod{};
  switch (algorithm_) {
    case MpiAllreduce::kRing:
      return AllreduceMethod{AllreduceAlgorithm::kRing, segment_bytes_};
    case MpiAllreduce::kAuto:
      return choices_.lookup(bytes);
    case MpiAllreduce::kLibrary:
      break;
  }
  return AllreduceMethod{};
}

void MpiCommunicator::sum_in_place(char* data, int64_t count, bool is_bf16,
                                   const AllreduceMethod& method) {
  if (method.algorithm == AllreduceAlgorithm::kRing) {
    ring_allreduce_sum(data, count, is_bf16 ? RingElement::kBFloat16 : RingElement::kFloat32,
                       method.segment_bytes, comm_, ring_scratch_, *tracker_);
    return;
  }
  const MPI_Datatype type = is_bf16 ? MPI_UINT16_T : MPI_FLOAT;
  const MPI_Op op = is_bf16 ? bf16_sum_op_ : MPI_SUM;
  const int64_t element_size = is_bf16 ? 2 : 4;
  const int n = info_.world_size;
  if (method.algorithm == AllreduceAlgorithm::kReduceScatterAllgather) {
    // In pieces of at most kLibraryPieceBytes; in each, rank r's block
    // (the first count % n blocks one larger) is reduced into the scratch
    // buffer, then every block is gathered back into place.
    const int64_t piece_elements = std::max<int64_t>(n, kLibraryPieceBytes / element_size);
    std::vector<int> counts(n), offsets(n);
    for (int64_t begin = 0; begin < count; begin += piece_elements) {
      const int64_t piece = std::min(piece_elements, count - begin);
      for (int r = 0, offset = 0; r < n; offset += counts[r], ++r) {
        counts[r] = static_cast<int>(piece / n + (r < piece % n ? 1 : 0));
        offsets[r] = offset;
      }
      char* part = data + begin * element_size;
      ring_scratch_.resize(static_cast<size_t>(counts[info_.rank] * element_size));
      VQA_CHECK_MPI_IN(tracker_.get(), MPI_Reduce_scatter(part, ring_scratch_.data(), counts.data(),
                                                          type, op, comm_));
      VQA_CHECK_MPI_IN(tracker_.get(),
                       MPI_Allgatherv(ring_scratch_.data(), counts[info_.rank], type, part,
                                      counts.data(), offsets.data(), type, comm_));
    }
    return;
  }
  const int64_t piece_elements = kLibraryPieceBytes / element_size;
  for (int64_t offset = 0; offset < count; offset += piece_elements) {
    const int part = static_cast<int>(std::min(piece_elements, count - offset));
    VQA_CHECK_MPI_IN(tracker_.get(), MPI_Allreduce(MPI_IN_PLACE, data + offset * element_size, part,
                                                   type, op, comm_));
  }
}

std::unique_ptr<Communicator> mpi_communicator_create(const RankInfo& info,
                                                      MpiAllreduce algorithm) {
  return std::make_unique<MpiCommunicator>(info, algorithm);
}

}  // namespace vqa::runtime
