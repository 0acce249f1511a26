// CPU backend: collectives on a duplicate of MPI_COMM_WORLD, run by one
// progress thread so that allreduce_async really overlaps the caller's work
// (Open MPI's non-blocking collectives only progress inside MPI calls).
// Every collective is reported to the watchdog (watchdog.h) by the thread
// that runs it, around the MPI call.
#include <mpi.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "runtime/allreduce_choice.h"   // AllreduceChoiceTable, AllreduceMethod
#include "runtime/check.h"              // VQA_CHECK_MPI, VQA_CHECK
#include "runtime/communicator.h"       // Communicator, Work
#include "runtime/communicator_impl.h"  // mpi_communicator_create
#include "runtime/mpi_collectives.h"    // mpi_allreduce_scalar, mpi_allgather_strings
#include "runtime/ring_allreduce.h"     // ring_allreduce_sum
#include "runtime/tracked_check.h"      // VQA_CHECK_MPI_IN
#include "runtime/watchdog_impl.h"      // CollectiveTracker
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

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const RankInfo& info, MpiAllreduce algorithm)
      : Communicator(info), algorithm_(algorithm) {
    VQA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    VQA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    VQA_CHECK_MPI(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_));
    tracker_ = std::make_unique<CollectiveTracker>(position());
    progress_thread_ = std::thread([this] { progress_loop(); });
  }

  ~MpiCommunicator() override {
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

  Backend backend() const override { return Backend::kMpi; }

  WorkHandle allreduce_async(const torch::Tensor& buffer, ReduceOp op) override {
    check_buffer(buffer, "allreduce_async");
    return enqueue(PendingCollective{CollectiveKind::kAllreduce, buffer, op, nullptr});
  }

  WorkHandle reduce_scatter_async(const torch::Tensor& buffer, ReduceOp op) override {
    check_buffer(buffer, "reduce_scatter_async");
    check_blocks(buffer, "reduce_scatter_async");
    return enqueue(PendingCollective{CollectiveKind::kReduceScatter, buffer, op, nullptr});
  }

  WorkHandle allgather_async(const torch::Tensor& buffer) override {
    check_buffer(buffer, "allgather_async");
    check_blocks(buffer, "allgather_async");
    return enqueue(PendingCollective{CollectiveKind::kAllgather, buffer, ReduceOp::kSum, nullptr});
  }

  // Runs on the calling thread once earlier work is done: a blocking call
  // gains nothing from the hand-off to the progress thread.
  void allreduce(const torch::Tensor& buffer, ReduceOp op) override {
    check_buffer(buffer, "allreduce");
    drain();
    PendingCollective pending{CollectiveKind::kAllreduce, buffer, op, nullptr};
    run_collective(pending);
  }

  // --mpi-allreduce auto: every power of two from 64 KiB up to `bytes` not
  // probed yet, each timed with the ring at both segment sizes, the
  // library's reduce-scatter + allgather and its allreduce; later allreduces
  // use the nearest size's choice. ring: the ring's segment size at `bytes`.
  // library: nothing to choose.
  std::string tune_allreduce(int64_t bytes) override {
    if (info_.world_size < 2 || bytes < kRingMinBytes) return "";
    if (algorithm_ == MpiAllreduce::kRing) return tune_ring_segment(bytes);
    if (algorithm_ == MpiAllreduce::kAuto) return tune_by_size(bytes);
    return "";
  }

  void library_allreduce_sum(const torch::Tensor& buffer) override {
    VQA_CHECK(buffer.device().is_cpu() && buffer.is_contiguous() &&
                  buffer.scalar_type() == torch::kFloat32,
              "library_allreduce_sum needs a contiguous float32 CPU tensor");
    drain();
    auto* data = buffer.data_ptr<float>();
    for (int64_t offset = 0; offset < buffer.numel(); offset += kMaxElementsPerCall) {
      const int part = static_cast<int>(std::min(kMaxElementsPerCall, buffer.numel() - offset));
      VQA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data + offset, part, MPI_FLOAT, MPI_SUM, comm_));
    }
  }

  void broadcast(const torch::Tensor& buffer, int root) override {
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

  void barrier() override {
    drain();
    const int64_t sequence = tracker_->begin(CollectiveKind::kBarrier, 0);
    VQA_CHECK_MPI_IN(tracker_.get(), MPI_Barrier(comm_));
    tracker_->end(sequence);
  }

  double allreduce_scalar(double value, ScalarOp op) override {
    drain();
    const int64_t sequence = tracker_->begin(CollectiveKind::kScalar, sizeof(double));
    const double result = mpi_allreduce_scalar(comm_, value, op, tracker_.get());
    tracker_->end(sequence);
    return result;
  }

  std::vector<std::string> gather_strings(const std::string& value) override {
    drain();
    const int64_t sequence = tracker_->begin(CollectiveKind::kGather, value.size());
    auto result = mpi_allgather_strings(comm_, value, tracker_.get());
    tracker_->end(sequence);
    return result;
  }

 private:
  void check_buffer(const torch::Tensor& buffer, const char* what) const {
    VQA_CHECK(buffer.device().is_cpu(), std::string("MPI communicator ") + what +
                                            " needs a CPU tensor, got " + buffer.device().str());
    VQA_CHECK(buffer.is_contiguous(), std::string(what) + " needs a contiguous tensor");
    VQA_CHECK(buffer.scalar_type() == torch::kFloat32 || buffer.scalar_type() == torch::kBFloat16,
              std::string(what) + " supports float32 and bfloat16, got " +
                  std::string(c10::toString(buffer.scalar_type())));
  }

  void check_blocks(const torch::Tensor& buffer, const char* what) const {
    VQA_CHECK(buffer.numel() % info_.world_size == 0,
              std::string(what) + " needs a buffer of a multiple of " +
                  std::to_string(info_.world_size) + " elements, got " +
                  std::to_string(buffer.numel()));
    VQA_CHECK(buffer.numel() / info_.world_size <= std::numeric_limits<int>::max(),
              std::string(what) + ": blocks of more than 2^31 - 1 elements");
  }

  WorkHandle enqueue(PendingCollective pending) {
    pending.work = std::make_shared<MpiWork>();
    WorkHandle work = pending.work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(pending));
    }
    queue_cv_.notify_one();
    return work;
  }

  // Collectives on comm_ must not interleave with the progress thread's, so
  // blocking calls from the main thread first wait for the queue to empty.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

  void progress_loop() {
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

  void run_collective(PendingCollective& pending) {
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
        VQA_CHECK_MPI_IN(tracker_.get(), MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data,
                                                       block, type, comm_));
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
    if (pending.work)
      pending.work->set_times(began, util::steady_seconds());  // null: blocking call
  }

  // Rank r's block of the sum, into place, in pieces of at most
  // kLibraryPieceBytes (Open MPI's reduce-scatter takes a temporary buffer
  // the size of the whole message too): piece p of every block, packed side
  // by side, is reduce-scattered into the scratch buffer, then copied into
  // rank r's block (MPI_IN_PLACE would put it at the buffer's start). A
  // bucket of at most kLibraryPieceBytes goes in one call, unpacked.
  // (The allgather stays one call: in place it runs at full speed at every
  // size, 4.5 ms for 64 MiB at 2 ranks over shared memory.)
  void reduce_scatter_in_place(char* data, int64_t block, int64_t element_size, MPI_Datatype type,
                               MPI_Op op) {
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
                       MPI_Reduce_scatter_block(send, ring_scratch_.data(),
                                                static_cast<int>(length), type, op, comm_));
      std::memcpy(own + begin * element_size, ring_scratch_.data(),
                  static_cast<size_t>(piece_bytes));
    }
  }

  AllreduceMethod method_for(int64_t bytes) const {
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

  void sum_in_place(char* data, int64_t count, bool is_bf16, const AllreduceMethod& method) {
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
        VQA_CHECK_MPI_IN(tracker_.get(), MPI_Reduce_scatter(part, ring_scratch_.data(),
                                                            counts.data(), type, op, comm_));
        VQA_CHECK_MPI_IN(tracker_.get(),
                         MPI_Allgatherv(ring_scratch_.data(), counts[info_.rank], type, part,
                                        counts.data(), offsets.data(), type, comm_));
      }
      return;
    }
    const int64_t piece_elements = kLibraryPieceBytes / element_size;
    for (int64_t offset = 0; offset < count; offset += piece_elements) {
      const int part = static_cast<int>(std::min(piece_elements, count - offset));
      VQA_CHECK_MPI_IN(tracker_.get(), MPI_Allreduce(MPI_IN_PLACE, data + offset * element_size,
                                                     part, type, op, comm_));
    }
  }

  // Seconds per float32 sum-allreduce of `buffer` with `method`, the slowest
  // rank's median of `rounds`, each the mean of `repeats` calls after a barrier.
  // Collective; the caller has drained the queue.
  double time_method(const torch::Tensor& buffer, const AllreduceMethod& method, int rounds,
                     int repeats) {
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

  double bus_gbps(int64_t bytes, double seconds) const {
    return static_cast<double>(bytes) / seconds * 2.0 * (info_.world_size - 1) / info_.world_size /
           1e9;
  }

  std::string tune_ring_segment(int64_t bytes) {
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
    segment_bytes_ =
        timings[1].seconds < timings[0].seconds ? kRingSegmentEager : kRingSegmentLarge;
    return text + " using " + std::to_string(segment_bytes_ >> 10) + " KiB";
  }

  std::string tune_by_size(int64_t bytes) {
    std::vector<int64_t> sizes;
    for (const int64_t size : allreduce_probe_sizes(kRingMinBytes, bytes)) {
      if (!choices_.has(size)) sizes.push_back(size);
    }
    if (sizes.empty()) return "";
    drain();
    auto buffer = torch::zeros({sizes.back() / 4}, torch::kFloat32);
    // The library runs in pieces of kLibraryPieceBytes here as in training.
    const std::vector<AllreduceMethod> candidates = {
        AllreduceMethod{AllreduceAlgorithm::kRing, kRingSegmentLarge},
        AllreduceMethod{AllreduceAlgorithm::kRing, kRingSegmentEager},
        AllreduceMethod{AllreduceAlgorithm::kReduceScatterAllgather, 0}, AllreduceMethod{}};
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

}  // namespace

std::unique_ptr<Communicator> mpi_communicator_create(const RankInfo& info,
                                                      MpiAllreduce algorithm) {
  return std::make_unique<MpiCommunicator>(info, algorithm);
}

}  // namespace vqa::runtime
