// --mpi-allreduce auto and --bucket-mb 0 in training: the start-up probe
// times each allreduce method, and sizes the gradient buckets, on an idle
// fabric, but in training the cores are busy with compute and the link
// behaves otherwise (on a 500 Mbit/s link the probe saw the methods within 5%
// and picked the library, which trained 9% slower than the ring). So the
// first steps of a run try the candidates in turn: the start-up choice, then
// each method for every gradient bucket, and with --bucket-mb 0 the start-up
// methods with buckets of half and twice the start-up size; one step each in
// a rotating order, kAutotuneRounds rounds after kAutotuneWarmupSteps warm-up
// steps; each candidate's step time (data wait excluded: on CPU ranks a
// method's own CPU work lengthens backward, which its exposed communication
// alone would miss) is the slowest rank's median over its rounds, and the
// fastest is kept for the rest of the run. Every rank decides from the same
// numbers (one gather), so every rank switches alike. The choice and the
// candidates' times go to train.log, diagnosis.json (json()) and
// <out>/allreduce_tuning.json, which a later run in the same directory with
// the same ranks and buckets (a resume) reuses without trying again.
//
// Sizes and methods form one candidate list rather than two rounds of tuning
// (the size first, then the methods at that size): one window fits the budget
// (7 candidates x 2 rounds + 2 warm-up steps = the default 16 steps, where
// two windows, sizes then methods, would need 8 + 12), at the price of not
// trying the other methods at the other sizes. Half and twice: the probe's
// size (kAutoBucketSeconds of the idle bus bandwidth) is off by the ratio of
// the busy link to the idle one, ~0.7 on the links measured; a factor of 2
// either way covers that and more, and finer steps would differ by less than
// the noise of a few steps' medians. The size counted is the one that takes
// effect (at most the gradients' whole size: beyond it one bucket holds them
// all), and a size that lays out the same buckets as another is not tried
// twice. With --shard-optimizer the parameters and the optimiser's shards are
// views of the buckets, so the size stays (the log says so) and only the
// methods are tried.
//
// The methods sum the same float32 values in another order, and so does
// another bucket size: the ring's chunks, which set the order in which the
// ranks' values of an element are added, and the library's algorithm, which
// MPI picks by message size, follow the bucket's bounds; the elements, the
// one buffer's layout, the norm clip and the finite check do not change.
// Losses agree with a run pinned to the chosen method and size to float32
// rounding (the test holds them to 1e-5 relative).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/communicator.h"  // Communicator
#include "train/gradient_sync.h"   // GradientSynchronizer
#include "train/step_timer.h"      // StepTimes
#include "train/train_log.h"       // RunLog

namespace vqa::train {

// Trial steps of each candidate; their median counts.
constexpr int kAutotuneRounds = 3;
// Steps at the window's start that run the start-up choice unmeasured. Two:
// a run's second step is still slower than the rest (by 0.2-0.8 s against
// 0.5-1.6 s trial steps, 2 hosts on 500 Mbit/s-10 Gbit/s links), and with one
// warm-up step it fell on the start-up choice's first trial, which then
// never won.
constexpr int kAutotuneWarmupSteps = 2;
// Fewer rounds than this and the start-up choice is kept.
constexpr int kAutotuneMinRounds = 2;
// At most this share of a run's optimiser steps goes to tuning.
constexpr double kAutotuneMaxShare = 0.25;

// One candidate: a name, the bucket size and the method of each size class.
struct AutotuneCandidate {
  std::string
      name;  // "start-up choice", "library", "ring 1024 KiB", "start-up choice, 0.5 MiB buckets"
  double bucket_mb = 0.0;            // --bucket-mb it runs with
  std::vector<std::string> methods;  // per size class the backend chooses for (any layout's)
};

// Which candidate each of the tuning window's steps runs: the window's
// first kAutotuneWarmupSteps steps are warm-ups with candidate 0 (not
// measured), then `rounds` rounds of every candidate once, round r starting
// at candidate r.
class AutotuneSchedule {
 public:
  AutotuneSchedule() = default;
  AutotuneSchedule(int64_t first_step, int candidates, int rounds)
      : first_step_(first_step), candidates_(candidates), rounds_(rounds) {}
  // Steps the window takes: the warm-ups and the trials.
  int64_t steps() const {
    return candidates_ > 0 ? kAutotuneWarmupSteps + int64_t{candidates_} * rounds_ : 0;
  }
  int64_t first_step() const { return first_step_; }
  int64_t end_step() const { return first_step_ + steps(); }  // the first step after
  bool in_window(int64_t step) const { return step >= first_step_ && step < end_step(); }
  // The candidate step `step` runs (0 at the warm-ups); -1 outside the window.
  int candidate_at(int64_t step) const;
  // True for a trial step (in the window, not a warm-up).
  bool measured(int64_t step) const {
    return in_window(step) && step >= first_step_ + kAutotuneWarmupSteps;
  }
  int rounds() const { return rounds_; }

