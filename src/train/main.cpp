// vqa_train: data-parallel fine-tuning of an M3AE-style VQA model.
//
//   mpirun -np 2 build/vqa_train --config jobs/configs/quickstart.ini
//
// One rank per GPU (or per group of CPU cores). Every rank reads its own
// shard of the HDF5 dataset, gradients are averaged in buckets while backward
// runs, and every rank evaluates its shard of the test split.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "data/hdf5_crash.h"       // hdf5_crash_report_install
#include "data/loader.h"           // ShardedLoader
#include "model/m3ae.h"            // M3AE, parameter_count
#include "runtime/check.h"         // fatal_user_error
#include "runtime/communicator.h"  // communicator_create
#include "runtime/distributed.h"   // distributed_init, distributed_finalize
#include "runtime/stop_request.h"  // stop_signals_install, StopAgreement, kExitStopRequested
#include "runtime/system_info.h"   // keep_freed_memory_for_reuse, warn_if_reference_blas
#include "runtime/watchdog.h"      // set_collective_timeout
#include "train/checkpoint.h"      // checkpoint_save, checkpoint_load
#include "train/config.h"          // TrainConfig, config_parse
#include "train/gradient_sync.h"   // GradientSynchronizer, broadcast_module_state
#include "train/optimizer.h"       // VqaOptimizer
#include "train/run_log.h"         // RunLog
#include "train/setup.h"           // setup_device, setup_model_config, require_same_*
#include "train/step_report.h"     // rank_summary_build, epoch_report_build, allreduce_probe
#include "train/step_timer.h"      // StepTimer
#include "train/timeline.h"        // Timeline
#include "train/trainer.h"         // train_epoch, evaluate

using namespace vqa;

namespace {

data::ShardedLoader open_loader(const std::string& path, const std::string& split,
                                const train::TrainConfig& config, const runtime::RankInfo& rank,
                                bool shuffle) {
  data::LoaderOptions options;
  options.batch_per_rank = config.batch_per_rank;
  options.seed = config.seed;
  options.shuffle = shuffle;
  options.drop_last = shuffle && config.drop_last;
  options.prefetch_depth = config.prefetch_depth;
  options.rank = rank.rank;
  options.world_size = rank.world_size;
  try {
    return data::ShardedLoader(path, split, options);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(e.what());
  }
}

std::vector<train::NamedTensor> trainable_parameters(model::M3AE& model) {
  std::vector<train::NamedTensor> parameters;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad()) parameters.push_back({item.key(), item.value()});
  }
  return parameters;
}

// A checkpoint is never written from non-finite weights.
void require_finite_weights(model::M3AE& model, const std::string& what) {
  const std::string bad = train::first_nonfinite_parameter(model, /*check_values=*/true);
  if (!bad.empty()) {
    runtime::fatal_user_error("parameter " + bad + " holds a NaN or an infinity; not writing " +
                                  what + " (the previous checkpoint stays the latest)",
                              train::kExitNonFinite);
  }
}

// <out>/DONE, written when a run ends, starts with "epochs N". With
// --resume auto a run directory whose DONE covers --epochs is complete. Rank
// 0 decides and tells every rank, so the run directory need not be shared.
bool run_already_complete(const train::TrainConfig& config, const runtime::RankInfo& rank) {
  int64_t done = 0;
  if (rank.rank == 0 && config.resume == "auto") {
    std::ifstream marker(std::filesystem::path(config.out) / "DONE");
    std::string word;
    int64_t epochs = -1;
    done = (marker >> word >> epochs) && word == "epochs" && epochs >= config.epochs ? 1 : 0;
  }
  return runtime::distributed_max(done) != 0;
}

}  // namespace

