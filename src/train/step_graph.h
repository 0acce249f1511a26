// --cuda-graph: each optimiser step's forward and backward, with the bucket
// allreduces backward launches (NCCL), replayed as one CUDA graph.
//
// A base-size step dispatches about 79,000 operators on the CPU (docs/
// benchmarks.md, "Operators per step"); on a GPU the host's time to launch them is a fixed cost per
// step that a graph removes. The first kWarmupSteps steps run eagerly (cuBLAS, NCCL and the
// allocator settle, the optimiser's state is made); the next one is captured on a side stream: its
// batch's device copy becomes the graph's static input, its forward, loss, backward and gradient
// averaging are recorded (runtime/cuda_graph.h), and the graph is replayed to run it. Every later
// step copies its batch into the static input and replays. Non-finite checks, clipping and the
// optimiser run eagerly after the replay (their few fused kernels, and the learning rate the host
// sets each step).
//
// Shapes are fixed for the replay: a captured run pads every question to
// the dataset's length (as --trim-text-padding false); a batch of another
// shape (a short last batch) runs eagerly, and the log says so once. Where
// capture cannot work the run is the one without --cuda-graph (questions
// trimmed, the word embedding's sync chosen as without it) and train.log
// says why (step_graph_plan).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "data/loader.h"         // Batch
#include "runtime/cuda_graph.h"  // CudaGraph
#include "train/train_config.h"  // TrainConfig

namespace vqa::train {

class RunLog;  // train_log.h

struct StepGraphPlan {
  bool capture = false;
  // Asked for but not possible: why, for train.log; "" otherwise.
  std::string reason;
};

// Whether this run captures its steps: --cuda-graph, on a CUDA device, in a
// build that can capture (`unavailable` is runtime::cuda_graph_unavailable_reason()),
// with collectives that can be captured (`comm_unavailable` is the
// communicator's graph_capture_unavailable(): NCCL 2.9.6 or later; none
// with --no-comm), one micro-step per optimiser step, and no test fault
// inside the step.
StepGraphPlan step_graph_plan(const TrainConfig& config, const torch::Device& device,
                              const std::string& unavailable, const std::string& comm_unavailable);

// The line train.log gets for the plan ("" when --cuda-graph is off).
std::string step_graph_plan_describe(const StepGraphPlan& plan);

class StepGraph {
 public:
  // Eager optimiser steps before the capture.
  static constexpr int64_t kWarmupSteps = 3;

  // The graph itself is made at the capture (construction needs no CUDA:
  // the warm-up counting and the shape checks are tested on the CPU).
  explicit StepGraph(const torch::Device& device);

  // True when the graph is captured and `host_batch` has its shapes.
  bool replayable(const data::Batch& host_batch) const;
  // True when this step is to be captured: the warm-up steps have run,
  // nothing is captured yet, and `host_batch` is a full one of `full_batch`
  // samples (a short last batch is left to the eager path).
  bool capture_due(const data::Batch& host_batch, int64_t full_batch) const {
    return !captured() && eager_steps_ >= kWarmupSteps && host_batch.size() == full_batch;
  }
  // An eager step ran (counts the warm-up). With `host_batch` of a shape
  // other than the captured one, returns the log line for the first such
  // step ("" otherwise).
  std::string note_eager_step(const data::Batch& host_batch, int64_t global_step);

  // Captures `step` (forward, loss, backward, averaging; returns the loss)
  // on `device_batch`, which becomes the static input, then replays it once
  // to run this step. Returns the loss (the static output of every replay).
  torch::Tensor capture(const data::Batch& device_batch,
                        const std::function<torch::Tensor(const data::Batch&)>& step);
  // Copies a batch of the captured shapes (on the device, or the loader's
  // pinned host batch) into the static input, on the current stream. The
  // static input holds float32 images: a batch of bytes
  // (LoaderOptions::images_as_bytes) goes through batch_to_device first,
  // which normalises it, so the graph never sees the bytes.
  void load(const data::Batch& batch);
  // Replays the step on the static input; returns the loss (the static output).
  torch::Tensor replay();

 private:
  bool captured() const { return graph_ && graph_->captured(); }

  torch::Device device_;
  std::unique_ptr<runtime::CudaGraph> graph_;  // made at the capture
  data::Batch input_;                          // the static input: the captured step's device batch
  torch::Tensor loss_;                         // the static output
  int64_t eager_steps_ = 0;
  bool reported_shape_ = false;
};

// --cuda-graph: whether capture can work on this device, build and backend
// (step_graph_plan); the log says which and why. Call before the loaders
// are opened: a captured step needs fixed shapes, so where the plan
// captures, `config` pads every question to the dataset's length
// (trim_text_padding off); where it does not, the run is the one without
// --cuda-graph. Collective: every rank must come to the same plan.
StepGraphPlan plan_step_graph(TrainConfig& config, const torch::Device& device, RunLog& log);
// The step graph where `plan` captures, nullptr otherwise. With a graph, the
// rest of the run computes on a side stream
// (runtime::cuda_make_pool_stream_current): call before the gradient buckets
// and the optimiser are made.
std::unique_ptr<StepGraph> setup_step_graph(const StepGraphPlan& plan, const torch::Device& device);

}  // namespace vqa::train
