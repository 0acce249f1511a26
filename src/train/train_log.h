// Rank 0's record of a run: every line the job prints while it trains (the
// per-epoch table, the step report, progress lines, warnings) goes through
// here, to stdout (warnings to stderr) and to <out>/train.log; the epoch
// numbers also go to <out>/metrics.jsonl as one JSON object per epoch, and
// the same numbers, with the configuration as text, to a TensorBoard event
// file in <out> (tensorboard_scalars has the tags).
// Other ranks hold a RunLog that writes nothing, so callers need not ask
// which rank they are on. Main thread.
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/train_state.h"        // EpochStats, EvalStats
#include "util/tensorboard_writer.h"  // TensorBoardWriter

namespace vqa::train {

class RunLog {
 public:
  // The writer's first line names the libraries (libraries_line), after
  // "device D; " when given the run's device, so that a run's log says
  // which build it came from.
  RunLog(const std::string& out_dir, bool writer);
  RunLog(const std::string& out_dir, bool writer, const c10::Device& device);

  bool writer() const { return writer_; }
  // A line for stdout and train.log.
  void info(const std::string& line);
  // "[vqa] warning: LINE" on stderr and in train.log.
  void warn(const std::string& line);
  // An in-place progress bar line on stdout only (a terminal; never logged).
  // clear_progress() wipes it.
  void progress(const std::string& line);
  void clear_progress();

  void epoch_header();
  // eval may be null when this epoch was not evaluated; step_report (the
  // phase breakdown and diagnosis, epoch_report_json) is merged into the
  // JSON record when given. global_step: the optimiser steps taken by the
  // end of the epoch, the record's "global_step" and TensorBoard's step.
  void epoch(int64_t epoch, int64_t global_step, const EpochStats& train, const EvalStats* eval,
             bool best, const nlohmann::json* step_report = nullptr);
  // The resolved configuration (INI text) as TensorBoard text at
  // global_step, once per start or resume.
  void configuration(const std::string& config_ini, int64_t global_step);
  // An evaluation on its own (--eval-only): overall / open / closed and per
  // question type on stdout and in train.log, and one JSON line in
  // metrics.jsonl ({"eval_only": true, ...}).
  void evaluation(const EvalStats& eval, const std::string& model_source);

 private:
  void open_files(const std::string& out_dir, const std::string& first_line);
  // The event file, made at the first call (so that a run that trains
  // nothing leaves none); null where this build has no writer or the file
  // could not be made (a warning said so).
  util::TensorBoardWriter* tensorboard();

  bool writer_;
  std::string out_dir_;
  std::ofstream text_;
  std::ofstream json_;
  std::unique_ptr<util::TensorBoardWriter> tensorboard_;
  bool tensorboard_tried_ = false;
};

// The TensorBoard scalars of one metrics.jsonl record, tag and value, each
// value the record's own number: train/loss (train_loss),
// train/learning_rate (lr), train/samples_per_second, train/loss_scale,
// train/skipped_steps; eval/overall, eval/open, eval/closed, eval/loss
// (test_loss) when evaluated; with the phase timers step/seconds_p50,
// step/<phase>_seconds for each phase's mean over ranks (phases.*.mean),
// step/slowest_rank_excess (the spread between ranks) and
// step/bus_gbps. Absent fields give no tag.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record);

// The libraries the process runs on: "LibTorch 1.13.0 (CPU build); CUDA
// none; cuDNN none; NCCL none", or "LibTorch 2.6.0 (CUDA build); CUDA 12.4;
// cuDNN 9.1.0; NCCL 2.21.5" (CUDA and cuDNN: the ones LibTorch was built
// with; NCCL: the one the GPU communicator loaded).
std::string libraries_line();
// The CUDA version LibTorch was built with, e.g. "12.4"; "" for a CPU-only
// LibTorch.
std::string libtorch_cuda_version();

// "PRES 80.0% (45), ABN 71.4% (14), ...": accuracy (and question count)
// per question type.
std::string question_type_line(const EvalStats& stats);

// {"PRES": {"accuracy": 0.8, "correct": 36, "total": 45}, ...}
nlohmann::json question_type_json(const EvalStats& stats);

}  // namespace vqa::train
