// The epoch summary that says why N ranks are or are not N times faster.
//
// Every rank condenses its timed steps (StepTimer) into a RankSummary; rank 0
// gathers them and builds an EpochReport: each phase's mean, p50 and p95
// across ranks (of the per-rank mean per step), samples/s per rank and in
// total, the slowest rank, the gradient bytes per step and the bandwidth, and
// the diagnosis. The rules and their thresholds are below and in docs/performance.md.
#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <array>
#include <string>
#include <vector>

#include "runtime/communicator.h"  // Communicator
#include "train/gradient_sync.h"   // kDefaultBucketMiB
#include "train/projection.h"      // StepProfile, Fabric
#include "train/step_timer.h"      // StepTimes, Summary, kPhaseCount

namespace vqa::train {

// Diagnosis thresholds (shares of the mean step time unless stated).
// Communication-bound: allreduce time left exposed after backward.
constexpr double kCommBoundShare = 0.20;
// Data-bound: time waiting for the loader.
constexpr double kDataBoundShare = 0.10;
// Straggler: a rank's own time (step minus exposed communication, which is
// where the other ranks wait for it) above the median rank's by this much.
constexpr double kStragglerMargin = 0.10;
// Evaluation imbalance: slowest rank's evaluation time over the fastest's,
// minus 1, when the difference is also above kEvalImbalanceMinSeconds.
constexpr double kEvalImbalanceMargin = 0.25;
constexpr double kEvalImbalanceMinSeconds = 0.5;
// Batch too small: forward + backward under this share of the step while
// neither communication nor data explains the rest (per-step fixed costs
// dominate), or under kSmallBatchGpuSeconds per step on a GPU.
constexpr double kSmallBatchComputeShare = 0.50;
constexpr double kSmallBatchGpuSeconds = 0.010;
// Compute contention (CPU backend): the main thread ran less than this share
// of forward + backward's wall time (it waited for a core held by another
// thread or process).
constexpr double kContentionCpuShare = 0.90;
// No rule fires, and no remedy is named, for a cost or a gain under this
// share of the step.
constexpr double kMinimumGainShare = 0.05;

// The settings the remedies are measured against, so that none recommends
// what is already on.
struct RemedySettings {
  bool bf16_allreduce = false;
  double bucket_mb = kDefaultBucketMiB;
  int64_t batch_per_rank = 1;
  int64_t global_batch = 1;
  int64_t accumulation_steps = 1;
  bool cpu_backend = true;  // the contention rule reads CPU time (not GPU kernels)
};

// One rank's epoch, condensed.
struct RankSummary {
  int rank = 0;
  int64_t steps = 0;                             // timed optimiser steps
  std::array<double, kPhaseCount> phase_mean{};  // seconds per step
  double step_mean = 0.0, step_p50 = 0.0, step_p95 = 0.0;
  double own_mean = 0.0;  // step_mean minus exposed communication
  double samples_per_second = 0.0;
  double eval_seconds = 0.0;
  // Seconds per step this rank's backend spent in gradient allreduces
  // (0: unknown). It includes waiting for late ranks, so the report takes
  // the smallest over ranks: the last rank to arrive sees the transfer alone.
  double allreduce_seconds = 0.0;
  int64_t peak_memory_bytes = 0;  // this rank's peak (runtime::memory_peak_and_reset); 0: unknown
  // The main thread's CPU time over forward + backward's wall time (1: it
  // always had a core; 0: unknown).
  double compute_cpu_share = 0.0;
};

RankSummary rank_summary_build(int rank, const std::vector<StepTimes>& steps,
                               int64_t samples_per_step, double eval_seconds,
                               double allreduce_seconds, double compute_cpu_seconds = 0.0);

struct Diagnosis {
  std::string rule;     // communication-bound, data-bound, straggler, eval-imbalance, small-batch
  std::string message;  // one line with the numbers and the remedy
  nlohmann::json numbers;
};

// Where a rank's memory goes: the parts known exactly (the same on every
// rank) and what the peak was measured on; the rest of the peak is
// activations (and on the CPU also buffers and libraries).
struct MemoryParts {
  std::string source;           // runtime::MemoryPeak::source
  int64_t parameters = 0;       // bytes of the model's parameters and weight copies
  int64_t gradients = 0;        // bytes of the gradient buckets (they hold the gradients)
  int64_t optimizer_state = 0;  // bytes of AdamW's moments
};

struct EpochReport {
  int64_t epoch = 0;
  int world_size = 1;
  bool gpu = false;
  std::array<Summary, kPhaseCount> phases;  // across ranks, seconds per step
  Summary step;
  std::vector<RankSummary> ranks;
  int slowest_rank = 0;
  double slowest_excess = 0.0;  // slowest rank's own time over the median's, minus 1
  double samples_per_second = 0.0;
  int64_t allreduce_bytes_per_step = 0;
  double allreduce_seconds_per_step = 0.0;  // gradient allreduce time, smallest over ranks
  double bus_gbps = 0.0;                    // achieved, busbw = bytes / time x 2(n-1)/n
  double reference_bus_gbps = 0.0;          // the start-up probe at the bucket size
  int64_t reference_bytes = 0;
  std::vector<Diagnosis> diagnoses;
  MemoryParts memory;  // with every rank's peak_memory_bytes: the memory line
  RemedySettings settings;
  // The step as the projection sees it (phases, buckets); without buckets
  // (no profile) the remedies are named without their expected gain.
  StepProfile profile;
  // The allreduce methods tried in training and the choice
  // (AllreduceAutotune::json()); null when none were.
  nlohmann::json allreduce_tuning;
};

// The profile of rank 0 (whose buckets the run recorded): its phases, the
// accumulation and samples of `settings`, and `buckets` (sizes as sent, mean
// launch times before the end of backward).
StepProfile step_profile_build(const EpochReport& report, std::vector<BucketProfile> buckets);

// Collective: every rank passes its summary; rank 0 gets every rank's (in
// rank order), the others an empty vector.
std::vector<RankSummary> rank_summaries_gather(runtime::Communicator& comm,
                                               const RankSummary& mine);

// Rank 0: the report from every rank's summary and the job-wide numbers;
// diagnosed with `settings` and the bucket profile.
EpochReport epoch_report_build(int64_t epoch, bool gpu, const std::vector<RankSummary>& ranks,
                               int64_t allreduce_bytes_per_step, double reference_bus_gbps,
                               int64_t reference_bytes, const RemedySettings& settings = {},
                               std::vector<BucketProfile> buckets = {});

// The rules above, applied to a report (fills report.diagnoses).
void epoch_report_diagnose(EpochReport& report);

// Text lines for the log: the phase breakdown, throughput and bandwidth,
// then one line per diagnosis.
std::vector<std::string> epoch_report_lines(const EpochReport& report);

// The report as JSON (metrics.jsonl and diagnosis.json), thresholds included.
nlohmann::json epoch_report_json(const EpochReport& report);

}  // namespace vqa::train
