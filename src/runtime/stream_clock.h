// Timestamps of points in the compute stream, for the per-step phase timers.
//
// On CPU a mark is the host's steady clock: CPU tensor operations are
// synchronous, so the work before the mark has run. On a CUDA device a mark
// is a CUDA event recorded on torch's current stream, and its time is read
// only once the GPU has passed it (cudaEventQuery), so marking and reading
// never stall the stream; the phase durations of a step become available a
// few steps later.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

namespace vqa::runtime {

class StreamClock {
 public:
  explicit StreamClock(const torch::Device& device);
  ~StreamClock();
  StreamClock(const StreamClock&) = delete;
  StreamClock& operator=(const StreamClock&) = delete;

  // Records a point after all work queued so far; returns its id (0, 1, 2, ...).
  int64_t mark();

  // Seconds from the clock's creation to mark `id`. False while the device
  // has not reached the mark yet (never on CPU); with wait = true it blocks
  // until it has (for epoch ends). Marks older than release_before()'s
  // argument are gone.
  bool seconds_at(int64_t id, bool wait, double* seconds);

  // Forgets marks with ids below `id` (their GPU events are reused).
  void release_before(int64_t id);

  // Host seconds since the clock's creation (for events that are host-side
  // by nature, such as a collective's launch).
  double host_now() const;
  // The same time base for a std::chrono::steady_clock time_since_epoch in
  // seconds (runtime::Work::began_at/ended_at).
  double from_steady(double steady_seconds) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vqa::runtime
