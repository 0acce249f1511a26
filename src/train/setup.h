// Start-up steps of vqa_train that main() reads as one line each: before the
// communicator exists they talk to the other ranks through the runtime's
// start-up functions (distributed.h); nothing here runs once training starts.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "data/dataset_info.h"     // DatasetInfo
#include "data/loader.h"           // ShardedLoader
#include "model/m3ae.h"            // M3AE, ModelConfig
#include "runtime/communicator.h"  // Communicator
#include "runtime/distributed.h"   // RankInfo
#include "train/comm_setup.h"      // AllreduceProbe
#include "train/gradient_sync.h"   // GradientSynchronizer, GradientSyncOptions, NamedTensor
#include "train/loss_scaler.h"     // LossScaler
#include "train/optimizer.h"       // VqaOptimizer, OptimizerSettings
#include "train/step_graph.h"      // StepGraph
#include "train/train_config.h"    // TrainConfig
#include "train/train_log.h"       // RunLog
#include "train/train_state.h"     // TrainState
#include "train/trainer.h"         // TrainingParts

namespace vqa::train {

// For --device cuda (or auto with a GPU) the CUDA device runtime::
// cuda_device_for picks (the only visible one, or the local rank's; anything
// else ends every rank naming the counts), else cpu. Sets
// the CPU threads per rank (--threads, default host cores / ranks on the host).
torch::Device setup_device(const TrainConfig& config, const runtime::RankInfo& rank);

// --precision fp16: the loss scaler on `device`, from the checkpoint's
// scale when `state` has one (said in the log); nullptr otherwise.
std::unique_ptr<LossScaler> setup_loss_scaler(const TrainConfig& config,
                                              const torch::Device& device, const TrainState& state,
                                              RunLog& log);

// --packed-attention: whether q, k and v go in one GEMM on `device` (on, or
// auto on a GPU).
bool packed_attention_wanted(PackedAttention mode, const torch::Device& device);

// Packs every attention of `model` where packed_attention_wanted; the log
// says so when packed.
void setup_packed_attention(const TrainConfig& config, const torch::Device& device,
                            model::M3AE& model, RunLog& log);

// ---- data (setup_data.cpp) ----

// The `what` ("configuration", "dataset") every rank describes as `text`
// must be the same: runtime::require_same_on_all_ranks, whose message shows
// the differing lines ("key = value" of an INI text, or '|'-separated
// parts). Collective; main thread.
void require_same_setting_on_all_ranks(const std::string& what, const std::string& text);

// Every rank describes each file by its size and a checksum of its first and
// last 64 KiB (HDF5 keeps its superblock and most metadata there) without
// opening it as HDF5; on a mismatch (node-local copies that differ, a stale
// copy on one node) the job stops before any rank opens the files, naming
// the file, the ranks and their sizes and checksums. A missing file is
// described as missing. Collective; main thread; call before the loaders.
void require_same_files_on_all_ranks(const std::vector<std::string>& paths);

// The recipe against the dataset, before anything is built: --init-from
// FILE.safetensors whose word embedding has RoBERTa-base's 50265 rows is
// M3AE's pretrained model, which reads RoBERTa's tokens, CLIP-normalised
// pixels of the preset's image size and at most its text positions less
// two tokens; any other M3AE-shaped file needs the dataset's vocabulary
// size. A dataset that does not fit ends the job (rank 0 says it, every
// rank exits) naming the file, what the recipe needs, what the file has
// and the `vqa_prep convert` options that make a fitting file (the file's
// own command line with those changed, when it records one).
// `preset_image_size`: the preset's, before the dataset's replaces it.
void require_dataset_fits_recipe(const TrainConfig& config, const data::DatasetInfo& dataset,
                                 int64_t preset_image_size);

// The preset, with the job's size flags and the dataset's vocabulary, answer
// count, image size or feature shape filled in.
model::ModelConfig setup_model_config(const TrainConfig& config, const data::DatasetInfo& dataset);

// With --resume auto: true when <out>/DONE says a run of at least --epochs
// epochs completed there. Rank 0 reads it and tells every rank, so the run
// directory need not be shared. Collective.
bool run_already_complete(const TrainConfig& config, const runtime::RankInfo& rank);

// The loader of `split` ("train" shuffled, "test" in file order) for this
// rank, handing out pinned batches when `device` is a GPU; a bad file ends
// the job with the loader's message (exit 2). Collective (the file is
// opened through MPI-IO).
data::ShardedLoader open_loader(const std::string& path, data::Split split,
                                const TrainConfig& config, const runtime::RankInfo& rank,
                                const torch::Device& device);

// Optimiser steps per epoch of the train split; ends the job when the split
// does not fill one --global-batch.
int64_t steps_per_epoch_or_exit(const data::ShardedLoader& train_loader, const TrainConfig& config);

// --precision bf16 or fp16 where the forward runs under autocast
// (autocast_runs: a GPU, or bf16 on the CPU with LibTorch 2.4 on): with
// --weight-copies the model's forward computes with copies of its weights
// in that dtype (M3AE::use_weight_copies). --precision bf16 on the CPU says
// in the log whether it autocasts or, with LibTorch 1.13, computes in
// float32. After the model has its device, before trainable_parameters.
void setup_precision(const TrainConfig& config, const torch::Device& device, model::M3AE& model,
                     RunLog& log);

// The model's parameters that require a gradient, in registration order,
// each with its compute copy where the model has one.
std::vector<NamedTensor> trainable_parameters(model::M3AE& model);

OptimizerSettings optimizer_settings_from(const TrainConfig& config, int64_t total_steps);
// --init-from FILE: the model's starting weights, before the first step (or
// the evaluation). FILE.safetensors is an M3AE state_dict (m3ae_import; the
// summary of what was loaded, resized, dropped and newly initialised goes to
// the log); anything else is a vqa-hpc checkpoint or best_model.pt (its
// model only). Every rank reads the file; one that does not fit ends the job
// on every rank naming the tensor and both shapes (exit 2). Returns
// "--init-from FILE" for the log, "" without the option.
std::string init_model_if_asked(const TrainConfig& config, model::M3AE& model, RunLog& log);

// --resume: loads the checkpoint it names (with "auto", the newest intact one
// in <out>/checkpoints, or none) into model, optimiser and state; returns its
// path, "" when starting afresh. A bad file ends the job naming it (exit 2).
std::string resume_if_asked(const TrainConfig& config, model::M3AE& model, VqaOptimizer& optimizer,
                            TrainState& state, RunLog& log);

// Rank 0 saves the configuration as the run uses it, config_to_ini(config),
// as <out>/config.ini (durably) and prints it; the values of `config_ini`
// (the configuration as given, before plan_step_graph) that start-up
// changed are noted there as comments.
void save_resolved_config(const TrainConfig& config, const std::string& config_ini,
                          const runtime::RankInfo& rank);

// The run's description for the log: ranks and their hosts, device, threads,
// BLAS, model, data and batch arithmetic, gradient buckets, the probe, where
// it resumed. Collective (the hosts are gathered).
void report_run_start(const TrainingParts& parts, const data::ShardedLoader& train_loader,
                      const data::ShardedLoader& test_loader,
                      const model::ModelConfig& model_config, const AllreduceProbe& probe,
                      const std::string& resumed_from, const TrainState& state);

}  // namespace vqa::train
