#include "train/step_timer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace vqa::train {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kDataWait:
      return "data_wait";
    case Phase::kHostToDevice:
      return "h2d";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kCommExposed:
      return "comm_exposed";
    case Phase::kOptimizer:
      return "optimizer";
  }
  return "unknown";
}

StepTimer::StepTimer(const torch::Device& device, bool enabled)
    : enabled_(enabled), clock_(device) {}

void StepTimer::begin_step(int64_t global_step) {
  if (!enabled_) return;
  current_ = PendingStep{};
  current_.step = global_step;
  current_.begin_mark = clock_.mark();
  in_step_ = true;
}

void StepTimer::end_phase(Phase phase) {
  if (!enabled_ || !in_step_) return;
  current_.ends.emplace_back(phase, clock_.mark());
}

void StepTimer::end_step() {
  if (!enabled_ || !in_step_) return;
  pending_.push_back(std::move(current_));
  in_step_ = false;
}

std::vector<StepTimes> StepTimer::collect(bool wait) {
  std::vector<StepTimes> done;
  while (!pending_.empty()) {
    const PendingStep& pending = pending_.front();
    const int64_t last_mark =
        pending.ends.empty() ? pending.begin_mark : pending.ends.back().second;
    double last = 0.0;
    // Marks complete in order: when the last one is done, all are.
    if (!clock_.seconds_at(last_mark, wait, &last)) break;
    StepTimes times;
    times.step = pending.step;
    clock_.seconds_at(pending.begin_mark, /*wait=*/false, &times.begin);
    double previous = times.begin;
    for (const auto& [phase, mark] : pending.ends) {
      double end = 0.0;
      clock_.seconds_at(mark, /*wait=*/false, &end);
      times.seconds[static_cast<int>(phase)] += end - previous;
      times.segments.push_back({phase, previous, end});
      previous = end;
    }
    times.end = last;
    done.push_back(std::move(times));
    clock_.release_before(last_mark + 1);
    pending_.pop_front();
  }
  return done;
}

Summary summarize(std::vector<double> values) {
  Summary summary;
  if (values.empty()) return summary;
  std::sort(values.begin(), values.end());
  summary.mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  // Nearest rank: the smallest value with at least q of the values at or below it.
  const auto quantile = [&](double q) {
    const auto rank = static_cast<size_t>(std::ceil(q * values.size()));
    return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
  };
  summary.p50 = quantile(0.50);
  summary.p95 = quantile(0.95);
  return summary;
}

}  // namespace vqa::train
