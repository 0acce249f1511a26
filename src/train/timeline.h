// --timeline FILE: a Chrome trace-event JSON file of a window of optimiser
// steps, which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// One process per rank ("rank R (host)"), with a "compute" track (each step,
// and inside it its phases) and an "allreduce" track (each gradient bucket's
// allreduce, from launch to completion). Times are microseconds on every
// rank's StepTimer clock, started right after a barrier, so the ranks line
// up to within the barrier's skew. Every rank keeps only the window's events;
// rank 0 gathers them and writes the file once (atomically), when the window
// has passed or the run ends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/communicator.h"  // Communicator: gather_strings
#include "train/step_timer.h"      // StepTimes

namespace vqa::train {

class Timeline {
 public:
  // Inactive when path is empty.
  Timeline(std::string path, int64_t first_step, int64_t steps);

  bool active() const { return !path_.empty() && !written_; }
  bool in_window(int64_t step) const { return step >= first_step_ && step < first_step_ + steps_; }
  // True once every step of the window has been added (or was skipped).
  bool window_passed(int64_t next_step) const { return next_step >= first_step_ + steps_; }

  void add_step(const StepTimes& step);
  // A gradient bucket's allreduce; begin/end on the StepTimer's clock.
  void add_collective(int64_t step, int64_t bucket, int64_t bytes, double begin, double end);

  // Collective over every rank: gathers the events to rank 0, which writes
  // the file. Later calls do nothing.
  void write(runtime::Communicator& comm, const std::string& host);

 private:
  std::string path_;
  int64_t first_step_;
  int64_t steps_;
  bool written_ = false;
  std::vector<std::string> events_;  // JSON objects, without the process id
};

}  // namespace vqa::train
