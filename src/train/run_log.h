// Rank 0's record of a run: every line the job prints while it trains (the
// per-epoch table, the step report, progress lines, warnings) goes through
// here, to stdout (warnings to stderr) and to <out>/train.log; the epoch
// numbers also go to <out>/metrics.jsonl as one JSON object per epoch.
// Other ranks hold a RunLog that writes nothing, so callers need not ask
// which rank they are on. Main thread.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "train/run_state.h"  // EpochStats, EvalStats

namespace vqa::train {

class RunLog {
 public:
  RunLog(const std::string& out_dir, bool writer);

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
  bool writer_;
  std::ofstream text_;
  std::ofstream json_;
};

// "PRES 80.0% (45), ABN 71.4% (14), ...": accuracy (and question count)
// per question type.
std::string question_type_line(const EvalStats& stats);

// {"PRES": {"accuracy": 0.8, "correct": 36, "total": 45}, ...}
nlohmann::json question_type_json(const EvalStats& stats);

}  // namespace vqa::train