int main(int argc, char** argv) {
  runtime::keep_freed_memory_for_reuse();  // before the first tensor: see system_info.h
  const runtime::RankInfo& rank = runtime::distributed_init(&argc, &argv);
  // After MPI_Init, whose handlers still take every crash that is not inside HDF5.
  data::hdf5_crash_report_install("[vqa] error on " + runtime::rank_label() + ": ",
                                  /*exit_code=*/2);  // as runtime::fatal_user_error
  runtime::stop_signals_install();
  train::TrainConfig config;
  if (!train::config_parse(argc, argv, rank.rank, config)) {
    runtime::distributed_finalize();
    return 0;
  }
  train::config_finalize(config, rank.world_size);
  runtime::set_collective_timeout(config.comm_timeout);
  const std::string config_ini = train::config_to_ini(config);
  train::require_same_on_all_ranks("configuration", config_ini);
  if (run_already_complete(config, rank)) {
    if (rank.rank == 0) {
      std::printf("vqa_train: %s/DONE: this run completed its %d epochs, nothing to do\n",
                  config.out.c_str(), config.epochs);
    }
    runtime::distributed_finalize();
    return 0;
  }
  const torch::Device device = train::setup_device(config, rank);
  train::RunLog log(config.out, rank.rank == 0);
  if (rank.rank == 0) runtime::warn_if_reference_blas();

  // ---- data -------------------------------------------------------------
  // Node-local copies that differ would hang the collective HDF5 open.
  train::require_same_files_on_all_ranks({config.train_data, config.test_data});
  auto train_loader = open_loader(config.train_data, "train", config, rank, /*shuffle=*/true);
  auto test_loader = open_loader(config.test_data, "test", config, rank, /*shuffle=*/false);
  train::require_same_on_all_ranks(
      "dataset", train_loader.info().identity + "|" + test_loader.info().identity);
  const int64_t steps_per_epoch = train::optimizer_steps_per_epoch(train_loader, config);
  if (steps_per_epoch < 1) {
    runtime::fatal_user_error("the train split of " + config.train_data + " has " +
                              std::to_string(train_loader.info().num_questions) +
                              " questions, fewer than one --global-batch of " +
                              std::to_string(config.global_batch));
  }

  // ---- model, communicator, optimiser -------------------------------------
  const model::ModelConfig model_config = train::setup_model_config(config, train_loader.info());
  torch::manual_seed(config.seed);
  model::M3AE model(model_config);
  model->to(device);
  auto comm = runtime::communicator_create(runtime::backend_from_string(config.backend), device);
  train::broadcast_module_state(*model, *comm);
  train::OptimizerSettings optimizer_settings{
      config.lr,           config.lr_fusion_multiplier, config.lr_head_multiplier,
      config.weight_decay, config.warmup_ratio,         steps_per_epoch * config.epochs};
  train::VqaOptimizer optimizer(model, optimizer_settings);
  train::GradientSynchronizer gradients(
      trainable_parameters(model), *comm,
      train::GradientSyncOptions{config.bucket_mb, config.bf16_allreduce, !config.no_comm});
  // The phase timers and the timeline start together on every rank.
  comm->barrier();
  train::StepTimer timer(device, config.phase_timers);
  train::Timeline timeline(config.timeline, config.timeline_first_step, config.timeline_steps);
  const auto bucket_sizes = gradients.bucket_bytes();
  const int64_t probe_bytes =
      bucket_sizes.empty() ? 0 : *std::max_element(bucket_sizes.begin(), bucket_sizes.end());
  const double probe_gbps = config.phase_timers && !config.no_comm
                                ? train::allreduce_probe_bus_gbps(*comm, probe_bytes, device)
                                : 0.0;

  train::TrainState state;
  std::string resume_from =
      config.resume == "auto" ? train::checkpoint_latest(config.out) : config.resume;
  if (!resume_from.empty()) {
    try {
      train::checkpoint_load(resume_from, model, optimizer, state);
    } catch (const std::exception& e) {
      runtime::fatal_user_error(std::string("--resume: ") + e.what());
    }
  }

  // ---- report the resolved run ---------------------------------------------
  if (rank.rank == 0) {
    std::filesystem::create_directories(config.out);
    train::write_file_atomically((std::filesystem::path(config.out) / "config.ini").string(),
                                 config_ini);
    std::printf("%s", config_ini.c_str());
  }
  const auto& dataset = train_loader.info();
  log.info("vqa_train: " + std::to_string(rank.world_size) + " rank(s), device " + device.str() +
           ", " + std::to_string(torch::get_num_threads()) + " thread(s)/rank, communicator " +
           runtime::backend_name(comm->backend()) + ", BLAS: " + runtime::blas_description());
  log.info("model: " + model::model_config_describe(model_config) + ", " +
           std::to_string(model::parameter_count(*model)) + " parameters");
  log.info("data: " + std::to_string(dataset.num_questions) + " train / " +
           std::to_string(test_loader.info().num_questions) +
           " test questions, K=" + std::to_string(dataset.num_answers) + " answers; global batch " +
           std::to_string(config.global_batch) + " = " + std::to_string(config.batch_per_rank) +
           " per rank x " + std::to_string(rank.world_size) + " ranks x " +
           std::to_string(config.accumulation_steps) + " accumulation step(s); " +
           std::to_string(steps_per_epoch) + " optimiser steps per epoch");
  log.info("gradients: " + std::to_string(gradients.stats().buckets) + " bucket(s), " +
           std::to_string(gradients.stats().bytes_per_step) + " bytes per step" +
           (config.no_comm ? " (communication OFF)" : ""));
  if (probe_gbps > 0) {
    char line[160];
    std::snprintf(line, sizeof(line),
                  "allreduce probe: %.1f MB (the largest bucket) at %.2f GB/s bus bandwidth",
                  probe_bytes / 1e6, probe_gbps);
    log.info(line);
  }
  if (!resume_from.empty()) {
    log.info("resumed from " + resume_from + " at epoch " + std::to_string(state.next_epoch) +
             (state.step_in_epoch > 0
                  ? " (after " + std::to_string(state.step_in_epoch) + " of its optimiser steps)"
                  : std::string()) +
             ", global step " + std::to_string(state.global_step));
  }

  // ---- training ------------------------------------------------------------
  if (state.next_epoch < config.epochs) log.epoch_header();
  bool reported_unused = false;
  auto stop = std::make_unique<runtime::StopAgreement>();
  while (state.next_epoch < config.epochs) {
    const train::GradientSyncStats sync_before = gradients.stats();
    const train::EpochStats epoch_stats =
        train::train_epoch(model, train_loader, optimizer, gradients, *comm, *stop, timer, timeline,
                           config, device, state);
    if (epoch_stats.stop_signal != 0) {
      // Every rank agreed at the same step: checkpoint, then a distinct exit
      // status that job scripts turn into a requeue.
      std::string path;
      if (rank.rank == 0) {
        require_finite_weights(model, "the stop checkpoint");
        path = train::checkpoint_save(config.out, model, optimizer, state, config_ini);
      }
      comm->barrier();
      log.info(std::string("stopped by ") + runtime::stop_signal_name(epoch_stats.stop_signal) +
               " at epoch " + std::to_string(state.next_epoch) + " after " +
               std::to_string(state.step_in_epoch) + " of its optimiser steps (global step " +
               std::to_string(state.global_step) + "); checkpoint " + path + "; exit status " +
               std::to_string(runtime::kExitStopRequested) + ", continue with --resume auto");
      stop.reset();
      comm.reset();
      runtime::distributed_finalize();
      return runtime::kExitStopRequested;
    }
    const int64_t epoch = state.next_epoch - 1;
    if (!reported_unused) {  // the synchroniser found them on the first step; say it once
      for (const auto& name : gradients.unused_parameters()) {
        log.info("warning: parameter " + name + " received no gradient on the first step");
      }
      reported_unused = true;
    }
    const bool evaluate_now = config.eval_every > 0 &&
                              ((epoch + 1) % config.eval_every == 0 || epoch + 1 == config.epochs);
    train::EvalStats eval_stats;
    bool best = false;
    if (evaluate_now) {
      eval_stats = train::evaluate(model, test_loader, *comm, device, epoch, config.bf16_autocast);
      if (eval_stats.accuracy.overall > state.best_overall) {
        state.best_overall = eval_stats.accuracy.overall;
        state.best_epoch = epoch;
        best = true;
      }
    }

    // Why the ranks are (not) N times faster: every rank's phases, to rank 0.
    nlohmann::json report_json;
    std::vector<std::string> report_lines;
    if (config.phase_timers) {
      const auto& sync = gradients.stats();
      const int64_t timed = sync.timed_steps - sync_before.timed_steps;
      const double allreduce_seconds =
          timed > 0 ? (sync.allreduce_seconds - sync_before.allreduce_seconds) / timed : 0.0;
      const auto summaries = train::rank_summaries_gather(train::rank_summary_build(
          rank.rank, epoch_stats.step_times, config.batch_per_rank * config.accumulation_steps,
          evaluate_now ? eval_stats.seconds : 0.0, allreduce_seconds));
      if (rank.rank == 0) {
        const auto report = train::epoch_report_build(epoch, device.is_cuda(), summaries,
                                                      config.no_comm ? 0 : sync.bytes_per_step,
                                                      probe_gbps, probe_bytes);
        report_json = train::epoch_report_json(report);
        report_lines = train::epoch_report_lines(report);
        train::write_file_atomically(
            (std::filesystem::path(config.out) / "diagnosis.json").string(),
            report_json.dump(2) + "\n");
      }
    }
    for (const auto& step_times : epoch_stats.step_times) timeline.add_step(step_times);
    if (timeline.active() && timeline.window_passed(state.global_step)) timeline.write(rank.host);
    log.epoch(epoch, epoch_stats, evaluate_now ? &eval_stats : nullptr, best,
              report_json.is_null() ? nullptr : &report_json);
    for (const auto& line : report_lines) log.info(line);
    if (rank.rank == 0) {
      require_finite_weights(model, "checkpoints of epoch " + std::to_string(epoch));
      if (best) train::checkpoint_save_best(config.out, model, state);
      if (config.save_every > 0 &&
          ((epoch + 1) % config.save_every == 0 || epoch + 1 == config.epochs)) {
        train::checkpoint_save(config.out, model, optimizer, state, config_ini);
      }
    }
    comm->barrier();  // nobody starts the next epoch before rank 0's checkpoint is on disk
  }
  timeline.write(rank.host);  // when the run ended before the window did
  std::string summary = "training complete: " + std::to_string(config.epochs) + " epochs";
  if (state.best_epoch >= 0) {
    char line[128];
    std::snprintf(line, sizeof(line), "; best overall accuracy %.2f%% at epoch %lld",
                  100 * state.best_overall, static_cast<long long>(state.best_epoch));
    summary += line;
  }
  log.info(summary);
  if (rank.rank == 0) {  // written last: a relaunch with --resume auto does nothing
    train::write_file_atomically((std::filesystem::path(config.out) / "DONE").string(),
                                 "epochs " + std::to_string(config.epochs) + "\n" + summary + "\n");
  }
  stop.reset();
  comm.reset();
  runtime::distributed_finalize();
  return 0;
}
