// Per-step phase timers of one rank: where each optimiser step's time goes.
//
// The training loop marks the end of each phase; a phase's time is the time
// between its end mark and the previous mark. Marks come from a
// runtime::StreamClock: the host clock on CPU, CUDA events on GPU (read a few
// steps later, without stalling the stream). With accumulation a step has one
// set of data/copy/forward/backward phases per micro-step; they add up.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "runtime/stream_clock.h"  // StreamClock

namespace vqa::train {

enum class Phase : int {
  kDataWait = 0,      // waiting for the loader's next batch
  kHostToDevice = 1,  // copying the batch to the device
  kForward = 2,       // forward pass and loss
  kBackward = 3,      // backward pass (gradient allreduces launch during it)
  kCommExposed = 4,   // waiting after backward for allreduces still in flight
  kOptimizer = 5,     // clipping, optimiser step, zeroing gradients
};
constexpr int kPhaseCount = 6;

// "data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer".
const char* phase_name(Phase phase);

struct PhaseSegment {
  Phase phase;
  double begin = 0.0;  // seconds since the timer's clock started
  double end = 0.0;
};

struct StepTimes {
  int64_t step = 0;  // global optimiser step
  double begin = 0.0, end = 0.0;
  std::array<double, kPhaseCount> seconds{};  // per phase, summed over micro-steps
  std::vector<PhaseSegment> segments;         // in order (for the timeline)
  double total() const { return end - begin; }
};

class StepTimer {
 public:
  // Disabled: every call is a no-op and collect() returns nothing.
  StepTimer(const torch::Device& device, bool enabled);

  void begin_step(int64_t global_step);
  void end_phase(Phase phase);
  void end_step();

  // Steps whose marks the device has passed, oldest first; with wait = true
  // every step ended so far (blocks on GPU: call at epoch ends only).
  std::vector<StepTimes> collect(bool wait);

  // Host seconds on the same time base as the marks (for host-side events).
  double host_now() const { return clock_.host_now(); }
  // A std::chrono::steady_clock time_since_epoch in seconds, on that time base.
  double from_steady(double steady_seconds) const { return clock_.from_steady(steady_seconds); }
  bool enabled() const { return enabled_; }

 private:
  struct PendingStep {
    int64_t step = 0;
    int64_t begin_mark = 0;
    std::vector<std::pair<Phase, int64_t>> ends;  // phase and its end mark
  };

  bool enabled_;
  runtime::StreamClock clock_;
  std::deque<PendingStep> pending_;
  PendingStep current_;
  bool in_step_ = false;
};

// Mean, median and 95th percentile of a set of values (0s when empty).
struct Summary {
  double mean = 0.0, p50 = 0.0, p95 = 0.0;
};
Summary summarize(std::vector<double> values);

}  // namespace vqa::train
