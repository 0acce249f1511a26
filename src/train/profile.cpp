#include "train/profile.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "util/durable_file.h"   // write_file_atomically
#include "util/printf_format.h"  // format

namespace vqa::train {

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// libkineto::ActivityType's values, as KinetoEvent::activityType() gives
// them (libkineto's header is not installed with LibTorch).
constexpr uint8_t kCpuOp = 0;
constexpr uint8_t kGpuMemcpy = 3;
constexpr uint8_t kGpuMemset = 4;
constexpr uint8_t kKernel = 5;

bool contains_any(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts) {
    if (text.find(part) != std::string::npos) return true;
  }
  return false;
}

std::vector<ProfileEvent> events_of(const profiler::ProfilerResult& result) {
  std::vector<ProfileEvent> events;
  for (const auto& e : result.events()) {
    ProfileEvent event;
    event.name = e.name();
    const uint8_t activity = e.activityType();
    event.on_gpu = e.deviceType() == c10::DeviceType::CUDA &&
                   (activity == kKernel || activity == kGpuMemcpy || activity == kGpuMemset);
    event.operator_ = !event.on_gpu && activity == kCpuOp &&
                      e.scope() == static_cast<uint8_t>(at::RecordScope::FUNCTION);
    event.track = event.on_gpu ? static_cast<uint64_t>(e.deviceResourceId()) : e.startThreadId();
#if TORCH_VERSION_MAJOR >= 2
    event.start_us = static_cast<double>(e.startNs()) / 1e3;
    event.duration_us = static_cast<double>(e.durationNs()) / 1e3;
#else
    event.start_us = static_cast<double>(e.startUs());
    event.duration_us = static_cast<double>(e.durationUs());
#endif
    events.push_back(std::move(event));
  }
  return events;
}

// Self time of each host event: its duration less its children's (the
// events inside it on the same thread).
std::vector<double> host_self_times(const std::vector<ProfileEvent>& events) {
  std::vector<double> self(events.size(), 0.0);
  std::map<uint64_t, std::vector<size_t>> by_track;
  for (size_t i = 0; i < events.size(); ++i) {
    if (!events[i].on_gpu) by_track[events[i].track].push_back(i);
  }
  for (auto& [track, indices] : by_track) {
    std::sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      if (events[a].start_us != events[b].start_us) return events[a].start_us < events[b].start_us;
      return events[a].duration_us > events[b].duration_us;  // the parent first
    });
    std::vector<size_t> open;
    for (const size_t i : indices) {
      const double start = events[i].start_us;
      while (!open.empty() &&
             events[open.back()].start_us + events[open.back()].duration_us <= start) {
        open.pop_back();
      }
      self[i] = events[i].duration_us;
      if (!open.empty()) self[open.back()] -= events[i].duration_us;
      open.push_back(i);
    }
  }
  for (auto& value : self) value = std::max(0.0, value);
  return self;
}

std::vector<ProfileSummary::Entry> top_entries(std::map<std::string, ProfileSummary::Entry>& all,
                                               size_t top) {
  std::vector<ProfileSummary::Entry> entries;
  for (auto& [name, entry] : all) entries.push_back(std::move(entry));
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.total_us > b.total_us; });
  if (entries.size() > top) entries.resize(top);
  return entries;
}

using util::format;

}  // namespace

KernelClass classify_kernel(const std::string& name) {
  // Attention first: fused attention kernels are built from GEMMs too.
  if (contains_any(name, {"flash", "fmha", "attention", "Attention", "softmax", "Softmax"})) {
    return KernelClass::kAttention;
  }
  if (contains_any(name, {"gemm", "Gemm", "GEMM", "cutlass", "xmma", "cublas", "aten::mm",
                          "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm"})) {
    return KernelClass::kMatmul;
  }
  return KernelClass::kOther;
}

ProfileSummary summarize_profile(const std::vector<ProfileEvent>& events, int64_t steps,
                                 size_t top) {
  ProfileSummary summary;
  summary.steps = std::max<int64_t>(1, steps);
  const double per_step = 1.0 / static_cast<double>(summary.steps);
  const auto self = host_self_times(events);
  std::map<std::string, ProfileSummary::Entry> host, gpu;
  std::vector<std::pair<double, double>> intervals;
  double shares[3] = {0.0, 0.0, 0.0};
  double host_shares[3] = {0.0, 0.0, 0.0};
  int64_t operators = 0, kernels = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const ProfileEvent& e = events[i];
    if (e.on_gpu) {
      auto& entry = gpu[e.name];
      entry.name = e.name;
      ++entry.calls;
      entry.total_us += e.duration_us;
      intervals.emplace_back(e.start_us, e.start_us + e.duration_us);
      if (e.name.rfind("Memcpy", 0) != 0 && e.name.rfind("Memset", 0) != 0) ++kernels;
      shares[static_cast<int>(classify_kernel(e.name))] += e.duration_us;
      continue;
    }
    if (!e.operator_) continue;
    ++operators;
    auto& entry = host[e.name];
    entry.name = e.name;
    ++entry.calls;
    entry.total_us += self[i];
    host_shares[static_cast<int>(classify_kernel(e.name))] += self[i];
  }
  summary.host_operators_per_step = operators * per_step;
  summary.gpu_kernels_per_step = kernels * per_step;
  std::sort(intervals.begin(), intervals.end());
  double busy = 0.0, end = -1.0;
  for (const auto& [begin, finish] : intervals) {
    if (begin >= end) {
      busy += finish - begin;
      end = finish;
    } else if (finish > end) {
      busy += finish - end;
      end = finish;
    }
  }
  if (!intervals.empty()) {
    summary.gpu_busy_us_per_step = busy * per_step;
    summary.gpu_idle_us_per_step = (end - intervals.front().first - busy) * per_step;
  }
  const double* chosen = intervals.empty() ? host_shares : shares;
  const double total = chosen[0] + chosen[1] + chosen[2];
  if (total > 0) {
    summary.matmul_share = chosen[0] / total;
    summary.attention_share = chosen[1] / total;
    summary.other_share = chosen[2] / total;
  }
  summary.top_host = top_entries(host, top);
  summary.top_gpu = top_entries(gpu, top);
  for (auto* list : {&summary.top_host, &summary.top_gpu}) {
    for (auto& entry : *list) entry.total_us *= per_step;
  }
  return summary;
}

