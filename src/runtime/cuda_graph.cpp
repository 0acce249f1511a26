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

#ifdef VQA_HAVE_CUDA_GRAPH

struct CudaGraph::State {
  explicit State(c10::DeviceIndex index)
      : device(index), side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)) {}
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;  // capture needs a stream other than the default one
  at::cuda::CUDAGraph graph;
};

CudaGraph::CudaGraph(const torch::Device& device) {
  if (!device.is_cuda()) {
    throw std::invalid_argument("CUDA graphs need a CUDA device, got " + device.str());
  }
  state_ =
      std::make_unique<State>(device.index() < 0 ? c10::cuda::current_device() : device.index());
}

CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>& work) {
  VQA_CHECK(!captured_, "this CUDA graph is captured already");
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(state_->device);
  // The side stream starts after everything queued so far (the inputs'
  // copies among it), and the caller's stream continues after the capture.
  at::cuda::CUDAEvent before;
  before.record(caller);
  before.block(state_->side);
  {
    c10::cuda::CUDAStreamGuard on_side(state_->side);
    state_->graph.capture_begin();
    try {
      work();
    } catch (...) {
      // End the capture so the stream and the allocator leave capture mode;
      // the partial graph is invalid and capture_end says so, too.
      try {
        state_->graph.capture_end();
      } catch (...) {
      }
      state_->graph.reset();
      throw;
    }
    state_->graph.capture_end();
  }
  at::cuda::CUDAEvent after;
  after.record(state_->side);
  after.block(caller);
  captured_ = true;
}

void CudaGraph::replay() {
  VQA_CHECK(captured_, "replay of a CUDA graph that was not captured");
  state_->graph.replay();  // on the current stream
}

#else

struct CudaGraph::State {};

CudaGraph::CudaGraph(const torch::Device& /*device*/) {
  throw std::runtime_error("CUDA graphs are not available: " + cuda_graph_unavailable_reason());
}

CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>& /*work*/) {
  VQA_CHECK(false, "CUDA graphs are not available: " + cuda_graph_unavailable_reason());
}

void CudaGraph::replay() {
  VQA_CHECK(false, "CUDA graphs are not available: " + cuda_graph_unavailable_reason());
}

#endif

}  // namespace vqa::runtime
