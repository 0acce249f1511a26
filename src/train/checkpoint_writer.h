// Checkpoints written while training goes on (--async-checkpoint on, the
// default), and the synchronous save it replaces.
//
// At a save, rank 0 copies the state to host memory in the step: every
// parameter and buffer of the model and every AdamW moment, as a clone on the
// CPU (training goes on updating the parameters in place) or into pinned
// host tensors from a GPU. A background thread then serialises that copy
// with LibTorch and writes it exactly as checkpoint_save does: F.tmp, fsync,
// sidecar, rename, `latest` last, rotation (checkpoint.h). A kill at any
// moment of the write leaves F.tmp, which no resume reads (the next save
// removes it), and `latest` naming the previous complete checkpoint.
//
// At most one save is in flight: a save that finds the previous one still
// writing waits for it and says so in train.log. A stop request and the end
// of the run wait for the write in flight before they exit (the DONE marker
// comes after the last checkpoint).
//
// A failed background write ends the job as a synchronous one does: the
// writer thread calls runtime::fatal_user_error (MPI_THREAD_MULTIPLE is
// required at start-up, distributed.cpp), whose MPI_Abort ends every rank at
// once with kExitCheckpointWriteFailed and the message naming the file and
// the last good checkpoint; nothing waits for the next collective.
//
// Cost: one host copy of the state (about 3x the weights with AdamW's two
// moments), allocated at the first save and reused by every later one until
// the run ends; the copy itself in the step (memory bandwidth); and the
// writer thread's CPU time (serialisation, two CRC passes, the write) while
// training runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "model/m3ae.h"         // M3AE
#include "train/optimizer.h"    // VqaOptimizer
#include "train/train_log.h"    // RunLog
#include "train/train_state.h"  // TrainState

namespace vqa::train {

// Rank 0's checkpoint saves. Main thread only; one writer per run.
class CheckpointWriter {
 public:
  // asynchronous: write in a background thread (false: checkpoint_save's
  // synchronous write). kill_in_write > 0: testing only
  // (--test-kill-in-checkpoint-write), the write of this process's
  // kill_in_write-th checkpoint SIGKILLs the process once its first bytes are
  // in the temporary file.
  CheckpointWriter(bool asynchronous, int64_t kill_in_write = 0);
  // Waits for the write in flight.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves <out>/checkpoints/NAME for `state` (with the optimiser's state;
  // nullptr: no checkpoint) and, when `best`, <out>/best_model.pt, as
  // checkpoint_save and checkpoint_save_best do. Waits first for the
  // previous save in flight. Logs the time training was blocked. Returns the
  // checkpoint's path ("" without one), complete once wait() returns.
  std::string save(const std::string& out_dir, model::M3AE& model, VqaOptimizer* optimizer,
                   const TrainState& state, const std::string& config_ini, int keep_checkpoints,
                   bool best, RunLog& log);

  // Waits for the write in flight, if any; logs how long it took.
  void wait(RunLog& log);

 private:
  void join(RunLog& log);

  bool asynchronous_;
  int64_t kill_in_write_;
  int64_t checkpoints_ = 0;  // checkpoints saved so far
  std::thread thread_;
  std::string in_flight_;  // what the thread writes
  std::chrono::steady_clock::time_point started_;
  double write_seconds_ = 0.0;        // set by the thread before it ends
  std::atomic<bool> written_{false};  // the thread's write has ended
  // The host copy of the state, reused from save to save (pinned on a GPU).
  std::vector<torch::Tensor> staging_;
};

}  // namespace vqa::train
