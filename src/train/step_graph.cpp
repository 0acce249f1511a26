#include "train/step_graph.h"

#include <sstream>

#include "runtime/check.h"       // VQA_CHECK
#include "runtime/cuda_graph.h"  // cuda_graph_unavailable_reason, graph_capture_unavailable
#include "train/setup.h"         // require_same_setting_on_all_ranks
#include "train/train_log.h"     // RunLog

namespace vqa::train {

namespace {

// "[16, 3, 384, 384]" and so on, for the log.
std::string shape_text(const torch::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.sizes();
  return text.str();
}

// The model's inputs: what the graph reads from its static input.
constexpr torch::Tensor data::Batch::*kModelInputs[] = {
    &data::Batch::images, &data::Batch::token_ids, &data::Batch::attention_mask,
    &data::Batch::targets};

}  // namespace

StepGraphPlan step_graph_plan(const TrainConfig& config, const torch::Device& device,
                              const std::string& unavailable, const std::string& comm_unavailable) {
  if (!config.cuda_graph) return {};
  if (!device.is_cuda()) return {false, "the device is the CPU"};
  if (!unavailable.empty()) return {false, unavailable};
  if (!comm_unavailable.empty() && !config.no_comm) return {false, comm_unavailable};
  if (config.accumulation_steps > 1) {
    return {false, std::to_string(config.accumulation_steps) +
                       " micro-steps per optimiser step (accumulation): one graph is captured "
                       "only for one micro-step per step"};
  }
  if (config.faults.nan_step >= 0 || config.faults.slow_rank >= 0) {
    return {false, "a --test-nan-step or --test-slow-rank fault acts inside the step"};
  }
  return {true, ""};
}

std::string step_graph_plan_describe(const StepGraphPlan& plan) {
  if (plan.capture) {
    return "CUDA graph: on: after " + std::to_string(StepGraph::kWarmupSteps) +
           " eager steps, each step's forward, backward and gradient averaging replay as one "
           "graph; questions padded to the dataset's length";
  }
  if (!plan.reason.empty()) return "CUDA graph: eager steps (" + plan.reason + ")";
  return "";
}

static_assert(StepGraph::kWarmupSteps == 3,
              "--cuda-graph's help (train_config.cpp) says 3 eager steps");

StepGraph::StepGraph(const torch::Device& device) : device_(device) {}

bool StepGraph::replayable(const data::Batch& host_batch) const {
  if (!captured()) return false;
  for (const auto field : kModelInputs) {
    const torch::Tensor& given = host_batch.*field;
    if (!given.defined() || given.sizes() != (input_.*field).sizes()) return false;
  }
  return true;
}

std::string StepGraph::note_eager_step(const data::Batch& host_batch, int64_t global_step) {
  ++eager_steps_;
  if (!captured() || reported_shape_) return "";
  reported_shape_ = true;
  return "CUDA graph: step " + std::to_string(global_step) + " runs eagerly: its batch (images " +
         shape_text(host_batch.images) + ", questions " + shape_text(host_batch.token_ids) +
         ") is not of the captured shapes (" + shape_text(input_.images) + ", " +
         shape_text(input_.token_ids) + "); later such steps are not logged";
}

torch::Tensor StepGraph::capture(const data::Batch& device_batch,
                                 const std::function<torch::Tensor(const data::Batch&)>& step) {
  input_ = device_batch;
  graph_ = std::make_unique<runtime::CudaGraph>(device_);
  graph_->capture([&] { loss_ = step(input_); });
  graph_->replay();
  return loss_;
}

void StepGraph::load(const data::Batch& batch) {
  VQA_CHECK(replayable(batch), "a batch of shapes the CUDA graph was not captured for");
  // Bytes copied into the float32 images would skip the normalisation.
  VQA_CHECK(batch.images.scalar_type() == input_.images.scalar_type(),
            "a batch whose images are not normalised (batch_to_device first) for the CUDA graph");
  for (const auto field : kModelInputs) {
    (input_.*field).copy_(batch.*field, /*non_blocking=*/true);
  }
}

torch::Tensor StepGraph::replay() {
  VQA_CHECK(captured(), "replay of a step graph that was not captured");
  graph_->replay();
  return loss_;
}

StepGraphPlan plan_step_graph(TrainConfig& config, const torch::Device& device, RunLog& log) {
  if (!config.cuda_graph) return {};
  const StepGraphPlan plan =
      step_graph_plan(config, device, runtime::cuda_graph_unavailable_reason(),
                      runtime::graph_capture_unavailable(config.backend, device));
  const std::string line = step_graph_plan_describe(plan);
  log.info(line);
  // Every rank must decide alike (a rank that pads and syncs the whole word
  // embedding beside one that does not would send other collectives): the
  // NCCL library, say, is each node's own.
  require_same_setting_on_all_ranks("CUDA graph plan", line);
  if (plan.capture) config.trim_text_padding = false;  // one question length: fixed shapes
  return plan;
}

std::unique_ptr<StepGraph> setup_step_graph(const StepGraphPlan& plan,
                                            const torch::Device& device) {
  if (!plan.capture) return nullptr;
  runtime::cuda_make_pool_stream_current(device);  // before the gradient hooks: cuda_graph.h
  return std::make_unique<StepGraph>(device);
}

}  // namespace vqa::train
