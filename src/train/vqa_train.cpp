// vqa_train: data-parallel fine-tuning of an M3AE-style VQA model.
//
//   mpirun -np 2 build/vqa_train --config jobs/configs/quickstart.ini
//
// One rank per GPU (or per group of CPU cores). Every rank reads its own
// shard of the HDF5 dataset, gradients are averaged in buckets while backward
// runs, and every rank evaluates its shard of the test split.
#include <torch/torch.h>

#include <cstdio>

#include "data/hdf5_crash.h"           // hdf5_crash_report_install
#include "model/m3ae.h"                // M3AE
#include "runtime/check.h"             // rank_label
#include "runtime/communicator.h"      // communicator_create
#include "runtime/distributed.h"       // DistributedSession
#include "runtime/stop_request.h"      // stop_signals_install
#include "runtime/system_info.h"       // keep_freed_memory_for_reuse, mpi_yield_when_idle, ...
#include "runtime/watchdog.h"          // set_collective_timeout
#include "train/allreduce_autotune.h"  // AllreduceAutotune, AutotuneSetup
#include "train/comm_setup.h"          // gradient_bucket_mb, row_sync_choice, allreduce_probe_for
#include "train/gradient_sync.h"       // GradientSynchronizer, broadcast_module_state
#include "train/optimizer.h"           // VqaOptimizer
#include "train/setup.h"               // start-up steps: setup_*, open_loader, resume_if_asked, ...
#include "train/step_timer.h"          // StepTimer
#include "train/timeline.h"            // Timeline
#include "train/train_config.h"        // TrainConfig, config_parse, config_finalize, config_to_ini
#include "train/train_log.h"           // RunLog
#include "train/trainer.h"             // TrainingParts
#include "train/training_loop.h"       // run_training

using namespace vqa;

