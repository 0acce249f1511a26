// Checkpoints of the whole run: model, optimiser (AdamW moments and step
// counts), schedule position, epoch (and the step inside it after a stop
// request), best result and the resolved config. The sampler and the random
// state need no bytes of their own: both are derived from (seed, epoch, step).
// Only rank 0 writes, except the optimiser's parts of a sharded checkpoint
// (--shard-optimizer, checkpoint_shards.h), which every rank writes; every
// rank reads (the run directory is on a shared file system on clusters).
//
// Integrity. Every checkpoint file F (and best_model.pt) has a sidecar
// F.crc32 holding one line "crc32 XXXXXXXX size N": zlib's CRC-32 (the one of
// gzip and zip) and the byte count of F. Reading checks both before LibTorch
// parses a byte, so a truncated or corrupt file is reported as such instead
// of failing deep inside the zip reader or, for flipped bits inside a tensor,
// not failing at all. A file handed over with a matching sidecar or none is
// then checked as untrusted input before LibTorch parses it: its zip, the
// CRC-32 of every record LibTorch parses, its TorchScript source
// (checkpoint_archive.h).
//
// Durability. F is written as F.tmp and fsync'ed; its sidecar is written the
// same way; then F.tmp is renamed to F and the directory fsync'ed; `latest`
// is rewritten (again atomically) only after that. A kill or a power cut at
// any moment therefore leaves every earlier checkpoint and `latest` as they
// were, and `latest` always names a complete file whose checksum matches.
//
// Rotation. After each save the oldest checkpoints beyond the newest K are
// removed with their sidecars, manifests and parts (K = --keep-checkpoints;
// 0 keeps all). The
// file just written and best_model.pt are never removed.
//
// Warnings (a skipped checkpoint, an unverified load) go to the RunLog, so
// rank 0 prints them once and they reach train.log.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "model/m3ae.h"         // M3AE
#include "train/optimizer.h"    // VqaOptimizer
#include "train/train_log.h"    // RunLog: warnings
#include "train/train_state.h"  // TrainState

namespace vqa::train {

// Exit status of a job whose checkpoint could not be written (EX_IOERR).
constexpr int kExitCheckpointWriteFailed = 74;

// Writes <out>/checkpoints/epoch-NNNN.pt (after epoch NNNN) or
// epoch-NNNN-step-SSSSSS.pt (inside epoch NNNN after SSSSSS optimiser steps),
// its sidecar, and <out>/checkpoints/latest naming it; removes temporary files
// left by a killed writer; rotates old checkpoints, keeping the newest
// keep_checkpoints (0: all). config_ini (the resolved configuration) is saved
// inside. Returns the path. Rank 0 only. A failed write (full disk, quota, I/O error)
// removes its temporary files and ends the job on every rank with exit status
// kExitCheckpointWriteFailed and a message naming the file, the error and the
// last good checkpoint, which stays as it was. An old checkpoint that cannot
// be removed is a warning in `log` (stderr without one).
std::string checkpoint_save(const std::string& out_dir, model::M3AE& model, VqaOptimizer& optimizer,
                            const TrainState& state, const std::string& config_ini,
                            int keep_checkpoints, RunLog* log = nullptr);

// <out>/best_model.pt and its sidecar: the model (and state) of the best epoch
// so far. Failures end the job as in checkpoint_save.
void checkpoint_save_best(const std::string& out_dir, model::M3AE& model, const TrainState& state);

// ---- the parts of a save, for saves from a copy (checkpoint_writer.h) ----

// epoch-NNNN.pt after epoch NNNN, epoch-NNNN-step-SSSSSS.pt inside it.
std::string checkpoint_file_name(const TrainState& state);

// The archive of a checkpoint (with the optimiser's archive and the config)
// or of best_model.pt (without them), from the model's archive.
void checkpoint_archive_fill(torch::serialize::OutputArchive& archive,
                             torch::serialize::OutputArchive& model_archive,
                             torch::serialize::OutputArchive* optimizer_archive,
                             const TrainState& state, const std::string* config_ini);

// Called during a write with the bytes in the temporary file so far.
using CheckpointProgress = std::function<void(uint64_t bytes_written)>;

// Everything checkpoint_save does after building the archive: stale files,
// F.tmp, fsync, sidecar, rename, `latest`, rotation; failures end the job
// the same way. Any thread, one write at a time per run directory.
// With `parts` (a sharded checkpoint, checkpoint_shards.h, every part in
// place), NAME.manifest is written after NAME and before `latest`.
struct CheckpointPartEntry;
std::string checkpoint_write(const std::string& out_dir, const std::string& name,
                             torch::serialize::OutputArchive& archive, int keep_checkpoints,
                             RunLog* log, const CheckpointProgress& progress = {},
                             const std::vector<CheckpointPartEntry>* parts = nullptr);
void checkpoint_write_best(const std::string& out_dir, torch::serialize::OutputArchive& archive);

// The checkpoint --resume auto continues from, or "" when <out>/checkpoints
// holds none: the file `latest` names if its checksum matches (and, when
// sharded, its manifest and every part: checkpoint_shards.h), otherwise the
// newest older checkpoint that matches. Every file skipped is named in a
// warning with what is wrong with it, and the log's writer (rank 0) rewrites
// `latest` to name the file chosen. When checkpoints exist but none matches,
// ends the job on every rank with a message listing each file and its
// problem (starting afresh would silently discard the run).
std::string checkpoint_latest(const std::string& out_dir, RunLog& log);

// Loads model, optimiser and state from one read of the file, after checking
// it against its sidecar. Throws std::runtime_error naming the file and what
// is wrong (missing, truncated, corrupt, unreadable by LibTorch). A file
// without a sidecar (copied without it) is loaded with a warning. Every
// tensor is read onto the device of the model's parameters (map location),
// whatever device saved it, and keeps the model's dtype: the gradient buckets
// and the optimiser built on those tensors stay valid.
void checkpoint_load(const std::string& path, model::M3AE& model, VqaOptimizer& optimizer,
                     TrainState& state, RunLog& log);

// The model's weights alone from a checkpoint or best_model.pt (checked as
// checkpoint_load does, onto the model's device and dtype), for --init-from
// and --eval-only.
void checkpoint_load_model(const std::string& path, model::M3AE& model, RunLog& log);

// The result of checking a checkpoint file against its sidecar.
struct CheckpointCheck {
  bool good = false;
  // Empty when good; otherwise it completes "checkpoint PATH ...", e.g.
  // "is truncated: 1000 bytes, its checksum file says 2000".
  std::string problem;
};

// Reads the whole file and compares its size and CRC-32 with the sidecar's.
CheckpointCheck checkpoint_verify(const std::string& path);

// The sidecar of `path`: path + ".crc32".
std::string checkpoint_sidecar_path(const std::string& path);

}  // namespace vqa::train
