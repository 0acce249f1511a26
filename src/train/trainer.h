// One epoch of data-parallel training, as free functions over the parts
// main() builds: each optimiser step (train_step) runs its micro-steps'
// forward and backward while the gradient buckets are averaged, then the
// non-finite check, clipping and the optimiser. The step is in
// train_step.cpp, the epoch in trainer.cpp, the gradients' checks between
// backward and the optimiser in gradient_checks.cpp.
#pragma once

#include <torch/torch.h>

#include "data/loader.h"               // ShardedLoader
#include "model/m3ae.h"                // M3AE
#include "runtime/communicator.h"      // Communicator
#include "runtime/stop_request.h"      // StopAgreement
#include "train/allreduce_autotune.h"  // AllreduceAutotune
#include "train/batches.h"             // DeviceBatchCopy
#include "train/deferred_flag.h"       // DeferredFlag
#include "train/gradient_sync.h"       // GradientSynchronizer
#include "train/loss_scaler.h"         // LossScaler
#include "train/optimizer.h"           // VqaOptimizer
#include "train/profile.h"             // OperatorProfile
#include "train/step_graph.h"          // StepGraph
#include "train/step_timer.h"          // StepTimer
#include "train/timeline.h"            // Timeline
#include "train/train_config.h"        // TrainConfig, FaultInjection
#include "train/train_log.h"           // RunLog
#include "train/train_state.h"         // TrainState, EpochStats

namespace vqa::train {

// What the training loop works with; main() owns every part, the loop
// borrows them. Every member has its own type, so the braced list that
// builds it cannot put one part in another's place unnoticed.
struct TrainingParts {
  const TrainConfig& config;
  const torch::Device device;
  model::M3AE& model;
  VqaOptimizer& optimizer;
  GradientSynchronizer& gradients;
  runtime::Communicator& comm;
  StepTimer& timer;
  Timeline& timeline;
  RunLog& log;
  LossScaler* scaler = nullptr;        // --precision fp16, else none
  OperatorProfile* profile = nullptr;  // --profile, else none
  StepGraph* graph = nullptr;          // --cuda-graph where capture works, else none
  DeviceBatchCopy* copy = nullptr;  // batches to the device (--copy-stream); none: the plain copy
  AllreduceAutotune* autotune = nullptr;  // --mpi-allreduce auto's trials in training, else none
};

// Optimiser steps one epoch takes with this loader and configuration.
int64_t optimizer_steps_per_epoch(const data::ShardedLoader& loader, const TrainConfig& config);

// Exit status when a non-finite loss or gradient stops the job (--nonfinite stop).
constexpr int kExitNonFinite = 3;

// Under this loss scale a non-finite gradient is not taken for an fp16
// overflow: the --nonfinite policy applies.
constexpr double kMinLossScale = 1.0;

// A loss scale as the log writes it (%.6g).
std::string format_loss_scale(double scale);

// The name of the first parameter whose gradient (or value, with
// check_values) holds a NaN or an infinity, or "" when all are finite.
// Reads every tensor to the host: for the rare path after a failed check.
std::string first_nonfinite_parameter(model::M3AE& model, bool check_values);

// Scales the gradients so that their global L2 norm is at most max_norm.
// Unlike torch::nn::utils::clip_grad_norm_, which returns the norm as a host
// double, the scale stays on the device: no host synchronisation per step.
void clip_gradient_norm(const std::vector<torch::Tensor>& parameters, double max_norm);

// A step whose skip decision (a non-finite gradient, an fp16 overflow) was
// left on the device: the optimiser made it a no-op there if so, and the
// host reads the flag a step later (settle_deferred_skip) for the message,
// the count, the --nonfinite stop exit and the loss totals.
struct DeferredSkip {
  DeferredFlag flag;
  int64_t epoch = 0, step = 0;
  int64_t samples = 0;  // the step's samples, already in the epoch's count
};

// One optimiser step, state.global_step: its micro-steps' batches from
// `loader`, forward, backward (the buckets are averaged over the ranks as
// backward runs), then the non-finite policy, clipping and the optimiser.
// Adds the step's loss sum (on the device) and sample count to the running
// totals unless the step was dropped as non-finite (--nonfinite skip, an
// fp16 overflow). Advances state.global_step either way. Adds the main
// thread's CPU seconds in forward and backward to `compute_cpu_seconds`.
// Returns how many dropped steps it learnt of: this one, decided by the host
// (CPU, or LibTorch without ATen's fused AdamW), or, where the optimiser
// skips on the device (VqaOptimizer::masks_on_device), the previous step,
// whose flag `deferred` held (this step's takes its place).
int64_t train_step(TrainingParts& parts, data::ShardedLoader& loader, int64_t epoch,
                   TrainState& state, torch::Tensor& loss_sum, int64_t& samples,
                   double& compute_cpu_seconds, DeferredSkip& deferred);

// Reads a deferred flag, if one is pending: when the step was skipped, takes
// its samples out of the count (its loss was kept out on the device), its
// count off the optimiser's
// states, says so in the log (or ends the job under --nonfinite stop) and
// returns 1; else 0.
int64_t settle_deferred_skip(TrainingParts& parts, DeferredSkip& deferred, int64_t& samples);

// Runs the optimiser steps of epoch state.next_epoch from state.step_in_epoch
// on. At every step boundary every rank polls `stop`; when the ranks agree
// to stop, the epoch ends early with stop_signal set and `state` describing
// the position (ready for checkpoint_save); otherwise state moves to the next
// epoch. Randomness is seeded per optimiser step, so a resumed run draws what
// the uninterrupted one would have.
EpochStats train_epoch(TrainingParts& parts, data::ShardedLoader& loader,
                       runtime::StopAgreement& stop, TrainState& state);

}  // namespace vqa::train
