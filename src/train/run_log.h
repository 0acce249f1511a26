// Rank 0's record of a run: the per-epoch table on stdout and in
// <out>/train.log, the same numbers as JSON lines in <out>/metrics.jsonl.
// Other ranks hold a RunLog that writes nothing.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "train/trainer.h"  // EpochStats, EvalStats

namespace vqa::train {

class RunLog {
 public:
  RunLog(const std::string& out_dir, bool writer);

  // A line for stdout and train.log.
  void info(const std::string& line);
  void epoch_header();
  // eval may be null when this epoch was not evaluated; step_report (the
  // phase breakdown and diagnosis, epoch_report_json) is merged into the
  // JSON record when given.
  void epoch(int64_t epoch, const EpochStats& train, const EvalStats* eval, bool best,
             const nlohmann::json* step_report = nullptr);

 private:
  bool writer_;
  std::ofstream text_;
  std::ofstream json_;
};

}  // namespace vqa::train
