// How the communicator backends report their collectives to the collective
// watchdog (watchdog.h), and the watchdog's life cycle. Private to the
// runtime folder.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

#include "runtime/types.h"  // RankInfo, TrainingPosition

namespace vqa::runtime {

enum class CollectiveKind : int64_t {
  kAllreduce = 1,
  kBroadcast,
  kBarrier,
  kScalar,
  kGather,
  kReduceScatter,
  kAllgather,
  kGraphReplay  // a replayed CUDA graph holding collectives (cuda_graph.h)
};
const char* collective_kind_name(CollectiveKind kind);

// One rank's view of one communicator's collectives, at one moment.
struct CollectiveState {
  int64_t started = 0;    // collectives started here: sequence numbers 1..started
  int64_t completed = 0;  // of those, completed (always a prefix)
  // The oldest started, not completed collective; valid when started > completed.
  int64_t oldest = 0;  // its sequence number
  CollectiveKind kind = CollectiveKind::kAllreduce;
  int64_t bytes = 0;
  double seconds_pending = 0.0;
  double seconds_quiet = 0.0;  // since the last begin() or end()
  int64_t epoch = -1;          // the owner's training position (-1: not set)
  int64_t step = -1;
  bool pending() const { return started > completed; }
};

// Counts one communicator's collectives. Registers itself with the watchdog
// for its lifetime. Every rank creates its communicators, hence their
// trackers, in the same order, so index() names the same communicator on
// every rank. begin()/end() cost one uncontended lock each.
class CollectiveTracker {
 public:
  // `position` (the owning communicator's) must outlive the tracker.
  explicit CollectiveTracker(const TrainingPosition& position);
  // Deregisters: once it returns, the watchdog thread no longer calls the
  // poll or abort hooks. Destroy the tracker before what the hooks use.
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  // The calling thread starts the next collective; returns its sequence
  // number. Called in the same order on every rank.
  int64_t begin(CollectiveKind kind, int64_t bytes);
  // Collective `sequence` completed on this rank; in the order of begin().
  void end(int64_t sequence);

  // For backends whose collectives complete asynchronously (NCCL): the
  // watchdog thread calls `poll` every cycle; it calls end() for those now
  // complete and returns "" or the description of an asynchronous error.
  void set_completion_poll(std::function<std::string()> poll);
  // Called on the watchdog thread just before it ends the job (ncclCommAbort).
  void set_abort_hook(std::function<void()> hook);

  int index() const { return index_; }
  CollectiveState state() const;
  // "allreduce #42 (4194304 bytes) at epoch 3 step 120" for the oldest
  // pending collective, or "no collective in flight at epoch 3 step 120".
  std::string describe() const;

  // Watchdog thread only.
  std::string poll_completion();
  void run_abort_hook();

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    int64_t sequence;
    CollectiveKind kind;
    int64_t bytes;
    Clock::time_point start;
  };
  const TrainingPosition& position_;
  int index_;
  mutable std::mutex mutex_;
  std::deque<Pending> pending_;
  int64_t started_ = 0;
  int64_t completed_ = 0;
  Clock::time_point last_activity_;
  std::function<std::string()> poll_;
  std::function<void()> abort_hook_;
};

// "at epoch 3 step 120", or "before the first training step".
std::string position_text(int64_t epoch, int64_t step);

// Collective over MPI_COMM_WORLD: distributed_init starts the watchdog
// thread last (with its RankInfo), distributed_finalize stops it first.
void watchdog_start(const RankInfo& info);
void watchdog_stop();

// The registry behind CollectiveTracker's constructor and destructor.
int watchdog_next_index();
void watchdog_register(CollectiveTracker* tracker);
void watchdog_deregister(CollectiveTracker* tracker);

}  // namespace vqa::runtime
