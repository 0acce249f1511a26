#include "train/train_config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <tuple>

#include <torch/version.h>

#include "runtime/check.h"        // fatal_user_error
#include "runtime/distributed.h"  // distributed_rank_info
#include "train/optimizer.h"      // aten_fused_adamw_available
#include "train/projection.h"     // fabric_from_text
#include "util/options.h"         // OptionTable, option_text

namespace vqa::train {

namespace {

using util::option_text;

// The option table, bound to one TrainConfig's fields: help, INI parsing,
// defaults and the saved config all come from it.
void declare_options(util::OptionTable& table, TrainConfig& c) {
  table
      .add("config", &c.config_file,
           "INI file with any of these options (key = value); the command line wins")
      .add("train-data", &c.train_data, "HDF5 dataset made by vqa_prep (train split)")
      .add("test-data", &c.test_data,
           "HDF5 dataset for evaluation (test split); default: --train-data")
      .add("prefetch-depth", &c.prefetch_depth, "batches the loader thread prepares ahead",
           util::Range{1, 64})
      .add("drop-last", &c.drop_last,
           "drop the tail that does not fill every rank instead of wrapping around")
      .add("trim-text-padding", &c.trim_text_padding,
           "cut each batch's questions to the longest one (no compute on padding; the same "
           "outputs within float rounding)")
      .add_choice(
          "augment", &c.augment,
          "train-time augmentation: none | resized-crop (M3AE's clip_resizedcrop: each "
          "sample's image is torchvision's RandomResizedCrop of its source image, then Pillow's "
          "bicubic to the file's image size; the same crop for a sample on any number of ranks "
          "and after a resume; needs a file made with vqa_prep convert --keep-source-images)",
          data::kAugmentNames)
      .add("crop-scale-min", &c.crop_scale_min,
           "resized-crop: smallest crop area, as a share of the image's area",
           util::Range{0, 1, true})
      .add("crop-scale-max", &c.crop_scale_max, "resized-crop: largest crop area share",
           util::Range{0, 1, true})
      .add("crop-ratio-min", &c.crop_ratio_min,
           "resized-crop: smallest aspect ratio (width / height), drawn log-uniformly",
           util::Range{0, 1e6, true})
      .add("crop-ratio-max", &c.crop_ratio_max, "resized-crop: largest aspect ratio",
           util::Range{0, 1e6, true})
      .add("augment-threads", &c.augment_threads,
           "resized-crop: threads per rank cropping each batch, off the I/O thread (0: as many "
           "as --threads)",
           util::Range{0, 1024})
      .add_choice("preset", &c.preset, "model size: tiny | small | base", {"tiny", "small", "base"})
      .add("hidden", &c.hidden, "hidden size (0: preset)", util::Range{0, 16384})
      .add("heads", &c.heads, "attention heads (0: preset)", util::Range{0, 1024})
      .add("ffn", &c.ffn, "feed-forward size (0: preset)", util::Range{0, 65536})
      .add("vision-layers", &c.vision_layers, "ViT layers (0: preset)", util::Range{0, 256})
      .add("text-layers", &c.text_layers, "text encoder layers (0: preset)", util::Range{0, 256})
      .add("fusion-layers", &c.fusion_layers, "co-attention layers per side (0: preset)",
           util::Range{0, 256})
      .add("patch-size", &c.patch_size, "ViT patch size in pixels (0: preset)",
           util::Range{0, 4096})
      .add("dropout", &c.dropout, "dropout probability (< 0: preset)", util::Range{-1, 0.999})
      .add("epochs", &c.epochs, "training epochs", util::Range{1, 100000})
      .add("global-batch", &c.global_batch, "samples per optimiser step over all ranks",
           util::Range{1, 1 << 24})
      .add("batch-per-rank", &c.batch_per_rank, "samples per forward/backward on one rank",
           util::Range{1, 65536})
      .add("lr", &c.lr, "peak learning rate of the encoders (AdamW)", util::Range{0, 10, true})
      .add("lr-fusion-multiplier", &c.lr_fusion_multiplier, "fusion layers' lr = lr x this",
           util::Range{0, 1e6, true})
      .add("lr-head-multiplier", &c.lr_head_multiplier, "VQA head's lr = lr x this",
           util::Range{0, 1e6, true})
      .add("weight-decay", &c.weight_decay, "AdamW weight decay (none on biases and norm weights)",
           util::Range{0, 100})
      .add("warmup-ratio", &c.warmup_ratio,
           "share of optimiser steps with linear warm-up, then linear decay to 0",
           util::Range{0, 1})
      .add("grad-clip", &c.grad_clip, "clip the global gradient norm to this (0: off)",
           util::Range{0, 1e12})
      .add_choice(
          "optimizer-recipe", &c.optimizer_recipe,
          "vqa-hpc (groups by the model's parts, LibTorch's AdamW) | m3ae (M3AE's groups and "
          "decay rules by its parameter names, transformers' AdamW, floor(ratio) warm-up)",
          kOptimizerRecipeNames)
      .add("seed", &c.seed, "seed for initialisation, shuffling and dropout")
      .add_choice("device", &c.device,
                  "auto (cuda when a GPU is usable) | cpu | cuda (the only visible GPU, or the "
                  "local rank's)",
                  kDeviceModeNames)
      .add_choice("backend", &c.backend, "gradient communicator: auto (from --device) | mpi | nccl",
                  runtime::kBackendNames)
      .add_choice(
          "mpi-allreduce", &c.mpi_allreduce,
          "how the MPI backend averages gradient buckets: auto (per bucket size, the fastest "
          "of library, ring and reduce-scatter + allgather in a start-up probe on this fabric, "
          "then tried in the first training steps (--allreduce-tune-steps); the choice goes "
          "to train.log) | "
          "ring (pipelined ring over point-to-point messages, full duplex) | library (the MPI "
          "library's MPI_Allreduce)",
          runtime::kMpiAllreduceNames)
      .add("threads", &c.threads, "CPU threads per rank (0: host cores / ranks on the host)",
           util::Range{0, 1024})
      .add("bucket-mb", &c.bucket_mb,
           "gradient bucket size in MiB for the overlapped allreduce (0: auto, 20 ms of the bus "
           "bandwidth measured at start-up, between 1 and 25 MiB; then half and twice the size "
           "in effect are tried in the first training steps, with the methods on CPU ranks, "
           "the fastest kept: see --allreduce-tune-steps; not with --shard-optimizer or "
           "--cuda-graph)",
           util::Range{0, 1e6})
      .add("allreduce-tune-steps", &c.allreduce_tune_steps,
           "at most this many of the first training steps try the allreduce methods "
           "(--mpi-allreduce auto) and bucket sizes (--bucket-mb 0) in turn (at most a quarter of "
           "the run's steps; the fastest "
           "step time wins, stored in <out>/allreduce_tuning.json and reused on resume); 0: "
           "keep the start-up probe's choice",
           util::Range{0, 1000})
      .add("bf16-allreduce", &c.bf16_allreduce, "send gradients as bfloat16 (half the bytes)")
      .add_choice("sparse-embedding-sync", &c.sparse_embedding_sync,
                  "the word embedding's gradient: on (average only the rows some rank's "
                  "batches touched this step; the others are zero everywhere, the result equals "
                  "the full average) | off (the whole table) | auto (on when it surely sends "
                  "fewer bytes: more than one rank and fewer token positions per step than rows)",
                  kSparseEmbeddingSyncNames)
      .add("shard-optimizer", &c.shard_optimizer,
           "ZeRO-1: each of N ranks keeps and updates 1/N of the AdamW moments; gradient "
           "buckets are reduce-scattered and the updated parameters all-gathered (the same "
           "bytes as the allreduce); checkpoints hold the whole state and resume at any rank "
           "count. Needs 2 or more ranks")
      .add_choice(
          "precision", &c.precision,
          "fp32 | bf16 (bfloat16 autocast of the forward pass: on a GPU, and on the CPU with "
          "LibTorch 2.4 or later; with older LibTorch the CPU computes in float32 and train.log "
          "warns) | fp16 (float16 autocast "
          "on GPU with dynamic loss scaling as PyTorch's GradScaler: scale 2^16, halved and the "
          "step skipped on an overflow, doubled after --loss-scale-interval finite steps; on "
          "the CPU the loss scaler runs around float32 compute)",
          kPrecisionNames)
      .add("tf32", &c.tf32,
           "GPU, float32 parts: matrix products on TF32 tensor cores (inputs rounded to 10 "
           "mantissa bits, float32 sums), as torch.backends.cuda.matmul.allow_tf32 = True; off "
           "is LibTorch's default (float32 matmuls in full precision; cuDNN's convolutions use "
           "TF32 either way). No effect on the CPU")
      .add("loss-scale-interval", &c.loss_scale_interval,
           "fp16: finite optimiser steps in a row before the loss scale doubles",
           util::Range{1, 1e9})
      .add("bf16-autocast", &c.bf16_autocast, "the same as --precision bf16 (older spelling)")
      .add("bf16-hidden-states", &c.bf16_hidden_states,
           "bf16: the hidden states stay bfloat16 between blocks (LayerNorms with float32 "
           "statistics return bfloat16, not the float32 of CUDA autocast's LayerNorm); off by "
           "default: no fewer "
           "operators and losses further from float32's (docs/benchmarks.md)")
      .add("weight-copies", &c.weight_copies,
           "bf16 or fp16 where the forward autocasts (a GPU; bf16 on the CPU with LibTorch 2.4 "
           "on): it computes with copies of the weights and biases "
           "of the linear layers, the patch convolution and the attentions in that dtype, "
           "refreshed from the float32 parameters by one multi-tensor copy per forward, instead "
           "of autocast's cast of each at every use and the cast of each gradient back (two "
           "kernels per tensor and step); the same arithmetic, and half those parameters' bytes "
           "more memory. false: autocast's casts")
      .add_choice("packed-attention", &c.packed_attention,
                  "one GEMM for the q, k and v projections (k and v across); the same function "
                  "and parameter names: on (the option alone) | off | auto (on on a GPU, where "
                  "fewer, larger GEMMs pay; off on the CPU, where they do not)",
                  kPackedAttentionNames, /*implicit=*/"on")
      .add("cuda-graph", &c.cuda_graph,
           "GPU: after 3 eager steps, capture one step's forward, backward and gradient "
           "averaging (NCCL) as a CUDA graph and replay it every step: no host launch cost per "
           "kernel. Pads questions to the dataset's length (as --trim-text-padding false) for "
           "fixed shapes; a batch of other shapes runs eagerly; where capture cannot work (the "
           "CPU, the MPI backend, NCCL before 2.9.6, accumulation) the run is the one without "
           "the option and train.log says why")
      .add("copy-stream", &c.copy_stream,
           "GPU: copy each training batch to the device on a side stream, beside the work "
           "queued before it, which the compute stream then waits for through an event (no "
           "host wait); false: on the compute stream, after that work. No effect on the CPU")
      .add("no-comm", &c.no_comm, "benchmark only: skip the gradient allreduce (ranks diverge)")
      .add("comm-timeout", &c.comm_timeout,
           "seconds a collective may wait: a warning names the ranks that have not arrived at "
           "half of it, the job aborts at it (0: no deadline)",
           util::Range{0, 1e7})
      .add("eval-every", &c.eval_every, "evaluate every N epochs (0: never)", util::Range{0, 1e6})
      .add("save-every", &c.save_every, "write a checkpoint every N epochs (0: never)",
           util::Range{0, 1e6})
      .add("keep-checkpoints", &c.keep_checkpoints,
           "keep the newest N checkpoints, deleting older ones (0: keep all; best_model.pt is "
           "always kept)",
           util::Range{0, 1e6})
      .add("async-checkpoint", &c.async_checkpoint,
           "rank 0 copies the state to host memory at a save and writes it in a background "
           "thread while training goes on (one save in flight; one host copy of the weights and "
           "AdamW moments); false: training waits for the whole write")
      .add("max-steps-per-epoch", &c.max_steps_per_epoch,
           "stop each epoch after N optimiser steps (0: all)", util::Range{0, 1e12})
      .add("log-every-steps", &c.log_every_steps,
           "print a progress line every N optimiser steps (0: per epoch)", util::Range{0, 1e12})
      .add_choice("progress", &c.progress,
                  "progress bar on rank 0: auto (stdout is a terminal and not under mpirun, whose "
                  "ranks always get a pseudo-terminal) | on | off",
                  kProgressNames)
      .add("phase-timers", &c.phase_timers,
           "time each step's phases on every rank; epoch summary and diagnosis on rank 0")
      .add("timeline", &c.timeline,
           "write a Chrome trace-event JSON timeline (Perfetto, chrome://tracing) to this file")
      .add("profile", &c.profile,
           "profile rank 0 over the timeline's steps (--timeline-first-step, --timeline-steps) "
           "with LibTorch's profiler: every operator on the host and, on a GPU, every kernel, "
           "as a Chrome trace in this file; FILE.txt and train.log get the summary (operators "
           "and kernels per step, GPU idle time, the largest by time, matrix products vs "
           "attention vs the rest)")
      .add("project-fabric", &c.project_fabric,
           "the fabric of the projection to 1..1024 ranks printed at the end and saved in "
           "diagnosis.json: auto (this run's measured allreduce bus bandwidth and latency; 10gbe "
           "on 1 CPU rank, ib-ndr on 1 GPU rank), a preset (nvlink-h100, ib-ndr, ib-hdr, 100gbe, "
           "25gbe, 10gbe, 1gbe, pcie-no-p2p) or " VQA_FABRIC_TEXT_FORMAT
           " "
           "(e.g. 12.5:5; vqa_project --help)")
      .add("timeline-first-step", &c.timeline_first_step, "first optimiser step in the timeline",
           util::Range{0, 1e12})
      .add("timeline-steps", &c.timeline_steps, "optimiser steps in the timeline",
           util::Range{1, 1000})
      .add_choice(
          "nonfinite", &c.nonfinite,
          "a non-finite loss or gradient: stop (end the job naming the step and the first bad "
          "parameter) | skip (drop that optimiser step, warn) | off (no check)",
          kNonFiniteNames)
      .add("out", &c.out, "run directory: log, metrics, config, checkpoints")
      .add("resume", &c.resume,
           "'' (start fresh), 'auto' (latest checkpoint in --out if any) or a checkpoint file")
      .add("init-from", &c.init_from,
           "start from these weights: an M3AE state_dict as .safetensors "
           "(data_prep/m3ae_to_safetensors.py m3ae.ckpt), or a vqa-hpc best_model.pt / "
           "checkpoint (the model only); --resume wins when it finds a checkpoint")
      .add("eval-only", &c.eval_only,
           "evaluate the test split once with the --init-from or --resume weights and exit")
      .add("predictions", &c.predictions,
           "with --eval-only: write one JSON line per test question to this file (training "
           "runs write <out>/predictions_best.jsonl at each new best epoch)")
      .add("predictions-top", &c.predictions_top, "answers with scores per prediction line",
           util::Range{1, 1e6})
      .add("predictions-logits", &c.predictions_logits, "add all K logits to every prediction line")
      .add("export-m3ae", &c.export_m3ae,
           "after training (or --eval-only), write the model under M3AE's names and layouts to "
           "this .safetensors file (rank 0, atomically); data_prep/m3ae_from_safetensors.py "
           "makes it a state_dict M3AE's M3AETransformerSS loads with strict=True")
      // Last in --help, apart: options that only the tests use.
      .group("Testing and fault injection (for the tests; not for normal runs)")
      .add("test-nan-step", &c.faults.nan_step,
           "testing only: rank 1 (rank 0 when alone) gets a NaN loss at this optimiser step",
           util::Range{-1, 1e12})
      .add("test-slow-rank", &c.faults.slow_rank,
           "testing only: this rank spends --test-slow-ms more per micro-step in forward",
           util::Range{-1, 1e6})
      .add("test-slow-ms", &c.faults.slow_ms, "testing only: see --test-slow-rank",
           util::Range{0, 1e6})
      .add("test-aten-fused-adamw", &c.faults.aten_fused_adamw,
           "testing only: ATen's fused AdamW, the GPU path (a non-finite step skipped on the "
           "device and read a step later), on the CPU too; LibTorch 2.4 or later")
      .add("test-data-delay-ms", &c.faults.data_delay_ms,
           "testing only: every rank waits this long more for each batch", util::Range{0, 1e6})
      .add("test-kill-in-checkpoint-write", &c.faults.kill_in_checkpoint_write,
           "testing only: rank 0 SIGKILLs itself while writing its Nth checkpoint (0: never), "
           "its temporary file half written",
           util::Range{0, 1e6})
      .config_file_option("config");
}

// Whether this process can create a file in `directory`: tried, since
// access() says yes to root where the file system says no (/proc, a
// read-only mount).
bool writable_directory(const std::filesystem::path& directory) {
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) return false;
  std::string probe = (directory / ".vqa-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

// --out: rank 0 (which writes the log, metrics and checkpoints) creates it
// now, or the job stops naming it.
void require_writable_directory(const std::string& option, const std::string& path) {
  if (path.empty()) runtime::fatal_user_error(option + " must name a directory");
  if (runtime::distributed_rank_info().rank != 0) return;
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error || !writable_directory(path)) {
    runtime::fatal_user_error(option + " " + path + ": cannot write there (" +
                              (error ? error.message() : "not a writable directory") + ")");
  }
}

// A file rank 0 writes during or after the run, checked now without
// creating anything: the path is not a directory, and its folder is
// writable; with parents_made_later (--timeline, --predictions, which make
// their folders when they write) a missing folder is fine when the nearest
// existing one above it is writable.
void require_writable_file(const std::string& option, const std::string& path,
                           bool parents_made_later) {
  if (runtime::distributed_rank_info().rank != 0) return;
  const std::filesystem::path file(path);
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) {
    runtime::fatal_user_error(option + " " + path + ": is a directory, not a file");
  }
  const std::filesystem::path parent = file.parent_path().empty() ? "." : file.parent_path();
  std::filesystem::path existing = parent;
  while (parents_made_later && !std::filesystem::exists(existing, error) && existing != "." &&
         existing != existing.root_path()) {
    existing = existing.has_parent_path() ? existing.parent_path() : ".";
  }
  if (!writable_directory(existing)) {
    runtime::fatal_user_error(option + " " + path + ": cannot write there (" + existing.string() +
                              " is not a writable directory)");
  }
}

// A .safetensors name in a directory rank 0 (the writer) may write, checked
// before any rank trains.
void require_writable_safetensors_path(const std::string& option, const std::string& path) {
  const std::string suffix = ".safetensors";
  if (path.size() <= suffix.size() ||
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    runtime::fatal_user_error(option + " " + path +
                              ": the name must end in .safetensors (what --init-from reads back)");
  }
  require_writable_file(option, path, /*parents_made_later=*/false);
}

}  // namespace

