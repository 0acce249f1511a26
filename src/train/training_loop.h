// The run after start-up: the epochs, what each epoch's end does
// (evaluation when due, the step report and diagnosis, the log line,
// checkpoints), the checkpoint of a stop request, and DONE.
#pragma once

#include <string>

#include "data/loader.h"        // ShardedLoader
#include "train/comm_setup.h"   // AllreduceProbe
#include "train/train_state.h"  // TrainState
#include "train/trainer.h"      // TrainingParts

namespace vqa::train {

// Trains epochs state.next_epoch .. --epochs - 1 and returns the job's exit
// status: 0 once the last epoch is done (with --export-m3ae the final model
// written under M3AE's names, then <out>/DONE written last, so that a
// relaunch with --resume auto does nothing), runtime::kExitStopRequested
// after the ranks agreed to stop on a signal (the stop checkpoint written).
// config_ini is the resolved configuration, saved in every checkpoint.
// Collective; main thread.
int run_training(TrainingParts& parts, data::ShardedLoader& train_loader,
                 data::ShardedLoader& test_loader, const AllreduceProbe& probe,
                 const std::string& config_ini, TrainState& state);

// --eval-only: one evaluation of the test split on every rank with the
// weights already loaded (model_source names them for the log), accuracy
// overall / open / closed and per question type in the log and metrics.jsonl,
// and with --predictions FILE one JSON line per question (evaluation.h),
// written by rank 0 in question-id order, and with --export-m3ae FILE the
// model under M3AE's names. Returns the exit status (0).
// Collective.
int run_evaluation_only(TrainingParts& parts, data::ShardedLoader& test_loader,
                        const std::string& model_source);

}  // namespace vqa::train
