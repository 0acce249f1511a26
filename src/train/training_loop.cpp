#include "train/training_loop.h"

#include <cstdio>
#include <filesystem>

#include "model/m3ae_export.h"        // m3ae_export_tensors
#include "model/safetensors.h"        // safetensors_write
#include "runtime/check.h"            // fatal_user_error
#include "runtime/memory_usage.h"     // memory_peak_and_reset
#include "runtime/stop_request.h"     // StopAgreement, stop_signal_name, kExitStopRequested
#include "train/checkpoint_writer.h"  // CheckpointWriter
#include "train/evaluation.h"         // evaluate
#include "train/step_report.h"        // EpochReport, RankSummary, epoch_report_build, ...
#include "util/durable_file.h"        // write_file_atomically, DurableFileWriter

namespace vqa::train {

namespace {

// A checkpoint is never written from non-finite weights.
void require_finite_weights(model::M3AE& model, const std::string& what) {
  const std::string bad = first_nonfinite_parameter(model, /*check_values=*/true);
  if (!bad.empty()) {
    runtime::fatal_user_error("parameter " + bad + " holds a NaN or an infinity; not writing " +
                                  what + " (the previous checkpoint stays the latest)",
                              kExitNonFinite);
  }
}

std::string out_path(const TrainConfig& config, const char* name) {
  return (std::filesystem::path(config.out) / name).string();
}

PredictionOptions prediction_options(const TrainConfig& config) {
  PredictionOptions options;
  options.enabled = true;
  options.top_k = config.predictions_top;
  options.logits = config.predictions_logits;
  return options;
}

// A diagnostic file (diagnosis, timeline, the best epoch's predictions) that
// cannot be written costs that file, not the run: a warning in train.log.
template <typename Write>
void write_or_warn(RunLog& log, const std::string& what, Write&& write) {
  try {
    write();
  } catch (const std::exception& e) {
    log.warn("cannot write " + what + " (" + e.what() + "); training goes on without it");
  }
}

// Rank 0: the records as a JSON-lines file, written durably.
void write_predictions(const std::string& path, const std::vector<std::string>& records) {
  std::string text;
  for (const auto& record : records) text += record + "\n";
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  util::write_file_atomically(path, text);
}

// Rank 0's buckets this epoch: sizes as sent, and how long before the end of
// backward each was launched, averaged over the epoch's synchronised steps.
std::vector<BucketProfile> bucket_profiles(const GradientSynchronizer& gradients,
                                           const GradientSyncStats& before) {
  const auto& now = gradients.stats();
  const auto sizes = gradients.bucket_bytes();
  // Laid out again this epoch (the bucket size tuning): the steps since.
  const bool same_layout = now.layouts == before.layouts;
  const int64_t steps =
      now.synchronised_steps - (same_layout ? before.synchronised_steps : now.layout_first_step);
  std::vector<BucketProfile> buckets;
  if (steps <= 0) return buckets;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const double sum =
        now.ready_before_end_sums[k] - (same_layout ? before.ready_before_end_sums[k] : 0.0);
    // As sent this epoch where something was sent (the word embedding's rows vary).
    const int64_t sent = now.sent_bytes_sums[k] - (same_layout ? before.sent_bytes_sums[k] : 0);
    const double bytes = sent > 0 ? static_cast<double>(sent) / static_cast<double>(steps)
                                  : static_cast<double>(sizes[k]);
    buckets.push_back({bytes, sum / static_cast<double>(steps)});
  }
  return buckets;
}

// --project-fabric: a preset or given numbers, or ("auto") what this run
// measured (its allreduces' bus bandwidth, the start-up latency probe); on
// one rank, where nothing was measured, 10 GbE on CPU and NDR InfiniBand on GPU.
Fabric projection_fabric(const TrainConfig& config, const EpochReport& report,
                         const AllreduceProbe& probe) {
  if (config.project_fabric != "auto") return *fabric_from_text(config.project_fabric);
  const double bus = report.bus_gbps > 0 ? report.bus_gbps : probe.bus_gbps;
  if (report.world_size > 1 && bus > 0) {
    return {"measured", bus, probe.latency_seconds,
            "this run's gradient allreduces and start-up latency probe"};
  }
  return *fabric_from_text(report.gpu ? "ib-ndr" : "10gbe");
}

// Why the ranks are (not) N times faster: every rank's phases of the epoch,
// gathered to rank 0, which writes <out>/diagnosis.json. Fills the JSON
// record and the log lines on rank 0. Collective.
void report_epoch_steps(TrainingParts& parts, int64_t epoch, const EpochStats& stats,
                        const GradientSyncStats& sync_before, double eval_seconds,
                        const AllreduceProbe& probe, nlohmann::json& report_json,
                        std::vector<std::string>& report_lines) {
  const TrainConfig& config = parts.config;
  const auto& sync = parts.gradients.stats();
  const int64_t timed = sync.timed_steps - sync_before.timed_steps;
  const double allreduce_seconds =
      timed > 0 ? (sync.allreduce_seconds - sync_before.allreduce_seconds) / timed : 0.0;
  RankSummary mine = rank_summary_build(
      parts.comm.rank(), stats.step_times, config.batch_per_rank * config.accumulation_steps,
      eval_seconds, allreduce_seconds, parts.device.is_cuda() ? 0.0 : stats.compute_cpu_seconds);
  // This epoch's peak (training and its evaluation); the next epoch starts afresh.
  const runtime::MemoryPeak peak = runtime::memory_peak_and_reset(parts.device);
  mine.peak_memory_bytes = peak.bytes;
  const auto summaries = rank_summaries_gather(parts.comm, mine);
  if (parts.comm.rank() != 0) return;
  RemedySettings settings;
  settings.bf16_allreduce = config.bf16_allreduce;
  settings.bucket_mb = parts.gradients.bucket_mb();
  settings.batch_per_rank = config.batch_per_rank;
  settings.global_batch = config.global_batch;
  settings.accumulation_steps = config.accumulation_steps;
  settings.cpu_backend = !parts.device.is_cuda();
  // Bytes as sent this epoch (the word embedding's rows vary from step to step).
  const int64_t synced = sync.synchronised_steps - sync_before.synchronised_steps;
  const int64_t bytes_per_step = config.no_comm ? 0
                                 : synced > 0 ? (sync.sent_bytes - sync_before.sent_bytes) / synced
                                              : sync.bytes_per_step;
  auto report =
      epoch_report_build(epoch, parts.device.is_cuda(), summaries, bytes_per_step, probe.bus_gbps,
                         probe.bytes, settings, bucket_profiles(parts.gradients, sync_before));
  if (parts.autotune) report.allreduce_tuning = parts.autotune->json();
  // Rank 0's per-step compute, for the projection's wait for the slowest rank.
  std::vector<double> own_seconds;
  for (const auto& step : stats.step_times) {
    own_seconds.push_back(step.total() - step.seconds[static_cast<int>(Phase::kCommExposed)]);
  }
  report.profile.compute_spread = compute_spread_of(std::move(own_seconds));
  report.memory.source = peak.source;
  for (const auto& parameter : parts.model->parameters()) {
    report.memory.parameters += static_cast<int64_t>(parameter.nbytes());
  }
  if (const auto* copies = parts.model->weight_copies())
    report.memory.parameters += copies->bytes();
  report.memory.gradients = parts.gradients.memory_bytes();
  report.memory.optimizer_state = parts.optimizer.state_bytes();
  report_json = epoch_report_json(report);
  report_lines = epoch_report_lines(report);
  const Fabric fabric = projection_fabric(config, report, probe);
  // With --bucket-mb 0 the job would size its buckets for that fabric too.
  const StepProfile profile =
      config.bucket_mb > 0 ? report.profile
                           : profile_with_bucket_bytes(report.profile, auto_bucket_bytes(fabric));
  const auto rows = project_scaling(profile, fabric);
  report_json["projection"] = projection_json(report.profile, fabric, rows);
  if (epoch + 1 == config.epochs) {
    for (auto& line : projection_lines(fabric, rows)) report_lines.push_back(std::move(line));
  }
  const std::string diagnosis = out_path(config, "diagnosis.json");
  write_or_warn(parts.log, diagnosis,
                [&] { util::write_file_atomically(diagnosis, report_json.dump(2) + "\n"); });
}

// What the end of a completed epoch does, in order: evaluation when due,
// the step report, the timeline, the log, then rank 0's checkpoints while
// the others wait at a barrier (for the copy to host memory with
// --async-checkpoint, for the whole write without). Collective.
void finish_epoch(TrainingParts& parts, data::ShardedLoader& test_loader, const EpochStats& stats,
                  const GradientSyncStats& sync_before, const AllreduceProbe& probe,
                  const std::string& config_ini, TrainState& state, CheckpointWriter& writer) {
  const TrainConfig& config = parts.config;
  const int64_t epoch = state.next_epoch - 1;
  // The synchroniser found them on the first step; said once.
  for (const auto& name : parts.gradients.take_unused_parameters()) {
    parts.log.warn("parameter " + name + " received no gradient on the first step");
  }
  const bool evaluate_now =
      config.eval_every > 0 && ((epoch + 1) % config.eval_every == 0 || epoch + 1 == config.epochs);
  EvalStats eval_stats;
  bool best = false;
  if (evaluate_now) {
    eval_stats = evaluate(parts.model, test_loader, parts.comm, parts.device, epoch,
                          config.autocast_dtype(), prediction_options(config));
    if (eval_stats.accuracy.overall > state.best_overall) {
      state.best_overall = eval_stats.accuracy.overall;
      state.best_epoch = epoch;
      best = true;
    }
  }
  nlohmann::json report_json;
  std::vector<std::string> report_lines;
  if (config.phase_timers) {
    report_epoch_steps(parts, epoch, stats, sync_before, evaluate_now ? eval_stats.seconds : 0.0,
                       probe, report_json, report_lines);
  }
  for (const auto& step_times : stats.step_times) parts.timeline.add_step(step_times);
  if (parts.timeline.active() && parts.timeline.window_passed(state.global_step)) {
    write_or_warn(parts.log, "the timeline " + config.timeline,
                  [&] { parts.timeline.write(parts.comm, parts.comm.host()); });
  }
  parts.log.epoch(epoch, state.global_step, stats, evaluate_now ? &eval_stats : nullptr, best,
                  report_json.is_null() ? nullptr : &report_json);
  for (const auto& line : report_lines) parts.log.info(line);
  const bool save_now =
      config.save_every > 0 && ((epoch + 1) % config.save_every == 0 || epoch + 1 == config.epochs);
  // Sharded: each rank writes its own part of the moments (checkpoint_shards.h).
  const bool sharded_save = save_now && parts.optimizer.sharded();
  if (sharded_save) {
    writer.begin_sharded_save(config.out, state, parts.log);
    parts.comm.barrier();  // no stale part left when rank 0 starts looking for this save's
  }
  if (parts.comm.rank() == 0) {
    require_finite_weights(parts.model, "checkpoints of epoch " + std::to_string(epoch));
    if (best || save_now) {
      writer.save(config.out, parts.model, save_now ? &parts.optimizer : nullptr, state, config_ini,
                  config.keep_checkpoints, best, parts.log);
    }
    if (best) {
      const std::string predictions = out_path(config, "predictions_best.jsonl");
      write_or_warn(parts.log, predictions,
                    [&] { write_predictions(predictions, eval_stats.predictions); });
    }
  } else if (sharded_save) {
    writer.save(config.out, parts.model, &parts.optimizer, state, config_ini,
                config.keep_checkpoints, /*best=*/false, parts.log);
  }
  parts.comm.barrier();
}

// Every rank agreed to stop at the same step: rank 0 checkpoints the
// position and waits for the write (and any earlier one in flight), then the
// job exits with a status job scripts turn into a requeue.
int stop_with_checkpoint(TrainingParts& parts, int signal, const std::string& config_ini,
                         const TrainState& state, CheckpointWriter& writer) {
  std::string path;
  const bool sharded = parts.optimizer.sharded();  // every rank writes its part
  if (sharded) {
    writer.begin_sharded_save(parts.config.out, state, parts.log);
    parts.comm.barrier();
  }
  if (parts.comm.rank() == 0) require_finite_weights(parts.model, "the stop checkpoint");
  if (parts.comm.rank() == 0 || sharded) {
    path = writer.save(parts.config.out, parts.model, &parts.optimizer, state, config_ini,
                       parts.config.keep_checkpoints, /*best=*/false, parts.log);
    writer.wait(parts.log);
  }
  parts.comm.barrier();
  parts.log.info(std::string("stopped by ") + runtime::stop_signal_name(signal) + " at epoch " +
                 std::to_string(state.next_epoch) + " after " +
                 std::to_string(state.step_in_epoch) + " of its optimiser steps (global step " +
                 std::to_string(state.global_step) + "); checkpoint " + path + "; exit status " +
                 std::to_string(runtime::kExitStopRequested) + ", continue with --resume auto");
  return runtime::kExitStopRequested;
}

// --export-m3ae FILE: rank 0 writes the model as it is now under M3AE's
// names (m3ae_export.h), durably (FILE.tmp renamed onto FILE; nothing is left
// after a failure, which ends the job); the others wait. Collective.
void export_m3ae_if_asked(TrainingParts& parts) {
  const std::string& path = parts.config.export_m3ae;
  if (path.empty()) return;
  if (parts.comm.rank() == 0) {
    try {
      const auto tensors = model::m3ae_export_tensors(parts.model);
      int64_t values = 0;
      for (const auto& item : tensors) values += item.second.numel();
      util::DurableFileWriter file(path);
      model::safetensors_write(
          tensors, {{"format", "pt"}, {"written_by", "vqa-hpc vqa_train --export-m3ae"}},
          [&file](const void* data, size_t size) { file.write(data, size); });
      file.commit();
      char line[160];
      std::snprintf(line, sizeof(line), ": %zu tensors (%.2fM values) under M3AE's names",
                    tensors.size(), values / 1e6);
      parts.log.info("export-m3ae " + path + line);
    } catch (const std::exception& e) {
      runtime::fatal_user_error("--export-m3ae " + path + ": " + e.what());
    }
  }
  parts.comm.barrier();
}

// The summary line, and on rank 0 <out>/DONE, written last.
void finish_run(TrainingParts& parts, const TrainState& state) {
  std::string summary = "training complete: " + std::to_string(parts.config.epochs) + " epochs";
  if (state.best_epoch >= 0) {
    char line[128];
    std::snprintf(line, sizeof(line), "; best overall accuracy %.2f%% at epoch %lld",
                  100 * state.best_overall, static_cast<long long>(state.best_epoch));
    summary += line;
  }
  parts.log.info(summary);
  if (parts.comm.rank() == 0) {
    util::write_file_atomically(
        out_path(parts.config, "DONE"),
        "epochs " + std::to_string(parts.config.epochs) + "\n" + summary + "\n");
  }
}

}  // namespace

