// Wall-clock helpers on std::chrono::steady_clock, the clock every timer of
// the job reads (phase timers, collective times, loader waits).
#pragma once

#include <chrono>

namespace vqa::util {

using SteadyClock = std::chrono::steady_clock;

// Seconds since steady_clock's epoch: comparable between the threads of one
// process (the progress thread stamps collectives, the main thread steps).
inline double steady_seconds() {
  return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count();
}

inline double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

}  // namespace vqa::util
