// The state of a run that the loop, the checkpoints and the run log share:
// where the run is (TrainState, saved in checkpoints) and what an epoch of
// training and an evaluation measured. Plain data, no behaviour.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/metrics.h"     // Accuracy
#include "train/step_timer.h"  // StepTimes

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
  // --precision fp16: the loss scaler's scale and finite steps since its last
  // change (0: no scaler state, a fresh scaler starts at 2^16).
  double loss_scale = 0.0;
  int64_t loss_scale_growth = 0;
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
  double compute_cpu_seconds = 0.0;   // this rank's main thread CPU time in forward + backward
  double learning_rate = 0.0;         // encoders' lr at the last step
  double loss_scale = 0.0;            // fp16: the loss scale at the end (0: none)
};

// Accuracy over the questions of one question type (the dataset's
// /vocab/question_types; "unknown" for questions without one).
struct QuestionTypeScore {
  std::string name;
  int64_t correct = 0, total = 0;
};

struct EvalStats {
  Accuracy accuracy;
  double mean_loss = 0.0;
  double seconds = 0.0;
  std::vector<QuestionTypeScore> by_question_type;  // types with questions, in code order
  // Rank 0, when predictions were asked for: one JSON object per question
  // (see evaluation.h), in question-id order. Empty on other ranks.
  std::vector<std::string> predictions;
};

}  // namespace vqa::train
