// --profile FILE: where one rank's step time goes, operator by operator and
// (on a GPU) kernel by kernel, over the timeline's window of optimiser steps
// (--timeline-first-step, --timeline-steps).
//
// LibTorch's profiler (the collector behind torch.profiler: RecordFunction
// on the host and, where LibTorch is built with Kineto, CUPTI's record of
// every kernel and copy on the GPU) runs on rank 0 over the window. FILE gets
// a Chrome trace-event JSON (Perfetto, chrome://tracing; open it beside the
// --timeline file): one track per host thread with each operator, one per
// CUDA stream with each kernel. FILE.txt (and train.log) gets the summary:
// operators dispatched per step (what launch overhead scales with), the
// operators by self time, and on a GPU the kernels launched per step, the
// GPU's busy and idle time between kernels, the kernels by time, and the
// shares of matrix products, attention and everything else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqa::train {

// One profiled event, as the summary reads it (times in microseconds).
struct ProfileEvent {
  std::string name;
  bool on_gpu = false;    // a GPU kernel or copy; else a host operator
  bool operator_ = true;  // host: an ATen operator (not an autograd node or a user scope)
  uint64_t track = 0;     // host thread or GPU stream
  double start_us = 0.0, duration_us = 0.0;
};

// What the summary says, from the events alone (unit-tested).
struct ProfileSummary {
  int64_t steps = 0;
  double host_operators_per_step = 0.0;
  double gpu_kernels_per_step = 0.0;
  double gpu_busy_us_per_step = 0.0;  // union of the kernels' intervals
  double gpu_idle_us_per_step = 0.0;  // from the first kernel's start to the last's end, minus busy
  struct Entry {
    std::string name;
    int64_t calls = 0;
    double total_us = 0.0;  // host: self time (children excluded); GPU: kernel time
  };
  std::vector<Entry> top_host;  // by self time, the largest first
  std::vector<Entry> top_gpu;   // by kernel time
  // Shares of host self time (no GPU) or of kernel time (GPU), summing to 1.
  double matmul_share = 0.0, attention_share = 0.0, other_share = 0.0;
};

// Matrix product, attention, or neither, from an operator's or kernel's name.
enum class KernelClass { kMatmul, kAttention, kOther };
KernelClass classify_kernel(const std::string& name);

ProfileSummary summarize_profile(const std::vector<ProfileEvent>& events, int64_t steps,
                                 size_t top = 12);
std::vector<std::string> profile_summary_lines(const ProfileSummary& summary);

class OperatorProfile {
 public:
  // Inactive when path is empty or this rank does not profile.
  OperatorProfile(std::string path, int64_t first_step, int64_t steps, bool this_rank, bool cuda);
  OperatorProfile(const OperatorProfile&) = delete;
  OperatorProfile& operator=(const OperatorProfile&) = delete;
  ~OperatorProfile();

  // Around each optimiser step: the profiler starts before the window's
  // first step and stops after its last (waiting for the GPU), then FILE
  // and FILE.txt are written. Returns the summary's lines once, when written.
  void before_step(int64_t step);
  std::vector<std::string> after_step(int64_t step);
  // Ends a window the run did not reach the end of (writes what it has).
  std::vector<std::string> finish();

 private:
  std::vector<std::string> stop_and_write();

  std::string path_;
  int64_t first_step_, steps_;
  bool enabled_, cuda_;
  bool running_ = false, done_ = false;
  int64_t profiled_steps_ = 0;
};

}  // namespace vqa::train
