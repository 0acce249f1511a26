// Rank 0's record of a run: every line the job prints while it trains (the
// per-epoch table, the step report, progress lines, warnings) goes through
// here, to stdout (warnings to stderr) and to <out>/train.log; the epoch
// numbers also go to <out>/metrics.jsonl as one JSON object per epoch.
// Other ranks hold a RunLog that writes nothing, so callers need not ask
// which rank they are on. Main thread.
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "train/train_state.h"  // EpochStats, EvalStats

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
  // JSON record when given.
  void epoch(int64_t epoch, const EpochStats& train, const EvalStats* eval, bool best,
             const nlohmann::json* step_report = nullptr);
  // An evaluation on its own (--eval-only): overall / open / closed and per
  // question type on stdout and in train.log, and one JSON line in
  // metrics.jsonl ({"eval_only": true, ...}).
  void evaluation(const EvalStats& eval, const std::string& model_source);

 private:
  void open_files(const std::string& out_dir, const std::string& first_line);

  bool writer_;
  std::ofstream text_;
  std::ofstream json_;
};

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
