// The communication side of vqa_train's start-up: the allreduce probes
// (bus bandwidth and latency, measured on the job's own communicator before
// training), the gradient bucket size they choose with --bucket-mb 0, and
// the buckets' options. Collective where said.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/communicator.h"  // Communicator
#include "train/gradient_sync.h"   // GradientSynchronizer, GradientSyncOptions, NamedTensor
#include "train/train_config.h"    // TrainConfig
#include "train/train_log.h"       // RunLog

namespace vqa::train {

// busbw in GB/s of an allreduce of `bytes` on `ranks` ranks that took `seconds`.
double allreduce_bus_gbps(int64_t bytes, int ranks, double seconds);

// The start-up probe's result: bus bandwidth of an allreduce of `bytes`
// (0: not measured).
struct AllreduceProbe {
  double bus_gbps = 0.0;
  int64_t bytes = 0;
  // A 4-byte allreduce's median time over its message rounds (ceil(log2 n)):
  // the per-message latency the projection's "auto" fabric uses (0: unknown).
  double latency_seconds = 0.0;
  std::string tuning;  // what the communicator chose at start-up (its log line), or ""
};

// The start-up probe: the median of `repeats` blocking float32 average-
// allreduces of `bytes` on `device` through `comm`, after one warm-up, as bus
// bandwidth in GB/s (what vqa_allreduce_bench reports for that size).
// Collective; 0 on one rank.
double allreduce_probe_bus_gbps(runtime::Communicator& comm, int64_t bytes,
                                const torch::Device& device, int repeats = 5);
// The latency probe: seconds per message round of a 4-byte allreduce
// (median of `repeats`, the slowest rank's). Collective; 0 on one rank.
double allreduce_probe_latency_seconds(runtime::Communicator& comm, const torch::Device& device,
                                       int repeats = 9);

// --sparse-embedding-sync resolved: the parameter the buckets average by
// rows ("" for none) and the rows expected per step. on: the model's word
// embedding (a model without one is refused); auto: the same when more than
// one rank communicates and a step's token positions (global batch x
// question length) are fewer than the table's rows, so that it surely sends
// fewer bytes; off, one rank, --no-comm, or auto where the step is captured
// as a CUDA graph (`graph_captured`: the rows would change every step, the
// graph replays fixed shapes): none. Logs the choice and why.
struct RowSyncChoice {
  std::string parameter;
  int64_t expected_rows = 0;
};
RowSyncChoice row_sync_choice(const TrainConfig& config, int world_size,
                              const std::vector<NamedTensor>& parameters,
                              int64_t max_question_length, bool graph_captured, RunLog& log);

// The buckets' options; `bucket_mb` is gradient_bucket_mb's answer.
GradientSyncOptions gradient_sync_options_from(const TrainConfig& config, double bucket_mb,
                                               const RowSyncChoice& rows);

// --bucket-mb, or with 0 (auto) the size whose allreduce takes about
// kAutoBucketSeconds at the bus bandwidth measured now (between 1 and 25
// MiB; 25 on one rank): small enough on a slow link that the first bucket
// goes out early in backward and the link stays busy, large enough on a fast
// one that each allreduce's fixed cost stays small. Logs the choice.
// Collective. With 0 this is where training starts: on CPU ranks its first
// steps also try half and twice the size (allreduce_autotune.h) and may lay
// the buckets out again (GradientSynchronizer::rebucket).
double gradient_bucket_mb(const TrainConfig& config, runtime::Communicator& comm,
                          const std::vector<NamedTensor>& parameters, const torch::Device& device,
                          RunLog& log);

// The communicator's own tuning for the largest gradient bucket
// (Communicator::tune_allreduce), then the start-up allreduce probe of that
// size (bus bandwidth) and of 4 bytes (latency), or no probe with
// --phase-timers false or --no-comm. Collective.
AllreduceProbe allreduce_probe_for(const TrainConfig& config, runtime::Communicator& comm,
                                   const GradientSynchronizer& gradients,
                                   const torch::Device& device);

}  // namespace vqa::train
