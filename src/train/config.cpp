#include "train/config.h"

#include <unistd.h>

#include <algorithm>
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
      .add("prefetch-depth", &c.prefetch_depth, "batches the loader thread prepares ahead")
      .add("drop-last", &c.drop_last,
           "drop the tail that does not fill every rank instead of wrapping around")
      .add("trim-text-padding", &c.trim_text_padding,
           "cut each batch's questions to the longest one (no compute on padding; the same "
           "outputs within float rounding)")
      .add("augment", &c.augment,
           "train-time augmentation: none | resized-crop (M3AE's clip_resizedcrop: each "
           "sample's image is torchvision's RandomResizedCrop of its source image, then Pillow's "
           "bicubic to the file's image size; the same crop for a sample on any number of ranks "
           "and after a resume; needs a file made with vqa_prep convert --keep-source-images)")
      .add("crop-scale-min", &c.crop_scale_min,
           "resized-crop: smallest crop area, as a share of the image's area")
      .add("crop-scale-max", &c.crop_scale_max, "resized-crop: largest crop area share")
      .add("crop-ratio-min", &c.crop_ratio_min,
           "resized-crop: smallest aspect ratio (width / height), drawn log-uniformly")
      .add("crop-ratio-max", &c.crop_ratio_max, "resized-crop: largest aspect ratio")
      .add("augment-threads", &c.augment_threads,
           "resized-crop: threads per rank cropping each batch, off the I/O thread (0: as many "
           "as --threads)")
      .add("preset", &c.preset, "model size: tiny | small | base")
      .add("hidden", &c.hidden, "hidden size (0: preset)")
      .add("heads", &c.heads, "attention heads (0: preset)")
      .add("ffn", &c.ffn, "feed-forward size (0: preset)")
      .add("vision-layers", &c.vision_layers, "ViT layers (0: preset)")
      .add("text-layers", &c.text_layers, "text encoder layers (0: preset)")
      .add("fusion-layers", &c.fusion_layers, "co-attention layers per side (0: preset)")
      .add("patch-size", &c.patch_size, "ViT patch size in pixels (0: preset)")
      .add("dropout", &c.dropout, "dropout probability (< 0: preset)")
      .add("epochs", &c.epochs, "training epochs")
      .add("global-batch", &c.global_batch, "samples per optimiser step over all ranks")
      .add("batch-per-rank", &c.batch_per_rank, "samples per forward/backward on one rank")
      .add("lr", &c.lr, "peak learning rate of the encoders (AdamW)")
      .add("lr-fusion-multiplier", &c.lr_fusion_multiplier, "fusion layers' lr = lr x this")
      .add("lr-head-multiplier", &c.lr_head_multiplier, "VQA head's lr = lr x this")
      .add("weight-decay", &c.weight_decay, "AdamW weight decay (none on biases and norm weights)")
      .add("warmup-ratio", &c.warmup_ratio,
           "share of optimiser steps with linear warm-up, then linear decay to 0")
      .add("grad-clip", &c.grad_clip, "clip the global gradient norm to this (0: off)")
      .add("optimizer-recipe", &c.optimizer_recipe,
           "vqa-hpc (groups by the model's parts, LibTorch's AdamW) | m3ae (M3AE's groups and "
           "decay rules by its parameter names, transformers' AdamW, floor(ratio) warm-up)")
      .add("seed", &c.seed, "seed for initialisation, shuffling and dropout")
      .add("device", &c.device, "auto | cpu | cuda (GPU = local rank)")
      .add("backend", &c.backend, "gradient communicator: auto (from --device) | mpi | nccl")
      .add("mpi-allreduce", &c.mpi_allreduce,
           "how the MPI backend averages gradient buckets: ring (pipelined ring over "
           "point-to-point messages, full duplex) | library (the MPI library's MPI_Allreduce)")
      .add("threads", &c.threads, "CPU threads per rank (0: host cores / ranks on the host)")
      .add("bucket-mb", &c.bucket_mb,
           "gradient bucket size in MiB for the overlapped allreduce (0: auto, 20 ms of the bus "
           "bandwidth measured at start-up, between 1 and 25 MiB)")
      .add("bf16-allreduce", &c.bf16_allreduce, "send gradients as bfloat16 (half the bytes)")
      .add("precision", &c.precision,
           "fp32 | bf16 (bfloat16 autocast of the forward pass on GPU) | fp16 (float16 autocast "
           "on GPU with dynamic loss scaling as PyTorch's GradScaler: scale 2^16, halved and the "
           "step skipped on an overflow, doubled after --loss-scale-interval finite steps; on "
           "the CPU the loss scaler runs around float32 compute)")
      .add("loss-scale-interval", &c.loss_scale_interval,
           "fp16: finite optimiser steps in a row before the loss scale doubles")
      .add("bf16-autocast", &c.bf16_autocast, "the same as --precision bf16 (older spelling)")
      .add("packed-attention", &c.packed_attention,
           "one GEMM for the q, k and v projections (k and v across); the same function and "
           "parameter names")
      .add("no-comm", &c.no_comm, "benchmark only: skip the gradient allreduce (ranks diverge)")
      .add("comm-timeout", &c.comm_timeout,
           "seconds a collective may wait: a warning names the ranks that have not arrived at "
           "half of it, the job aborts at it (0: no deadline)")
      .add("eval-every", &c.eval_every, "evaluate every N epochs (0: never)")
      .add("save-every", &c.save_every, "write a checkpoint every N epochs (0: never)")
      .add("keep-checkpoints", &c.keep_checkpoints,
           "keep the newest N checkpoints, deleting older ones (0: keep all; best_model.pt is "
           "always kept)")
      .add("max-steps-per-epoch", &c.max_steps_per_epoch,
           "stop each epoch after N optimiser steps (0: all)")
      .add("log-every-steps", &c.log_every_steps,
           "print a progress line every N optimiser steps (0: per epoch)")
      .add("progress", &c.progress,
           "progress bar on rank 0: auto (stdout is a terminal and not under mpirun, whose "
           "ranks always get a pseudo-terminal) | on | off")
      .add("phase-timers", &c.phase_timers,
           "time each step's phases on every rank; epoch summary and diagnosis on rank 0")
      .add("timeline", &c.timeline,
           "write a Chrome trace-event JSON timeline (Perfetto, chrome://tracing) to this file")
      .add("project-fabric", &c.project_fabric,
           "the fabric of the projection to 1..1024 ranks printed at the end and saved in "
           "diagnosis.json: auto (this run's measured allreduce bus bandwidth and latency; 10gbe "
           "on 1 CPU rank, ib-ndr on 1 GPU rank), a preset (nvlink-h100, ib-ndr, ib-hdr, 100gbe, "
           "25gbe, 10gbe, 1gbe, pcie-no-p2p) or BUSGBPS:LATENCYUS (e.g. 12.5:5)")
      .add("timeline-first-step", &c.timeline_first_step, "first optimiser step in the timeline")
      .add("timeline-steps", &c.timeline_steps, "optimiser steps in the timeline")
      .add("nonfinite", &c.nonfinite,
           "a non-finite loss or gradient: stop (end the job naming the step and the first bad "
           "parameter) | skip (drop that optimiser step, warn) | off (no check)")
      .add("test-nan-step", &c.faults.nan_step,
           "testing only: rank 1 (rank 0 when alone) gets a NaN loss at this optimiser step")
      .add("test-slow-rank", &c.faults.slow_rank,
           "testing only: this rank spends --test-slow-ms more per micro-step in forward")
      .add("test-slow-ms", &c.faults.slow_ms, "testing only: see --test-slow-rank")
      .add("test-aten-fused-adamw", &c.faults.aten_fused_adamw,
           "testing only: ATen's fused AdamW, the GPU path (a non-finite step skipped on the "
           "device and read a step later), on the CPU too; LibTorch 2.4 or later")
      .add("test-data-delay-ms", &c.faults.data_delay_ms,
           "testing only: every rank waits this long more for each batch")
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
      .add("predictions-top", &c.predictions_top, "answers with scores per prediction line")
      .add("predictions-logits", &c.predictions_logits, "add all K logits to every prediction line")
      .add("export-m3ae", &c.export_m3ae,
           "after training (or --eval-only), write the model under M3AE's names and layouts to "
           "this .safetensors file (rank 0, atomically); data_prep/m3ae_from_safetensors.py "
           "makes it a state_dict M3AE's M3AETransformerSS loads with strict=True")
      .config_file_option("config");
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
  if (runtime::distributed_rank_info().rank != 0) return;
  const auto parent = std::filesystem::path(path).parent_path();
  const std::string directory = parent.empty() ? "." : parent.string();
  if (!std::filesystem::is_directory(directory) || ::access(directory.c_str(), W_OK | X_OK) != 0) {
    runtime::fatal_user_error(option + " " + path + ": cannot write there (" + directory +
                              " is not a writable directory)");
  }
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
  using runtime::fatal_user_error;
  c.world_size = world_size;
  if (c.train_data.empty())
    fatal_user_error("--train-data is required (make one with vqa_prep synth)");
  if (c.test_data.empty()) c.test_data = c.train_data;
  if (c.epochs < 1) fatal_user_error("--epochs must be >= 1, got " + std::to_string(c.epochs));
  if (c.batch_per_rank < 1) {
    fatal_user_error("--batch-per-rank must be >= 1, got " + std::to_string(c.batch_per_rank));
  }
  const int64_t per_micro_step = c.batch_per_rank * world_size;
  if (c.global_batch < 1 || c.global_batch % per_micro_step != 0) {
    fatal_user_error("--global-batch " + std::to_string(c.global_batch) +
                     " is not a multiple of --batch-per-rank x ranks = " +
                     std::to_string(c.batch_per_rank) + " x " + std::to_string(world_size) + " = " +
                     std::to_string(per_micro_step) + "; choose a global batch that divides");
  }
  c.accumulation_steps = c.global_batch / per_micro_step;
  if (c.lr <= 0) fatal_user_error("--lr must be > 0, got " + option_text(c.lr));
  if (c.warmup_ratio < 0 || c.warmup_ratio > 1) {
    fatal_user_error("--warmup-ratio must be in [0, 1], got " + option_text(c.warmup_ratio));
  }
  if (!(c.bucket_mb >= 0) || c.bucket_mb > 1e6)
    fatal_user_error("--bucket-mb must be 0 (auto) or a size in (0, 1e6] MiB, got " +
                     option_text(c.bucket_mb));
  if (c.mpi_allreduce != "ring" && c.mpi_allreduce != "library") {
    fatal_user_error("--mpi-allreduce must be ring or library, got '" + c.mpi_allreduce + "'");
  }
  if (c.augment != "none" && c.augment != "resized-crop") {
    fatal_user_error("--augment must be none or resized-crop, got '" + c.augment + "'");
  }
  // Finite, 0 < min <= max; areas at most the whole image.
  for (const auto& [name, low, high, limit] :
       {std::tuple{"--crop-scale", c.crop_scale_min, c.crop_scale_max, 1.0},
        std::tuple{"--crop-ratio", c.crop_ratio_min, c.crop_ratio_max, 1e6}}) {
    if (!(low > 0) || !(low <= high) || !(high <= limit)) {
      fatal_user_error(std::string(name) + "-min and " + name + "-max must satisfy 0 < min <= " +
                       "max <= " + option_text(limit) + ", got " + option_text(low) + " and " +
                       option_text(high));
    }
  }
  if (c.augment_threads < 0 || c.augment_threads > 1024) {
    fatal_user_error("--augment-threads must be 0 (as --threads) or 1..1024, got " +
                     std::to_string(c.augment_threads));
  }
  if (c.prefetch_depth < 1) {
    fatal_user_error("--prefetch-depth must be >= 1, got " + std::to_string(c.prefetch_depth));
  }
  if (c.progress != "auto" && c.progress != "on" && c.progress != "off") {
    fatal_user_error("--progress must be auto, on or off, got '" + c.progress + "'");
  }
  if (c.timeline_steps < 1 || c.timeline_steps > 1000) {
    fatal_user_error("--timeline-steps must be in [1, 1000] (the file grows with it), got " +
                     std::to_string(c.timeline_steps));
  }
  if (c.project_fabric != "auto" && !fabric_from_text(c.project_fabric)) {
    fatal_user_error(
        "--project-fabric must be auto, a preset (nvlink-h100, ib-ndr, ib-hdr, "
        "100gbe, 25gbe, 10gbe, 1gbe, pcie-no-p2p) or BUSGBPS:LATENCYUS with a positive "
        "bandwidth, got '" +
        c.project_fabric + "'");
  }
  if (c.timeline_first_step < 0) {
    fatal_user_error("--timeline-first-step must be >= 0, got " +
                     std::to_string(c.timeline_first_step));
  }
  if (c.keep_checkpoints < 0) {
    fatal_user_error("--keep-checkpoints must be >= 0 (0 keeps all), got " +
                     std::to_string(c.keep_checkpoints));
  }
  if (c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp16") {
    fatal_user_error("--precision must be fp32, bf16 or fp16, got '" + c.precision + "'");
  }
  if (c.bf16_autocast) {
    if (c.precision == "fp16") {
      fatal_user_error("--bf16-autocast (= --precision bf16) contradicts --precision fp16");
    }
    c.precision = "bf16";
  }
  c.bf16_autocast = c.precision == "bf16";
  if (c.loss_scale_interval < 1) {
    fatal_user_error("--loss-scale-interval must be >= 1, got " +
                     std::to_string(c.loss_scale_interval));
  }
  if (c.nonfinite != "stop" && c.nonfinite != "skip" && c.nonfinite != "off") {
    fatal_user_error("--nonfinite must be stop, skip or off, got '" + c.nonfinite + "'");
  }
  if (c.faults.aten_fused_adamw && !aten_fused_adamw_available()) {
    fatal_user_error(std::string("--test-aten-fused-adamw needs LibTorch 2.4 or later; this is ") +
                     TORCH_VERSION);
  }
  if (c.faults.slow_ms < 0 || c.faults.data_delay_ms < 0) {
    fatal_user_error("--test-slow-ms and --test-data-delay-ms must be >= 0");
  }
  if (c.optimizer_recipe != "vqa-hpc" && c.optimizer_recipe != "m3ae") {
    fatal_user_error("--optimizer-recipe must be vqa-hpc or m3ae, got '" + c.optimizer_recipe +
                     "'");
  }
  if (c.predictions_top < 1) {
    fatal_user_error("--predictions-top must be >= 1, got " + std::to_string(c.predictions_top));
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
  if (!c.export_m3ae.empty()) require_writable_safetensors_path("--export-m3ae", c.export_m3ae);
  for (const char* device : {"auto", "cpu", "cuda"}) {
    if (c.device == device) return;
  }
  fatal_user_error("--device must be auto, cpu or cuda, got '" + c.device + "'");
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

uint64_t stable_hash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char byte : text) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace vqa::train
