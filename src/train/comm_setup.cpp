#include "train/comm_setup.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/m3ae.h"        // kWordEmbeddingParameter
#include "runtime/check.h"     // fatal_user_error
#include "train/projection.h"  // auto_bucket_bytes, Fabric, kAutoBucketSeconds
#include "train/step_timer.h"  // summarize
#include "util/clock.h"        // SteadyClock, seconds_since

namespace vqa::train {

double allreduce_bus_gbps(int64_t bytes, int ranks, double seconds) {
  if (seconds <= 0 || ranks < 2) return 0.0;
  return static_cast<double>(bytes) / seconds * 2.0 * (ranks - 1) / ranks / 1e9;
}

double allreduce_probe_bus_gbps(runtime::Communicator& comm, int64_t bytes,
                                const torch::Device& device, int repeats) {
  if (comm.world_size() < 2 || bytes <= 0) return 0.0;
  auto buffer = torch::ones({std::max<int64_t>(1, bytes / 4)},
                            torch::TensorOptions().dtype(torch::kFloat32).device(device));
  std::vector<double> seconds;
  for (int i = 0; i <= repeats; ++i) {
    comm.barrier();
    const auto start = util::SteadyClock::now();
    comm.allreduce(buffer, runtime::ReduceOp::kAverage);
    buffer[0].item<float>();  // on a GPU: waits for the allreduce to finish
    const double elapsed = util::seconds_since(start);
    if (i > 0) seconds.push_back(elapsed);  // the first is the warm-up
  }
  // Every rank reports the slowest rank's time, as the benchmark does.
  const double slowest = comm.max(summarize(seconds).p50);
  return allreduce_bus_gbps(buffer.nbytes(), comm.world_size(), slowest);
}

double allreduce_probe_latency_seconds(runtime::Communicator& comm, const torch::Device& device,
                                       int repeats) {
  if (comm.world_size() < 2) return 0.0;
  auto buffer = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  std::vector<double> seconds;
  for (int i = 0; i <= repeats; ++i) {
    comm.barrier();
    const auto start = util::SteadyClock::now();
    comm.allreduce(buffer, runtime::ReduceOp::kSum);
    buffer[0].item<float>();
    if (i > 0) seconds.push_back(util::seconds_since(start));
  }
  const double rounds = std::ceil(std::log2(static_cast<double>(comm.world_size())));
  return comm.max(summarize(seconds).p50) / std::max(1.0, rounds);
}

RowSyncChoice row_sync_choice(const TrainConfig& config, int world_size,
                              const std::vector<NamedTensor>& parameters,
                              int64_t max_question_length, bool graph_captured, RunLog& log) {
  const std::string name = model::kWordEmbeddingParameter;
  const std::string option =
      "--sparse-embedding-sync " +
      util::mode_name(config.sparse_embedding_sync, kSparseEmbeddingSyncNames);
  if (config.sparse_embedding_sync == SparseEmbeddingSync::kOff) return {};
  const auto found = std::find_if(parameters.begin(), parameters.end(),
                                  [&](const NamedTensor& p) { return p.name == name; });
  if (found == parameters.end()) {
    if (config.sparse_embedding_sync == SparseEmbeddingSync::kOn) {
      runtime::fatal_user_error(option + ": the model has no trainable word embedding (" + name +
                                "); use --sparse-embedding-sync off or auto");
    }
    log.info("word embedding sync: whole table (" + option + ": no trainable " + name + ")");
    return {};
  }
  if (world_size < 2 || config.no_comm) {
    if (config.sparse_embedding_sync == SparseEmbeddingSync::kOn) {
      log.info("word embedding sync: " + option + " has no effect: " +
               (config.no_comm ? std::string("--no-comm sends nothing")
                               : std::string("one rank sends nothing")));
    }
    return {};
  }
  if (graph_captured) {
    log.info("word embedding sync: whole table (" + option +
             " with --cuda-graph: the rows synchronised would change every step, and a graph "
             "replays fixed shapes)");
    return {};
  }
  const int64_t rows = found->tensor.size(0);
  const int64_t width = found->tensor.size(1);
  const int64_t positions = config.global_batch * max_question_length;
  char line[320];
  if (config.sparse_embedding_sync == SparseEmbeddingSync::kAuto && positions >= rows) {
    std::snprintf(line, sizeof(line),
                  "word embedding sync: whole table (%s: %lld token positions per step "
                  "(global batch %lld x %lld) could touch all %lld rows)",
                  option.c_str(), static_cast<long long>(positions),
                  static_cast<long long>(config.global_batch),
                  static_cast<long long>(max_question_length), static_cast<long long>(rows));
    log.info(line);
    return {};
  }
  const double element = config.bf16_allreduce ? 2.0 : 4.0;
  std::snprintf(line, sizeof(line),
                "word embedding sync: by rows (%s): the rows this step's batches touch, at "
                "most %lld token positions (global batch %lld x %lld) of %lld rows; at most "
                "%.2f MB per step instead of %.2f MB",
                option.c_str(), static_cast<long long>(positions),
                static_cast<long long>(config.global_batch),
                static_cast<long long>(max_question_length), static_cast<long long>(rows),
                static_cast<double>(std::min(positions, rows)) * width * element / 1e6,
                static_cast<double>(rows) * width * element / 1e6);
  log.info(line);
  return {name, std::min(positions, rows)};
}

GradientSyncOptions gradient_sync_options_from(const TrainConfig& config, double bucket_mb,
                                               const RowSyncChoice& rows) {
  GradientSyncOptions options;
  options.bucket_mb = bucket_mb;
  options.bf16 = config.bf16_allreduce;
  options.skip_allreduce = config.no_comm;
  options.shard = config.shard_optimizer;
  options.row_sync_parameter = rows.parameter;
  options.row_sync_expected_rows = rows.expected_rows;
  return options;
}

double gradient_bucket_mb(const TrainConfig& config, runtime::Communicator& comm,
                          const std::vector<NamedTensor>& parameters, const torch::Device& device,
                          RunLog& log) {
  constexpr double kMiB = 1024.0 * 1024.0;
  if (config.bucket_mb > 0) return config.bucket_mb;
  if (comm.world_size() < 2 || config.no_comm) return kAutoBucketMaxMiB;
  const double wire = config.bf16_allreduce ? 0.5 : 1.0;  // bytes sent per float32 byte
  int64_t gradient_bytes = 0;
  for (const auto& parameter : parameters) gradient_bytes += parameter.tensor.numel() * 4;
  const auto probe_bytes = static_cast<int64_t>(
      std::min(kAutoBucketMaxMiB * kMiB, static_cast<double>(gradient_bytes)) * wire);
  const std::string tuning = comm.tune_allreduce(probe_bytes);
  if (!tuning.empty()) log.info(tuning);
  const double gbps = allreduce_probe_bus_gbps(comm, probe_bytes, device, /*repeats=*/3);
  // The auto size is in bytes sent; --bucket-mb counts float32 gradient bytes.
  const double mib = std::min(kAutoBucketMaxMiB,
                              auto_bucket_bytes(Fabric{"measured", gbps, 0.0, ""}) / wire / kMiB);
  char line[200];
  std::snprintf(line, sizeof(line),
                "gradient buckets: --bucket-mb 0 (auto): %.1f MiB, %.0f ms at the %.3g GB/s bus "
                "bandwidth measured at %.1f MB",
                mib, 1e3 * kAutoBucketSeconds, gbps, probe_bytes / 1e6);
  log.info(line);
  return mib;
}

AllreduceProbe allreduce_probe_for(const TrainConfig& config, runtime::Communicator& comm,
                                   const GradientSynchronizer& gradients,
                                   const torch::Device& device) {
  AllreduceProbe probe;
  const auto sizes = gradients.bucket_bytes();
  probe.bytes = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  if (!config.no_comm) probe.tuning = comm.tune_allreduce(probe.bytes);
  if (config.phase_timers && !config.no_comm) {
    probe.bus_gbps = allreduce_probe_bus_gbps(comm, probe.bytes, device);
    probe.latency_seconds = allreduce_probe_latency_seconds(comm, device);
  }
  return probe;
}

}  // namespace vqa::train
