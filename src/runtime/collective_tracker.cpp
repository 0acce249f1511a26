// CollectiveTracker: the per-communicator bookkeeping the watchdog reads.
#include <cstdio>

#include "runtime/types.h"          // TrainingPosition
#include "runtime/watchdog_impl.h"  // CollectiveTracker, watchdog registry

namespace vqa::runtime {

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kScalar:
      return "scalar allreduce";
    case CollectiveKind::kGather:
      return "string gather";
    case CollectiveKind::kReduceScatter:
      return "reduce-scatter";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kGraphReplay:
      return "replayed CUDA graph's collectives";
  }
  return "collective";
}

std::string position_text(int64_t epoch, int64_t step) {
  if (epoch < 0 && step < 0) return "before the first training step";
  return "at epoch " + std::to_string(epoch) + " step " + std::to_string(step);
}

CollectiveTracker::CollectiveTracker(const TrainingPosition& position)
    : position_(position), index_(watchdog_next_index()), last_activity_(Clock::now()) {
  watchdog_register(this);
}

CollectiveTracker::~CollectiveTracker() { watchdog_deregister(this); }

int64_t CollectiveTracker::begin(CollectiveKind kind, int64_t bytes) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t sequence = ++started_;
  pending_.push_back(Pending{sequence, kind, bytes, now});
  last_activity_ = now;
  return sequence;
}

void CollectiveTracker::end(int64_t sequence) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  while (!pending_.empty() && pending_.front().sequence <= sequence) pending_.pop_front();
  if (sequence > completed_) completed_ = sequence;
  last_activity_ = now;
}

void CollectiveTracker::set_completion_poll(std::function<std::string()> poll) {
  std::lock_guard<std::mutex> lock(mutex_);
  poll_ = std::move(poll);
}

void CollectiveTracker::set_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  abort_hook_ = std::move(hook);
}

CollectiveState CollectiveTracker::state() const {
  const Clock::time_point now = Clock::now();
  CollectiveState state;
  state.epoch = position_.epoch.load(std::memory_order_relaxed);
  state.step = position_.step.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  state.started = started_;
  state.completed = completed_;
  state.seconds_quiet = std::chrono::duration<double>(now - last_activity_).count();
  if (!pending_.empty()) {
    const Pending& oldest = pending_.front();
    state.oldest = oldest.sequence;
    state.kind = oldest.kind;
    state.bytes = oldest.bytes;
    state.seconds_pending = std::chrono::duration<double>(now - oldest.start).count();
  }
  return state;
}

std::string CollectiveTracker::describe() const {
  const CollectiveState now = state();
  const std::string where = position_text(now.epoch, now.step);
  if (!now.pending()) return "no collective in flight, " + where;
  return std::string(collective_kind_name(now.kind)) + " #" + std::to_string(now.oldest) + " (" +
         std::to_string(now.bytes) + " bytes) " + where;
}

std::string CollectiveTracker::poll_completion() {
  std::function<std::string()> poll;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    poll = poll_;
  }
  return poll ? poll() : std::string();
}

void CollectiveTracker::run_abort_hook() {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    hook = abort_hook_;
  }
  if (hook) hook();
}

}  // namespace vqa::runtime