namespace {

// The job, from the command line to the last epoch; main() runs it inside
// the MPI session and turns any exception into the job's error line.
int run_job(const runtime::RankInfo& rank, int argc, char** argv) {
  // ---- configuration ------------------------------------------------------
  train::TrainConfig config;
  if (!train::config_parse(argc, argv, rank.rank, config)) return 0;  // --help
  train::config_finalize(config, rank.world_size);
  runtime::set_collective_timeout(config.comm_timeout);
  const std::string config_ini = train::config_to_ini(config);
  train::require_same_setting_on_all_ranks("configuration", config_ini);
  if (!config.eval_only && train::run_already_complete(config, rank)) {
    if (rank.rank == 0) {
      std::printf("vqa_train: %s/DONE: this run completed its %d epochs, nothing to do\n",
                  config.out.c_str(), config.epochs);
    }
    return 0;
  }
  const torch::Device device = train::setup_device(config, rank);
  train::RunLog log(config.out, /*writer=*/rank.rank == 0, device);
  if (rank.rank == 0) runtime::warn_if_reference_blas();
  const train::StepGraphPlan graph_plan = train::plan_step_graph(config, device, log);
  // What checkpoints record: the configuration as this run uses it (the plan
  // may have changed it: --cuda-graph pads questions where it captures).
  const std::string used_config_ini = train::config_to_ini(config);

  // ---- data -----------------------------------------------------------------
  // Node-local copies that differ would hang the collective HDF5 open.
  train::require_same_files_on_all_ranks({config.train_data, config.test_data});
  auto train_loader =
      train::open_loader(config.train_data, data::Split::kTrain, config, rank, device);
  auto test_loader = train::open_loader(config.test_data, data::Split::kTest, config, rank, device);
  train::require_same_setting_on_all_ranks(
      "dataset", train_loader.info().identity + "|" + test_loader.info().identity);
  const int64_t steps_per_epoch = train::steps_per_epoch_or_exit(train_loader, config);

  // ---- model, communicator, optimiser -------------------------------------
  const model::ModelConfig model_config = train::setup_model_config(config, train_loader.info());
  torch::manual_seed(config.seed);
  model::M3AE model(model_config);
  train::setup_packed_attention(config, device, model, log);
  const std::string initialized_from = train::init_model_if_asked(config, model, log);
  model->to(device);
  train::setup_precision(config, device, model, log);
  auto comm = runtime::communicator_create(config.backend, device, config.mpi_allreduce);
  train::broadcast_module_state(*model, *comm);
  const auto step_graph = train::setup_step_graph(graph_plan, device);  // --cuda-graph
  train::VqaOptimizer optimizer(
      model, train::optimizer_settings_from(config, steps_per_epoch * config.epochs));
  auto parameters = train::trainable_parameters(model);
  const double bucket_mb = train::gradient_bucket_mb(config, *comm, parameters, device, log);
  const train::RowSyncChoice row_sync =
      train::row_sync_choice(config, rank.world_size, parameters,
                             train_loader.info().max_question_length, graph_plan.capture, log);
  train::GradientSynchronizer gradients(
      std::move(parameters), *comm, train::gradient_sync_options_from(config, bucket_mb, row_sync));
  if (config.shard_optimizer) {
    const auto layout = gradients.shard_layout();
    int64_t owned = 0, total = 0;
    for (const auto& bucket : layout) {
      if (!bucket.sharded) continue;
      owned += bucket.end - bucket.begin;
      total += bucket.values.numel();
    }
    optimizer.shard(layout, [&gradients](int64_t bucket) { gradients.gather_parameters(bucket); });
    log.info("--shard-optimizer: rank 0 updates " + std::to_string(owned) + " of the " +
             std::to_string(total) + " sharded values" +
             (gradients.row_sync() ? " plus the word embedding, which is synchronised by rows "
                                     "and stays whole on every rank"
                                   : "") +
             "; buckets are reduce-scattered, the parameters all-gathered after the step");
  }
  comm->barrier();  // the phase timers and the timeline start together on every rank
  train::StepTimer timer(device, config.phase_timers);
  train::Timeline timeline(config.timeline, config.timeline_first_step, config.timeline_steps);
  const train::AllreduceProbe probe = train::allreduce_probe_for(config, *comm, gradients, device);
  train::OperatorProfile profile(config.profile, config.timeline_first_step, config.timeline_steps,
                                 rank.rank == 0, device.is_cuda());
  train::TrainingParts parts{config, device, model,    optimizer, gradients,
                             *comm,  timer,  timeline, log};
  parts.profile = &profile;
  parts.graph = step_graph.get();
  train::DeviceBatchCopy batch_copy(device, config.copy_stream);
  parts.copy = &batch_copy;

  // ---- resume, report ---------------------------------------------------------
  train::TrainState state;
  const std::string resumed_from = train::resume_if_asked(config, model, optimizer, state, log);
  const auto scaler = train::setup_loss_scaler(config, device, state, log);
  parts.scaler = scaler.get();
  // --mpi-allreduce auto: the first steps try the allreduce methods (or a
  // resumed run reuses the stored choice).
  train::AutotuneSetup tune_setup{
      gradients.bucket_bytes(),
      state.global_step,
      steps_per_epoch * config.epochs - state.global_step,
      config.no_comm || config.eval_only ? 0 : config.allreduce_tune_steps,
      config.phase_timers,
      config.out + "/allreduce_tuning.json"};
  train::AllreduceAutotune autotune(*comm, tune_setup, log);
  parts.autotune = &autotune;
  train::save_resolved_config(config, config_ini, rank);
  train::report_run_start(parts, train_loader, test_loader, model_config, probe, resumed_from,
                          state);

  // ---- evaluation only, or training ------------------------------------------
  if (config.eval_only) {
    return train::run_evaluation_only(
        parts, test_loader, resumed_from.empty() ? initialized_from : "--resume " + resumed_from);
  }
  return train::run_training(parts, train_loader, test_loader, probe, used_config_ini, state);
}

}  // namespace

int main(int argc, char** argv) {
  runtime::keep_freed_memory_for_reuse();  // before the first tensor: see system_info.h
  runtime::mpi_yield_when_idle();          // before MPI_Init: see system_info.h
  runtime::ignore_broken_pipe_signal();    // a lost peer is named, not a SIGPIPE death
  // Declared first, so MPI ends after everything below is destroyed (the
  // loaders close their file collectively), on every return path.
  runtime::DistributedSession session(&argc, &argv);
  // After MPI_Init, whose handlers still take every crash that is not inside HDF5.
  data::hdf5_crash_report_install("[vqa] error on " + runtime::rank_label() + ": ",
                                  /*exit_code=*/2);  // as runtime::fatal_user_error
  runtime::stop_signals_install();
  // Nothing a user types may end in std::terminate: an exception that
  // escapes the job is its error line, exit status 2, on every rank (the
  // abort ends the ranks that did not throw).
  try {
    return run_job(session.rank_info(), argc, argv);
  } catch (const c10::Error& e) {
    runtime::fatal_user_error(std::string("vqa_train: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    runtime::fatal_user_error(std::string("vqa_train: ") + e.what());
  }
}