std::vector<std::string> profile_summary_lines(const ProfileSummary& s) {
  std::vector<std::string> lines;
  lines.push_back(format("profile of %.0f steps: %.0f operators dispatched on the host per step",
                         static_cast<double>(s.steps), s.host_operators_per_step));
  const bool gpu = !s.top_gpu.empty();
  if (gpu) {
    lines.push_back(
        format("  GPU per step: %.0f kernels launched, busy %.2f ms, idle between kernels %.2f ms",
               s.gpu_kernels_per_step, s.gpu_busy_us_per_step / 1e3, s.gpu_idle_us_per_step / 1e3));
  }
  lines.push_back(format(std::string("  ")
                             .append(gpu ? "kernel time" : "host operators' self time")
                             .append(": matrix products %.0f%%, attention %.0f%%, other %.0f%%")
                             .c_str(),
                         100 * s.matmul_share, 100 * s.attention_share, 100 * s.other_share));
  const auto list = [&](const char* title, const std::vector<ProfileSummary::Entry>& entries) {
    if (entries.empty()) return;
    lines.push_back(std::string("  ") + title + " (ms per step, calls per step, name):");
    for (const auto& entry : entries) {
      lines.push_back(format("    %9.3f %7.1f  ", entry.total_us / 1e3,
                             static_cast<double>(entry.calls) / static_cast<double>(s.steps)) +
                      entry.name.substr(0, 120));
    }
  };
  list("host operators by self time", s.top_host);
  list("GPU kernels by time", s.top_gpu);
  return lines;
}

OperatorProfile::OperatorProfile(std::string path, int64_t first_step, int64_t steps,
                                 bool this_rank, bool cuda)
    : path_(std::move(path)),
      first_step_(first_step),
      steps_(steps),
      enabled_(!path_.empty() && this_rank && steps > 0),
      cuda_(cuda) {}

OperatorProfile::~OperatorProfile() {
  if (running_) profiler::disableProfiler();
}

void OperatorProfile::before_step(int64_t step) {
  if (!enabled_ || done_ || running_ || step < first_step_ || step >= first_step_ + steps_) return;
  if (cuda_) torch::cuda::synchronize();  // the window starts with an idle GPU
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  running_ = true;
}

std::vector<std::string> OperatorProfile::after_step(int64_t step) {
  if (!running_) return {};
  ++profiled_steps_;
  if (step + 1 < first_step_ + steps_) return {};
  return stop_and_write();
}

std::vector<std::string> OperatorProfile::finish() {
  if (!running_) return {};
  return stop_and_write();
}

std::vector<std::string> OperatorProfile::stop_and_write() {
  if (cuda_) torch::cuda::synchronize();  // every kernel of the window has run
  const auto result = profiler::disableProfiler();
  running_ = false;
  done_ = true;
  const auto events = events_of(*result);

  // The Chrome trace: pid 0 the host (a track per thread), pid 1 the GPU (a
  // track per stream); times relative to the window's first event.
  double origin = 0.0;
  if (!events.empty()) {
    origin = std::min_element(events.begin(), events.end(), [](const auto& a, const auto& b) {
               return a.start_us < b.start_us;
             })->start_us;
  }
  nlohmann::json trace = nlohmann::json::array();
  trace.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "host"}}}});
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "GPU"}}}});
  for (const auto& e : events) {
    trace.push_back({{"name", e.name},
                     {"cat", e.on_gpu ? "kernel" : (e.operator_ ? "operator" : "host")},
                     {"ph", "X"},
                     {"pid", e.on_gpu ? 1 : 0},
                     {"tid", e.track},
                     {"ts", e.start_us - origin},
                     {"dur", e.duration_us}});
  }
  const auto lines = profile_summary_lines(summarize_profile(events, profiled_steps_));
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  const auto parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  util::write_file_atomically(path_, nlohmann::json{{"traceEvents", trace}}.dump() + "\n");
  util::write_file_atomically(path_ + ".txt", text);
  std::vector<std::string> said = lines;
  said.insert(said.begin(), "--profile: wrote " + path_ + " (Chrome trace) and " + path_ + ".txt");
  return said;
}

}  // namespace vqa::train
