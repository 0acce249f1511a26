#include "runtime/stream_clock.h"

#include <chrono>
#include <deque>
#include <vector>

#ifdef VQA_HAVE_NCCL
#include <cuda_runtime.h>

#include "runtime/gpu_check.h"  // VQA_CHECK_CUDA
#endif
#ifdef VQA_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "runtime/check.h"  // VQA_CHECK

namespace vqa::runtime {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

struct StreamClock::State {
  Clock::time_point start = Clock::now();
  int64_t first_id = 0;           // id of marks.front()
  std::deque<double> host_marks;  // CPU: seconds since start, per mark
#ifdef VQA_HAVE_NCCL
  bool gpu = false;
  int device = 0;
  cudaEvent_t origin = nullptr;           // recorded at creation
  std::deque<cudaEvent_t> gpu_marks;      // per mark
  std::vector<cudaEvent_t> spare_events;  // released, ready for reuse

  cudaStream_t stream() const {
#ifdef VQA_TORCH_HAS_CUDA
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
    return cudaStreamLegacy;
#endif
  }
  cudaEvent_t take_event() {
    if (!spare_events.empty()) {
      cudaEvent_t event = spare_events.back();
      spare_events.pop_back();
      return event;
    }
    cudaEvent_t event = nullptr;
    VQA_CHECK_CUDA(cudaEventCreate(&event));
    return event;
  }
#endif
};

StreamClock::StreamClock(const torch::Device& device) : state_(std::make_unique<State>()) {
  if (!device.is_cuda()) return;
#ifdef VQA_HAVE_NCCL
  state_->gpu = true;
  state_->device = device.has_index() ? device.index() : 0;
  VQA_CHECK_CUDA(cudaSetDevice(state_->device));
  state_->origin = state_->take_event();
  VQA_CHECK_CUDA(cudaEventRecord(state_->origin, state_->stream()));
  state_->start = Clock::now();
#else
  VQA_CHECK(false, "a CUDA device without the CUDA build of vqa-hpc");
#endif
}

StreamClock::~StreamClock() {
#ifdef VQA_HAVE_NCCL
  if (!state_->gpu) return;
  for (cudaEvent_t event : state_->gpu_marks) cudaEventDestroy(event);
  for (cudaEvent_t event : state_->spare_events) cudaEventDestroy(event);
  cudaEventDestroy(state_->origin);
#endif
}

int64_t StreamClock::mark() {
#ifdef VQA_HAVE_NCCL
  if (state_->gpu) {
    cudaEvent_t event = state_->take_event();
    VQA_CHECK_CUDA(cudaEventRecord(event, state_->stream()));
    state_->gpu_marks.push_back(event);
    return state_->first_id + static_cast<int64_t>(state_->gpu_marks.size()) - 1;
  }
#endif
  state_->host_marks.push_back(host_now());
  return state_->first_id + static_cast<int64_t>(state_->host_marks.size()) - 1;
}

bool StreamClock::seconds_at(int64_t id, bool wait, double* seconds) {
  VQA_CHECK(id >= state_->first_id, "StreamClock: mark " + std::to_string(id) + " was released");
  const auto index = static_cast<size_t>(id - state_->first_id);
#ifdef VQA_HAVE_NCCL
  if (state_->gpu) {
    VQA_CHECK(index < state_->gpu_marks.size(), "StreamClock: no mark " + std::to_string(id));
    cudaEvent_t event = state_->gpu_marks[index];
    if (wait) {
      VQA_CHECK_CUDA(cudaEventSynchronize(event));
    } else {
      const cudaError_t status = cudaEventQuery(event);
      if (status == cudaErrorNotReady) return false;
      VQA_CHECK_CUDA(status);
    }
    float milliseconds = 0.0f;
    VQA_CHECK_CUDA(cudaEventElapsedTime(&milliseconds, state_->origin, event));
    *seconds = 1e-3 * milliseconds;
    return true;
  }
#endif
  (void)wait;
  VQA_CHECK(index < state_->host_marks.size(), "StreamClock: no mark " + std::to_string(id));
  *seconds = state_->host_marks[index];
  return true;
}

void StreamClock::release_before(int64_t id) {
  while (state_->first_id < id) {
#ifdef VQA_HAVE_NCCL
    if (state_->gpu) {
      if (state_->gpu_marks.empty()) break;
      state_->spare_events.push_back(state_->gpu_marks.front());
      state_->gpu_marks.pop_front();
      ++state_->first_id;
      continue;
    }
#endif
    if (state_->host_marks.empty()) break;
    state_->host_marks.pop_front();
    ++state_->first_id;
  }
}

double StreamClock::from_steady(double steady_seconds) const {
  return steady_seconds - std::chrono::duration<double>(state_->start.time_since_epoch()).count();
}

double StreamClock::host_now() const {
  return std::chrono::duration<double>(Clock::now() - state_->start).count();
}

}  // namespace vqa::runtime
