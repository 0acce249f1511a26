// What a run would do on N ranks and another fabric, from what one run
// measured: its phases per optimiser step, the gradient buckets (bytes, and
// how long before the end of backward each became ready to send), and a
// fabric's allreduce bus bandwidth and per-message latency.
//
// The model. A bucket of S bytes takes 2(n-1)/n x S / busbw + 2(n-1) x latency
// (a ring allreduce: 2(n-1) steps, each moving S/n). The link serves buckets
// one at a time in launch order, each from the moment it is ready; what is
// still running when backward ends is exposed. The step is the measured
// compute (data wait, copy, forward, backward, optimiser, summed over the
// accumulation micro-steps) plus the exposed part. Compute does not change
// with n (per-rank batch fixed), except on a CPU rank, where the allreduce's
// own CPU time (Fabric::cpu_seconds_per_byte) during backward lengthens
// backward by as much (one core per rank, shared with the progress thread
// and the kernel's network work), and where ranks share cores, the link
// moves what it sends during backward at the lower bus bandwidth measured
// while those cores compute (Fabric::bus_gbps_in_backward), the rest at the
// idle link's. And every step waits for the slowest of
// the n ranks: the compute is taken as the expected maximum of n draws from
// the run's own per-step compute times (StepProfile::compute_spread), which
// is the mean at n = 1 and grows slowly with n (ranks taken as independent:
// noise that strikes every rank at once costs less than this).
// The same model prices the diagnosis' remedies (bfloat16 buckets, smaller
// buckets, more accumulation).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace vqa::train {

struct Fabric {
  std::string name;
  double bus_gbps = 0.0;         // allreduce bus bandwidth, GB/s (nccl-tests' busbw)
  double latency_seconds = 0.0;  // per ring step
  std::string source;            // where the numbers come from
  // Host CPU seconds per byte a rank sends and receives (2(n-1)/n of the
  // buffer), as vqa_allreduce_bench's "cpu" column measures it: on a CPU
  // rank it is taken from compute that runs at the same time. 0 for GPUs.
  double cpu_seconds_per_byte = 0.0;
  // The bus bandwidth while backward runs on the ranks' cores, where the
  // allreduce's progress thread waits for a core that computes (CPU ranks
  // that share cores: vqa_allreduce_bench beside a compute load in the same
  // session, jobs/bench_projection.sh); 0: the same as bus_gbps.
  double bus_gbps_in_backward = 0.0;
};

// The built-in fabrics (docs/performance.md, "Projection to N ranks", lists their sources).
const std::vector<Fabric>& fabric_presets();
// A measured fabric as text, for help and error messages (a literal, so that
// option tables can keep it as their help's const char*).
#define VQA_FABRIC_TEXT_FORMAT "BUSGBPS:LATENCYUS[:CPUUS_PER_MB[:BUSGBPS_IN_BACKWARD]]"
// A preset by name, or VQA_FABRIC_TEXT_FORMAT (e.g. "12.5:5", "0.119:20:900",
// "0.119:20:900:0.085"); nullopt otherwise.
std::optional<Fabric> fabric_from_text(const std::string& text);

// One gradient bucket as the run saw it.
struct BucketProfile {
  double bytes = 0.0;             // sent per step (bfloat16 counted as 2 bytes)
  double ready_before_end = 0.0;  // seconds before the end of backward it was launched
};

// The run's numbers the model needs (means over ranks, per optimiser step).
struct StepProfile {
  double data_wait = 0.0, h2d = 0.0, forward = 0.0, backward = 0.0, optimizer = 0.0;
  int64_t accumulation_steps = 1;
  double last_backward = 0.0;          // backward of the micro-step that sends (seconds)
  int64_t samples_per_rank_step = 0;   // samples one rank computes per optimiser step
  std::vector<BucketProfile> buckets;  // in launch order
  // The run's per-step compute time (the step less its exposed
  // communication) over its mean, sorted, at most kSpreadPoints evenly
  // spaced order statistics; empty: every step alike.
  std::vector<double> compute_spread;
  double compute() const { return data_wait + h2d + forward + backward + optimizer; }
};

// How many points of the per-step compute distribution a profile keeps.
constexpr size_t kSpreadPoints = 65;
// `seconds` (one per step) as StepProfile::compute_spread.
std::vector<double> compute_spread_of(std::vector<double> seconds);
// The expected slowest of `ranks` independent draws from `spread`, over the
// mean (1 for one rank or an empty spread).
double slowest_of(const std::vector<double>& spread, int ranks);

struct ProjectedStep {
  int ranks = 1;
  double step_seconds = 0.0;
  double comm_seconds = 0.0;       // all buckets' allreduce time
  double exposed_seconds = 0.0;    // of which after backward
  double straggler_seconds = 0.0;  // waiting for the slowest rank's compute
  double samples_per_second = 0.0;
  double efficiency = 1.0;  // S_n / (n x S_1)
  std::string bottleneck;   // compute | stragglers | link bandwidth | link latency
};

// The step at `ranks` ranks on `fabric`.
ProjectedStep project_step(const StepProfile& profile, const Fabric& fabric, int ranks);

// ranks 1, 2, 4, ..., max_ranks.
std::vector<ProjectedStep> project_scaling(const StepProfile& profile, const Fabric& fabric,
                                           int max_ranks = 1024);

// The same profile with buckets re-cut to `bucket_bytes` each (split or
// merged): bytes taken to arrive evenly between one bucket's launch and the
// previous one's (the first from the start of backward). A profile measured
// with small buckets (--bucket-mb 1) re-cuts most faithfully.
StepProfile profile_with_bucket_bytes(const StepProfile& profile, double bucket_bytes);

// --bucket-mb 0 (auto): buckets whose allreduce takes about
// kAutoBucketSeconds at the bus bandwidth, between the two limits (MiB,
// rounded to 0.1): small on a slow link so that the first bucket goes out
// early in backward and the link stays busy, large on a fast one so that each
// allreduce's fixed cost stays small.
constexpr double kAutoBucketSeconds = 0.020;
constexpr double kAutoBucketMinMiB = 1.0;
constexpr double kAutoBucketMaxMiB = 25.0;
// The auto bucket size in bytes sent on `fabric`.
double auto_bucket_bytes(const Fabric& fabric);
// The same profile with every bucket's bytes scaled (0.5: bfloat16 buckets).
StepProfile profile_with_bytes_scaled(const StepProfile& profile, double factor);
// The same profile with `factor` times the accumulation micro-steps.
StepProfile profile_with_accumulation(const StepProfile& profile, int64_t factor);

// {"fabric": {...}, "profile": {...}, "rows": [{ranks, step_seconds, ...}]}
nlohmann::json projection_json(const StepProfile& profile, const Fabric& fabric,
                               const std::vector<ProjectedStep>& rows);
// The profile back from projection_json's "profile" (vqa_project reads
// diagnosis.json); throws std::runtime_error naming a missing field.
StepProfile step_profile_from_json(const nlohmann::json& profile);
// A table: one line per rank count.
std::vector<std::string> projection_lines(const Fabric& fabric,
                                          const std::vector<ProjectedStep>& rows);

}  // namespace vqa::train