int run_evaluation_only(TrainingParts& parts, data::ShardedLoader& test_loader,
                        const std::string& model_source) {
  const TrainConfig& config = parts.config;
  const EvalStats stats =
      evaluate(parts.model, test_loader, parts.comm, parts.device,
               /*epoch=*/0, config.autocast_dtype(), prediction_options(config));
  parts.log.evaluation(stats, model_source);
  if (!config.predictions.empty() && parts.comm.rank() == 0) {
    try {
      write_predictions(config.predictions, stats.predictions);
    } catch (const std::exception& e) {
      runtime::fatal_user_error("--predictions: " + std::string(e.what()));
    }
    parts.log.info("predictions: " + std::to_string(stats.predictions.size()) + " questions in " +
                   config.predictions);
  }
  parts.comm.barrier();
  export_m3ae_if_asked(parts);
  return 0;
}

int run_training(TrainingParts& parts, data::ShardedLoader& train_loader,
                 data::ShardedLoader& test_loader, const AllreduceProbe& probe,
                 const std::string& config_ini, TrainState& state) {
  // --mpi-allreduce auto and --bucket-mb 0: the first steps try the methods
  // and bucket sizes (allreduce_autotune.h), or reuse the stored choice. On
  // GPUs (NCCL picks its own algorithm) only the size, and not under
  // --cuda-graph: the graph replays the buckets it captured.
  if (parts.autotune && state.next_epoch < parts.config.epochs) {
    parts.autotune->start(
        parts.gradients,
        /*tune_bucket_size=*/parts.config.bucket_mb == 0 && parts.graph == nullptr);
  }
  if (state.next_epoch < parts.config.epochs) {
    parts.log.configuration(config_ini, state.global_step);
    parts.log.epoch_header();
  }
  runtime::StopAgreement stop;
  // Rank 0's saves; the others save only their parts of sharded checkpoints.
  CheckpointWriter writer(parts.config.async_checkpoint,
                          parts.config.faults.kill_in_checkpoint_write, parts.comm.rank(),
                          parts.comm.world_size());
  const bool saves = parts.config.save_every > 0 || parts.config.eval_every > 0;
  if (saves && (parts.comm.rank() == 0 || parts.optimizer.sharded())) {
    const int64_t staged = writer.prepare(parts.model, parts.optimizer);
    if (staged > 0) {
      parts.log.info("checkpoint host copy: " + std::to_string(staged >> 20) +
                     " MiB allocated at start-up on rank 0" +
                     (parts.optimizer.sharded() ? " (each rank: its own part's moments)" : ""));
    }
  }
  while (state.next_epoch < parts.config.epochs) {
    const GradientSyncStats sync_before = parts.gradients.stats();
    const EpochStats stats = train_epoch(parts, train_loader, stop, state);
    if (stats.stop_signal != 0)
      return stop_with_checkpoint(parts, stats.stop_signal, config_ini, state, writer);
    finish_epoch(parts, test_loader, stats, sync_before, probe, config_ini, state, writer);
  }
  // The last checkpoint is on disk before DONE (and before the export).
  writer.wait(parts.log);
  // When the run ended before the window did.
  write_or_warn(parts.log, "the timeline " + parts.config.timeline,
                [&] { parts.timeline.write(parts.comm, parts.comm.host()); });
  if (parts.profile) {
    write_or_warn(parts.log, "the profile " + parts.config.profile, [&] {
      for (const auto& line : parts.profile->finish()) parts.log.info(line);
    });
  }
  export_m3ae_if_asked(parts);
  finish_run(parts, state);
  return 0;
}

}  // namespace vqa::train
