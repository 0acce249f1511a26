// The training job's configuration: declared once as a Boost.ProgramOptions
// table that gives --help, the INI config file (--config) and the defaults.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "data/dataset_info.h"     // Augment and its names
#include "runtime/communicator.h"  // Backend, MpiAllreduce and their names
#include "runtime/watchdog.h"      // kDefaultCollectiveTimeoutSeconds
#include "util/mode_names.h"       // ModeNames

namespace vqa::train {

// The job's modes, each parsed once from its text (the tables below) and
// compared as an enum from then on.
// vqa-hpc: groups by the model's parts, LibTorch's AdamW; m3ae: M3AE's groups
// and decay rules by parameter name, transformers' AdamW (optimizer.h).
enum class OptimizerRecipe { kVqaHpc, kM3ae };
inline const util::ModeNames<OptimizerRecipe> kOptimizerRecipeNames = {
    {"vqa-hpc", OptimizerRecipe::kVqaHpc}, {"m3ae", OptimizerRecipe::kM3ae}};
enum class DeviceMode { kAuto, kCpu, kCuda };
inline const util::ModeNames<DeviceMode> kDeviceModeNames = {
    {"auto", DeviceMode::kAuto}, {"cpu", DeviceMode::kCpu}, {"cuda", DeviceMode::kCuda}};
enum class Precision { kFp32, kBf16, kFp16 };
inline const util::ModeNames<Precision> kPrecisionNames = {
    {"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}};
enum class Progress { kAuto, kOn, kOff };
inline const util::ModeNames<Progress> kProgressNames = {
    {"auto", Progress::kAuto}, {"on", Progress::kOn}, {"off", Progress::kOff}};
enum class NonFinite { kStop, kSkip, kOff };
inline const util::ModeNames<NonFinite> kNonFiniteNames = {
    {"stop", NonFinite::kStop}, {"skip", NonFinite::kSkip}, {"off", NonFinite::kOff}};

// The word embedding's gradient: averaged by the rows the step's batches
// touched (gradient_sync.h), in full, or by rows when that sends fewer bytes.
enum class SparseEmbeddingSync { kAuto, kOn, kOff };
inline const util::ModeNames<SparseEmbeddingSync> kSparseEmbeddingSyncNames = {
    {"auto", SparseEmbeddingSync::kAuto},
    {"on", SparseEmbeddingSync::kOn},
    {"off", SparseEmbeddingSync::kOff}};

// q, k and v in one GEMM (model/layers.h): on, off, or auto (on on a GPU,
// where it measured faster, off on the CPU, where it did not). The other
// names are what the option took when it was a bool.
enum class PackedAttention { kAuto, kOn, kOff };
inline const util::ModeNames<PackedAttention> kPackedAttentionNames = {
    {"auto", PackedAttention::kAuto}, {"on", PackedAttention::kOn},
    {"off", PackedAttention::kOff},   {"true", PackedAttention::kOn},
    {"false", PackedAttention::kOff}, {"yes", PackedAttention::kOn},
    {"no", PackedAttention::kOff},    {"1", PackedAttention::kOn},
    {"0", PackedAttention::kOff}};

// Test-only fault injection, for the tests of the diagnosis, of non-finite
// values and of preemption; settable from the command line (--test-*) like
// every other option, never set in a real run.
struct FaultInjection {
  int64_t nan_step = -1;  // rank 1's (rank 0 alone) loss becomes NaN at this optimiser step
  int slow_rank = -1;     // this rank spends slow_ms more per micro-step in forward
  double slow_ms = 0.0;
  double data_delay_ms = 0.0;  // every rank waits this long more for each batch
  // ATen's fused AdamW on the CPU too (the GPU path: skips decided on the
  // device and read a step later); LibTorch 2.4 or later
  bool aten_fused_adamw = false;
  int64_t kill_in_checkpoint_write = 0;  // rank 0 dies writing its Nth checkpoint (0: never)
};

struct TrainConfig {
  // data
  std::string train_data;  // HDF5 file made by vqa_prep
  std::string test_data;   // defaults to train_data (the file holds both splits)
  int prefetch_depth = 4;
  bool drop_last = false;
  bool trim_text_padding = true;  // cut each batch's text to its longest question
  // Train-time augmentation: none | resized-crop (M3AE's clip_resizedcrop:
  // RandomResizedCrop of the source images with these ranges, bicubic).
  data::Augment augment = data::Augment::kNone;
  double crop_scale_min = 0.9, crop_scale_max = 1.0;
  double crop_ratio_min = 3.0 / 4.0, crop_ratio_max = 4.0 / 3.0;
  int augment_threads = 0;  // crop threads per rank and batch; 0: as many as --threads
  // model
  std::string preset = "tiny";
  int64_t hidden = 0, heads = 0, ffn = 0, vision_layers = 0, text_layers = 0, fusion_layers = 0,
          patch_size = 0;  // 0: the preset's value
  double dropout = -1.0;   // < 0: the preset's value
  // optimisation
  int epochs = 10;
  int64_t global_batch = 64;
  int64_t batch_per_rank = 32;
  double lr = 5e-5;
  double lr_fusion_multiplier = 5.0;
  double lr_head_multiplier = 50.0;
  double weight_decay = 0.01;
  double warmup_ratio = 0.1;
  double grad_clip = 0.0;  // max global gradient norm; 0: off
  OptimizerRecipe optimizer_recipe = OptimizerRecipe::kVqaHpc;
  uint64_t seed = 42;
  // distributed
  DeviceMode device = DeviceMode::kAuto;
  runtime::Backend backend = runtime::Backend::kAuto;
  runtime::MpiAllreduce mpi_allreduce = runtime::MpiAllreduce::kAuto;
  int threads = 0;         // CPU threads per rank; 0: host cores / ranks on the host
  double bucket_mb = 0.0;  // 0: auto, from the start-up probe (gradient_bucket_mb)
  // --mpi-allreduce auto: steps at most that try the methods in training (allreduce_autotune.h)
  int allreduce_tune_steps = 16;
  bool bf16_allreduce = false;
  SparseEmbeddingSync sparse_embedding_sync = SparseEmbeddingSync::kAuto;
  // ZeRO-1: each rank keeps and updates 1/N of the AdamW state (gradient_sync.h)
  bool shard_optimizer = false;
  bool bf16_autocast = false;  // the older spelling of precision = "bf16"
  bool tf32 = false;           // fp32 matmuls on TF32 tensor cores (GPU)
  // bf16: bfloat16 autocast (GPU; CPU with LibTorch 2.4 on: autocast_runs);
  // fp16: float16 autocast on GPU with dynamic loss scaling (on the CPU the
  // loss scaler around float32)
  Precision precision = Precision::kFp32;
  int64_t loss_scale_interval = 2000;  // fp16: finite steps before the scale doubles
  bool bf16_hidden_states = false;     // bf16: LayerNorms return bf16 (ModelConfig)
  bool weight_copies = true;           // where autocast runs: compute with copies of the weights
  PackedAttention packed_attention = PackedAttention::kAuto;  // one GEMM for q, k, v
  bool cuda_graph = false;  // GPU: replay each step's forward and backward as a CUDA graph
  bool copy_stream = true;  // GPU: batches copied to the device on a side stream
  bool no_comm = false;     // benchmark only: skip the gradient allreduce (ranks diverge)
  double comm_timeout = runtime::kDefaultCollectiveTimeoutSeconds;  // per collective; 0: none
  // loop, evaluation, output
  int eval_every = 1;
  int save_every = 1;
  int keep_checkpoints = 3;             // newest checkpoints kept in <out>/checkpoints; 0: all
  bool async_checkpoint = true;         // written by a background thread from a host copy
  int64_t max_steps_per_epoch = 0;      // 0: whole epoch (benchmarks cap it)
  int64_t log_every_steps = 0;          // 0: only per-epoch lines
  Progress progress = Progress::kAuto;  // the in-place progress bar on rank 0
  bool phase_timers = true;             // per-step phase timers, epoch summary and diagnosis
  std::string timeline;                 // Chrome trace-event JSON file; "" none
  std::string profile;  // rank 0's operator/kernel profile over the timeline window; "" none
  std::string project_fabric = "auto";     // auto | preset | BUSGBPS:LATENCYUS[:...]
  int64_t timeline_first_step = 10;        // first global optimiser step in the timeline
  int64_t timeline_steps = 5;              // optimiser steps in the timeline
  NonFinite nonfinite = NonFinite::kStop;  // a non-finite loss or gradient
  std::string out = "runs/quickstart";
  std::string resume;       // "" none, "auto" latest in --out, or a checkpoint file
  std::string init_from;    // weights to start from: M3AE .safetensors, or a vqa-hpc .pt
  bool eval_only = false;   // evaluate the test split once and exit
  std::string predictions;  // --eval-only: JSON lines per question to this file
  int64_t predictions_top = 5;
  bool predictions_logits = false;
  std::string export_m3ae;  // rank 0 writes the final model under M3AE's names here (.safetensors)
  std::string config_file;
  FaultInjection faults;  // --test-* options

  // Derived, filled by config_finalize.
  int world_size = 1;
  int64_t accumulation_steps = 1;

  // The forward's autocast dtype: kBFloat16, kHalf, or kFloat (none); where
  // it applies: autocast_runs (train/autocast.h).
  at::ScalarType autocast_dtype() const {
    return precision == Precision::kBf16   ? at::kBFloat16
           : precision == Precision::kFp16 ? at::kHalf
                                           : at::kFloat;
  }
};

// Parses the command line and, with --config FILE, an INI file (command line
// wins). Returns false after printing --help (rank 0 prints). On any error it
// ends the job with a message naming the option and value.
bool config_parse(int argc, char** argv, int rank, TrainConfig& config);

// Checks values and derives accumulation_steps = global / (per-rank x ranks);
// ends the job with a clear message when the global batch does not divide.
void config_finalize(TrainConfig& config, int world_size);

// The resolved configuration as INI text ("key = value" lines, sorted), which
// --config reads back. Derived values appear as comments.
std::string config_to_ini(const TrainConfig& config);

}  // namespace vqa::train
