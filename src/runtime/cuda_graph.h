// CUDA graphs: a piece of device work recorded once and replayed as one
// launch (--cuda-graph, train/step_graph.h). The training step's forward and
// backward queue some 10,000 kernels; replaying them as a graph takes the
// host's per-kernel launch cost out of the step.
//
// What may run inside capture: kernels on the current stream and on streams
// that join it through events (the NCCL communicator's stream does, see
// communicator.h: watch_replayed_graph), allocations through LibTorch's
// caching allocator (they come from the graph's private memory pool and keep
// their addresses at every replay). What may not: anything that waits for
// the device (.item(), a host copy, cudaStreamSynchronize) or allocates
// outside the allocator; CUDA then invalidates the capture and capture()
// throws with CUDA's reason.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

namespace vqa::runtime {

// "" when this build can capture CUDA graphs (a CUDA LibTorch 2.x with the
// CUDA runtime), else the reason it cannot, for the log.
std::string cuda_graph_unavailable_reason();

// Makes a stream from LibTorch's pool the calling thread's current stream on
// `device` for the rest of the process, ordered after the work queued so
// far on the previous one. Call before the parameters' gradient hooks are
// set up: autograd runs each parameter's AccumulateGrad node (and its hooks,
// the gradient buckets' copies and collectives) on the stream that was
// current when the node was made, and a node on the default stream breaks a
// capture (the default stream cannot join one; PyTorch asks DDP to be
// constructed on the side stream it captures on, for the same reason).
// Throws where cuda_graph_unavailable_reason() is not empty.
void cuda_make_pool_stream_current(const torch::Device& device);

class CudaGraph {
 public:
  // A graph for work on `device` (a CUDA device); throws where
  // cuda_graph_unavailable_reason() is not empty.
  explicit CudaGraph(const torch::Device& device);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs `work` with the device work it queues on the current stream (which
  // must not be the default stream: cuda_make_pool_stream_current) captured:
  // none of it runs now. The capture is CUDA's thread-local mode: other
  // threads (the loader's, pinning host memory) may go on calling CUDA.
  // Dropout and other random kernels draw from LibTorch's CUDA generator at
  // each replay (its seed and offset then). Throws with CUDA's reason when
  // the capture fails; LibTorch's allocator and generator may then be left
  // in capture mode, so the process cannot go on training on the GPU: the
  // caller ends the job.
  void capture(const std::function<void()>& work);
  // Launches the captured work on the current stream.
  void replay();
  bool captured() const { return captured_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  bool captured_ = false;
};

}  // namespace vqa::runtime
