// Wall-clock helpers on std::chrono::steady_clock, the clock every timer of
// the job reads (phase timers, collective times, loader waits).
#pragma once

#include <time.h>

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

// CPU time the calling thread has run, in seconds: against wall time it shows
// how much of a phase the thread waited for a core (other threads or
// processes on it).
inline double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace vqa::util
