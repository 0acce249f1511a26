#include "runtime/cuda_graph.h"

#include <torch/version.h>

#if defined(VQA_TORCH_HAS_CUDA) && TORCH_VERSION_MAJOR >= 2
#define VQA_HAVE_CUDA_GRAPH 1
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <stdexcept>

#include "runtime/check.h"  // VQA_CHECK

namespace vqa::runtime {

std::string cuda_graph_unavailable_reason() {
#ifdef VQA_HAVE_CUDA_GRAPH
  return "";
#elif TORCH_VERSION_MAJOR < 2
  return "this build's LibTorch " TORCH_VERSION " predates the CUDA graph API used (2.0)";
#else
  return "this build's LibTorch has no CUDA (or the build has no CUDA runtime: VQA_WITH_NCCL)";
#endif
}

namespace {

void require_cuda(const torch::Device& device) {
  if (!device.is_cuda()) {
    throw std::invalid_argument("CUDA graphs need a CUDA device, got " + device.str());
  }
}

}  // namespace

#ifdef VQA_HAVE_CUDA_GRAPH

namespace {

c10::DeviceIndex device_index(const torch::Device& device) {
  require_cuda(device);
  return device.index() < 0 ? c10::cuda::current_device() : device.index();
}

}  // namespace

void cuda_make_pool_stream_current(const torch::Device& device) {
  const c10::DeviceIndex index = device_index(device);
  const c10::cuda::CUDAStream before = c10::cuda::getCurrentCUDAStream(index);
  const c10::cuda::CUDAStream pool = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  at::cuda::CUDAEvent queued;
  queued.record(before);
  queued.block(pool);
  c10::cuda::setCurrentCUDAStream(pool);
}

struct CudaGraph::State {
  explicit State(c10::DeviceIndex index) : device(index) {}
  c10::DeviceIndex device;
  at::cuda::CUDAGraph graph;
};

CudaGraph::CudaGraph(const torch::Device& device)
    : state_(std::make_unique<State>(device_index(device))) {}

CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>& work) {
  VQA_CHECK(!captured_, "this CUDA graph is captured already");
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(state_->device);
  if (stream == c10::cuda::getDefaultCUDAStream(state_->device)) {
    throw std::logic_error(
        "a CUDA graph cannot be captured on the default stream "
        "(cuda_make_pool_stream_current first)");
  }
  state_->graph.capture_begin(/*pool=*/{0, 0}, cudaStreamCaptureModeThreadLocal);
  try {
    work();
  } catch (...) {
    // Ends the stream's capture (then throws: the graph is invalid); the
    // caller ends the job, see the header.
    try {
      state_->graph.capture_end();
    } catch (...) {
    }
    throw;
  }
  state_->graph.capture_end();
  captured_ = true;
}

void CudaGraph::replay() {
  VQA_CHECK(captured_, "replay of a CUDA graph that was not captured");
  state_->graph.replay();  // on the current stream
}

#else

namespace {

[[noreturn]] void throw_unavailable() {
  throw std::runtime_error("CUDA graphs are not available: " + cuda_graph_unavailable_reason());
}

}  // namespace

void cuda_make_pool_stream_current(const torch::Device& /*device*/) { throw_unavailable(); }

struct CudaGraph::State {};

CudaGraph::CudaGraph(const torch::Device& device) {
  require_cuda(device);
  throw_unavailable();
}

CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>& /*work*/) { throw_unavailable(); }

void CudaGraph::replay() { throw_unavailable(); }

#endif

}  // namespace vqa::runtime