 private:
  int64_t first_step_ = 0;
  int candidates_ = 0;
  int rounds_ = 0;
};

// Rounds the budget allows: (budget - kAutotuneWarmupSteps) / candidates, at most
// kAutotuneRounds, 0 when under kAutotuneMinRounds. The budget is
// min(max_steps, kAutotuneMaxShare of the steps left).
int autotune_rounds(int candidates, int64_t max_steps, int64_t steps_left);

// The decision, from every rank's median seconds per candidate.
struct AutotuneResult {
  std::vector<double> seconds;          // per candidate: the slowest rank's median step time
  std::vector<double> exposed_seconds;  // per candidate: the slowest rank's median exposed comm
  int choice = 0;
  // The trial steps' time over what the choice would have taken, summed
  // (rounds x (candidate - choice)): the cost of tuning against the best
  // choice from step 1 (the warm-ups, which any run pays, aside).
  double seconds_lost = 0.0;
};
// rank_seconds[r][c]: rank r's median for candidate c (and the same for
// exposed). The fastest by the slowest rank's median; a tie goes to the
// lower index (the start-up choice first).
AutotuneResult autotune_decide(const std::vector<std::vector<double>>& rank_seconds,
                               const std::vector<std::vector<double>>& rank_exposed, int rounds);

// The parts the tuner needs from the run.
struct AutotuneSetup {
  std::vector<int64_t> bucket_sizes;  // bytes as sent, in launch order, at the start-up size
  int64_t first_step = 0;             // the run's next optimiser step
  int64_t steps_left = 0;             // optimiser steps the run has still to take
  int max_steps = 0;                  // --allreduce-tune-steps
  bool timers = true;                 // --phase-timers (the tuner reads the step times)
  std::string stored_path;            // <out>/allreduce_tuning.json
};

// What the stored choice is valid for: the ranks and the buckets; with the
// bucket size tuned, the ranks and the bytes sent per step (the start-up
// size is the probe's, which may differ in a resumed run).
std::string autotune_key(int world_size, const std::vector<int64_t>& bucket_sizes);
std::string autotune_key_tuned_size(int world_size, int64_t bytes_per_step);

// The bucket sizes (MiB) tried besides `start_mb` with --bucket-mb 0: half
// and twice the size that takes effect, min(start_mb, gradient_mb), to 3
// significant digits (so that train.log's number pins the same buckets).
std::vector<double> autotune_bucket_sizes(double start_mb, double gradient_mb);

class AllreduceAutotune {
 public:
  // Keeps the parts; start() plans.
  AllreduceAutotune(runtime::Communicator& comm, AutotuneSetup setup, RunLog& log)
      : comm_(comm), setup_(std::move(setup)), log_(log) {}

  // Collective, before the first training step. Plans the trials, or applies
  // the choice stored at setup.stored_path when its key matches; the
  // bucket size too with `tune_bucket_size` (--bucket-mb 0, no CUDA graph),
  // unless `gradients` is sharded. Inactive where there is nothing to choose
  // (no methods from allreduce_methods, no other size), with --phase-timers
  // false, or when the budget leaves fewer than kAutotuneMinRounds rounds
  // (the log says which). Keeps `gradients` to lay its buckets out again.
  void start(GradientSynchronizer& gradients, bool tune_bucket_size);

  // Before step `step`: sets the methods and bucket size of its candidate
  // (every rank alike).
  void before_step(int64_t step);
  // Each rank's step times as the timer hands them over (any order).
  void record(const StepTimes& times);
  // True after the window's last step, once: call decide() then.
  bool decision_due(int64_t next_step) const {
    return !decided_ && schedule_.steps() > 0 && next_step >= schedule_.end_step();
  }
  // Collective, between steps: every rank's medians gathered, the choice
  // applied, logged and stored (rank 0). Every step of the window must have been recorded
  // (on a GPU: collect the timer with wait = true first).
  void decide();
  // For diagnosis.json: the candidates, their times and the choice; null
  // when nothing was tuned or reused.
  const nlohmann::json& json() const { return json_; }

 private:
  void apply(const AutotuneCandidate& candidate);
  // The stored choice, when its key matches: applied, true.
  bool reuse_stored(const std::string& key);
  // Into json_: what each rank's communicator uses for the buckets of
  // json_["methods"], and each rank's bucket size (collective).
  void record_rank_choices();
  // The size classes of the buckets as laid out now, each once.
  std::vector<int64_t> layout_classes() const;

  runtime::Communicator& comm_;
  AutotuneSetup setup_;
  RunLog& log_;
  GradientSynchronizer* gradients_ = nullptr;
  bool tune_size_ = false;
  std::string key_;  // what the stored choice is valid for
  std::vector<int64_t>
      classes_;  // the bucket sizes the backend chooses for, in any candidate's layout
  std::vector<AutotuneCandidate> candidates_;
  AutotuneSchedule schedule_;
  std::vector<std::vector<double>> seconds_, exposed_;  // per candidate, this rank's trials
  bool decided_ = false;
  nlohmann::json json_;
};

}  // namespace vqa::train
