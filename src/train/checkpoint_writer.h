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
// Sharded saves (--shard-optimizer, checkpoint_shards.h): every rank has a
// writer; at a save each copies only its own moment ranges (and rank 0 the
// weights) and its thread writes its part; rank 0's thread then waits for
// every part, writes NAME, the manifest and `latest`. No rank gathers the
// state: each holds 1/N of the moments, plus their host copy.
//
// Cost: one host copy of the state (about 3x the weights with AdamW's two
// moments on rank 0 unsharded; sharded: the weights on rank 0 plus 2x the
// owned moments, about 2x weights / N, on every rank), allocated and touched
// by prepare() at start-up, before the first step, so that no save pays
// for it in the step (the first save of `base` blocked 28 s doing so, later
// ones 1-8 s), and reused until the run ends; the copy itself in the step
// (memory bandwidth); and the writer thread's CPU time (serialisation, two
// CRC passes, the write) while training runs.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "model/m3ae.h"         // M3AE
#include "train/optimizer.h"    // VqaOptimizer
#include "train/train_log.h"    // RunLog
#include "train/train_state.h"  // TrainState

namespace vqa::train {

// A rank's checkpoint saves (rank 0's, and every rank's parts when
// sharded). Main thread only; one writer per rank and run.
class CheckpointWriter {
 public:
  // asynchronous: write in a background thread (false: checkpoint_save's
  // synchronous write). kill_in_write > 0: testing only
  // (--test-kill-in-checkpoint-write), the write of this process's
  // kill_in_write-th checkpoint SIGKILLs the process once its first bytes are
  // in the temporary file.
  // rank, parts: this rank and the ranks of the run (a sharded checkpoint's parts).
  CheckpointWriter(bool asynchronous, int64_t kill_in_write = 0, int rank = 0, int parts = 1);
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

  // Asynchronous only (otherwise a no-op): allocates and touches the host
  // copy a save of this model and optimiser needs (see Cost above), after
  // the optimiser is sharded and before the first step. Returns its bytes.
  int64_t prepare(model::M3AE& model, VqaOptimizer& optimizer);

  // Sharded, on every rank before the save's barrier: waits for this rank's
  // write in flight and removes its part of the coming checkpoint left by a
  // killed run, so that rank 0 never takes an old part for a new one.
  void begin_sharded_save(const std::string& out_dir, const TrainState& state, RunLog& log);

 private:
  void join(RunLog& log);
  // join(), logging the wait when the write was still going; its seconds.
  double join_previous(const std::string& name, RunLog& log);

  bool asynchronous_;
  int64_t kill_in_write_;
  int64_t checkpoints_ = 0;  // checkpoints saved so far
  std::thread thread_;
  std::string in_flight_;  // what the thread writes
  std::chrono::steady_clock::time_point started_;
  double write_seconds_ = 0.0;        // set by the thread before it ends
  std::atomic<bool> written_{false};  // the thread's write has ended
  int rank_ = 0, parts_ = 1;
  // The host copy of the state, reused from save to save (pinned on a GPU):
  // weights and buffers in archive order, moments per parameter, and the
  // owned moments of a sharded run, flat.
  std::vector<torch::Tensor> staging_;
  std::map<const void*, std::vector<torch::Tensor>> moment_staging_;
  std::array<torch::Tensor, 2> part_staging_;
};

}  // namespace vqa::train
