// One epoch of data-parallel training and one distributed evaluation, as free
// functions over the model, the loaders, the optimiser and the communicator.
#pragma once

#include <torch/torch.h>

#include "data/loader.h"           // ShardedLoader, Batch
#include "model/m3ae.h"            // M3AE
#include "runtime/communicator.h"  // Communicator
#include "runtime/stop_request.h"  // StopAgreement
#include "train/config.h"          // TrainConfig
#include "train/gradient_sync.h"   // GradientSynchronizer
#include "train/metrics.h"         // Accuracy
#include "train/optimizer.h"       // VqaOptimizer
#include "train/step_timer.h"      // StepTimer, StepTimes
#include "train/timeline.h"        // Timeline

namespace vqa::train {

// Where the run is; saved in checkpoints.
struct TrainState {
  int64_t next_epoch = 0;   // first epoch still to run
  int64_t global_step = 0;  // optimiser steps taken
  double best_overall = -1.0;
  int64_t best_epoch = -1;
  // A run stopped inside an epoch (a stop request): the optimiser steps of
  // next_epoch already taken, and every rank's running loss sum and sample
  // count for that epoch, in rank order, so the resumed epoch reports what
  // the uninterrupted one would have.
  int64_t step_in_epoch = 0;
  std::vector<double> partial_loss_sums;
  std::vector<int64_t> partial_samples;
};

struct EpochStats {
  double mean_loss = 0.0;  // over every sample of every rank
  double seconds = 0.0;    // of this process's part of the epoch
  int64_t optimizer_steps = 0;
  int64_t samples = 0;        // over all ranks, padding included, the whole epoch
  int64_t timed_samples = 0;  // over all ranks, in `seconds` (less after a mid-epoch resume)
  int64_t skipped_steps = 0;  // non-finite steps dropped (--nonfinite skip)
  int stop_signal = 0;        // non-zero: the ranks agreed to stop inside this epoch
  std::vector<StepTimes> step_times;  // this rank's timed steps (empty with timers off)
  double data_wait_seconds = 0.0;     // this rank
  double comm_wait_seconds = 0.0;     // this rank: finish_backward's wait
  double learning_rate = 0.0;         // encoders' lr at the last step
};

struct EvalStats {
  Accuracy accuracy;
  double mean_loss = 0.0;
  double seconds = 0.0;
};

// Optimiser steps one epoch takes with this loader and configuration.
int64_t optimizer_steps_per_epoch(const data::ShardedLoader& loader, const TrainConfig& config);

// Moves a batch's model inputs to `device` (non-blocking from pinned memory on GPU).
data::Batch batch_to_device(const data::Batch& batch, const torch::Device& device);

// BCE with logits on the soft targets, times K (M3AE's loss): the mean over
// the batch of the sum over answer labels.
torch::Tensor vqa_loss(const torch::Tensor& logits, const torch::Tensor& targets);

// Exit status when a non-finite loss or gradient stops the job (--nonfinite stop).
constexpr int kExitNonFinite = 3;

// The name of the first parameter whose gradient (or value, with
// check_values) holds a NaN or an infinity, or "" when all are finite.
// Reads every tensor to the host: for the rare path after a failed check.
std::string first_nonfinite_parameter(model::M3AE& model, bool check_values);

// Scales the gradients so that their global L2 norm is at most max_norm.
// Unlike torch::nn::utils::clip_grad_norm_, which returns the norm as a host
// double, the scale stays on the device: no host synchronisation per step.
void clip_gradient_norm(const std::vector<torch::Tensor>& parameters, double max_norm);

// Runs the optimiser steps of epoch state.next_epoch from state.step_in_epoch
// on. At every step boundary every rank polls `stop`; when the ranks agree
// to stop, the epoch ends early with stop_signal set and `state` describing
// the position (ready for checkpoint_save); otherwise state moves to the next
// epoch. Randomness is seeded per optimiser step, so a resumed run draws what
// the uninterrupted one would have.
EpochStats train_epoch(model::M3AE& model, data::ShardedLoader& loader, VqaOptimizer& optimizer,
                       GradientSynchronizer& gradients, runtime::Communicator& comm,
                       runtime::StopAgreement& stop, StepTimer& timer, Timeline& timeline,
                       const TrainConfig& config, const torch::Device& device, TrainState& state);

// Every rank evaluates its shard of the test split; counts are summed.
EvalStats evaluate(model::M3AE& model, data::ShardedLoader& loader, runtime::Communicator& comm,
                   const torch::Device& device, int64_t epoch, bool bf16_autocast);

}  // namespace vqa::train