bool config_parse(int argc, char** argv, int rank, TrainConfig& config) {
  util::OptionTable table("vqa_train options");
  declare_options(table, config);
  try {
    if (table.parse(argc, argv)) return true;
  } catch (const util::OptionError& e) {
    runtime::fatal_user_error(std::string("vqa_train: ") + e.what() + " (see --help)");
  }
  if (rank == 0) table.print_help(stdout, "usage: vqa_train --train-data FILE [options]");
  return false;
}

void config_finalize(TrainConfig& c, int world_size) {
  // Each option's own range and choices were checked by the option table
  // (config_parse); what is left here: what depends on several options, on
  // the rank count, and the paths the run will write.
  using runtime::fatal_user_error;
  c.world_size = world_size;
  if (c.train_data.empty())
    fatal_user_error("--train-data is required (make one with vqa_prep synth)");
  if (c.test_data.empty()) c.test_data = c.train_data;
  const int64_t per_micro_step = c.batch_per_rank * world_size;
  if (c.global_batch % per_micro_step != 0) {
    fatal_user_error("--global-batch " + std::to_string(c.global_batch) +
                     " is not a multiple of --batch-per-rank x ranks = " +
                     std::to_string(c.batch_per_rank) + " x " + std::to_string(world_size) + " = " +
                     std::to_string(per_micro_step) + "; choose a global batch that divides");
  }
  c.accumulation_steps = c.global_batch / per_micro_step;
  for (const auto& [name, low, high] :
       {std::tuple{"--crop-scale", c.crop_scale_min, c.crop_scale_max},
        std::tuple{"--crop-ratio", c.crop_ratio_min, c.crop_ratio_max}}) {
    if (low > high) {
      fatal_user_error(std::string(name) + "-min " + option_text(low) + " is above " + name +
                       "-max " + option_text(high));
    }
  }
  if (c.project_fabric != "auto" && !fabric_from_text(c.project_fabric)) {
    fatal_user_error(
        "--project-fabric must be auto, a preset (nvlink-h100, ib-ndr, ib-hdr, "
        "100gbe, 25gbe, 10gbe, 1gbe, pcie-no-p2p) or " VQA_FABRIC_TEXT_FORMAT
        " with positive bandwidths, got '" +
        c.project_fabric + "'");
  }
  if (c.bf16_autocast) {
    if (c.precision == Precision::kFp16) {
      fatal_user_error("--bf16-autocast (= --precision bf16) contradicts --precision fp16");
    }
    c.precision = Precision::kBf16;
  }
  c.bf16_autocast = c.precision == Precision::kBf16;
  if (c.faults.aten_fused_adamw && !aten_fused_adamw_available()) {
    fatal_user_error(std::string("--test-aten-fused-adamw needs LibTorch 2.4 or later; this is ") +
                     TORCH_VERSION);
  }
  if (c.shard_optimizer && world_size < 2) {
    fatal_user_error(
        "--shard-optimizer splits the optimiser state over the ranks; with 1 rank there is "
        "nothing to split (drop the option, or start 2 or more ranks)");
  }
  if (c.shard_optimizer && c.no_comm) {
    fatal_user_error(
        "--shard-optimizer with --no-comm: each rank would update only its share of the "
        "parameters and never receive the others'; drop one of the two");
  }
  if (c.cuda_graph) {
    if (c.sparse_embedding_sync == SparseEmbeddingSync::kOn) {
      fatal_user_error(
          "--cuda-graph with --sparse-embedding-sync on: the rows synchronised change every "
          "step and a CUDA graph replays fixed shapes; use --sparse-embedding-sync off or auto "
          "(auto synchronises the whole table under --cuda-graph)");
    }
  }
  if (c.eval_only && c.init_from.empty() && c.resume.empty()) {
    fatal_user_error(
        "--eval-only needs weights: --init-from FILE (M3AE .safetensors or a vqa-hpc .pt) or "
        "--resume auto|FILE");
  }
  if (!c.predictions.empty() && !c.eval_only) {
    fatal_user_error(
        "--predictions FILE goes with --eval-only (training runs write "
        "<out>/predictions_best.jsonl themselves)");
  }
  // Paths the run writes: refused now, not at the first write hours later.
  if (!c.timeline.empty()) require_writable_file("--timeline", c.timeline, true);
  if (!c.profile.empty()) require_writable_file("--profile", c.profile, true);
  if (!c.predictions.empty()) require_writable_file("--predictions", c.predictions, true);
  if (!c.export_m3ae.empty()) require_writable_safetensors_path("--export-m3ae", c.export_m3ae);
  require_writable_directory("--out", c.out);  // last: a refused run leaves no folder behind
}

std::string config_to_ini(const TrainConfig& config) {
  TrainConfig copy = config;
  util::OptionTable table("vqa_train options");
  declare_options(table, copy);
  auto values = table.values();
  std::sort(values.begin(), values.end());
  std::ostringstream text;
  text << "# vqa_train resolved configuration (read it back with --config)\n";
  text << "# ranks = " << config.world_size
       << ", gradient accumulation steps = " << config.accumulation_steps << "\n";
  for (const auto& [name, value] : values) text << name << " = " << value << "\n";
  return text.str();
}

}  // namespace vqa::train
