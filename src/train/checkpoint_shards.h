// Sharded checkpoints (--shard-optimizer): each rank writes its own part of
// the AdamW moments, in parallel, and no rank gathers the whole state.
//
// Files, for a checkpoint NAME (e.g. epoch-0001.pt) of a run at N ranks:
//  - NAME.part-RRRR-of-NNNN, one per rank R, written by rank R: a LibTorch
//    archive of the moments of the ranges R owns (rank 0's also holds the
//    buckets every rank keeps whole), the step count, the writing rank and,
//    per run of a parameter, its name, its element offset and length; with
//    its sidecar, written F.tmp, fsync, sidecar, rename (checkpoint.h);
//  - NAME, rank 0's: weights, TrainState, config and an optimiser archive
//    without moments, plus "optimizer_parts" = N;
//  - NAME.manifest, rank 0's, last: JSON naming every part with its size
//    and CRC-32 (and NAME's), written atomically; then `latest` moves.
// Order of a save: every rank removes its own part of that name left by a
// killed run and the ranks meet (a barrier) before anyone writes; each rank
// writes its part; rank 0 waits until every part is renamed into place
// (checkpoint_parts_await), then writes NAME, the manifest and `latest`. A
// kill at any moment leaves no manifest, or a manifest naming complete parts.
//
// A checkpoint whose files include a part or a manifest is sharded; it is
// complete only when the manifest exists and every part it names matches
// both its sidecar and the manifest: checkpoint_latest skips it otherwise,
// naming the part, and falls back to the previous complete checkpoint.
// Rotation removes the manifest first, then NAME, then the parts.
//
// Loading reads every part into adamw()'s per-parameter states
// (VqaOptimizer::load_moments), where an unsharded checkpoint's moments go,
// so any rank count, sharded or not, resumes from it. While loading, each
// rank holds the whole state once, as an unsharded load does.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/m3ae.h"        // M3AE
#include "train/checkpoint.h"  // CheckpointCheck, CheckpointProgress
#include "train/optimizer.h"   // VqaOptimizer
#include "train/train_log.h"   // RunLog

namespace vqa::train {

// How long rank 0 waits for the other ranks' parts before it ends the job.
// A rank that dies or fails its write ends the job sooner (mpirun ends every
// rank when one exits; a failed write calls fatal_user_error, MPI_Abort), so
// this only bounds a rank alive but stuck, e.g. on a hung file system.
constexpr double kPartsWaitSeconds = 1800.0;

// NAME.part-RRRR-of-NNNN and NAME.manifest.
std::string checkpoint_part_name(const std::string& name, int rank, int parts);
std::string checkpoint_manifest_name(const std::string& name);

// A file of a sharded checkpoint as the manifest lists it.
struct CheckpointPartEntry {
  std::string file;
  uint64_t size = 0;
  uint32_t crc = 0;
};

// A rank's part as an archive: `exp_avg` and `exp_avg_sq` are host copies of
// owned.exp_avg / exp_avg_sq concatenated (owned.elements each).
void checkpoint_part_fill(torch::serialize::OutputArchive& archive, model::M3AE& model,
                          const VqaOptimizer::OwnedMoments& owned, const torch::Tensor& exp_avg,
                          const torch::Tensor& exp_avg_sq, int rank, int parts);

// Before a save, on every rank: removes this rank's part of `name` (and its
// sidecar) left by a killed run, so that rank 0 never takes it for this save's.
void checkpoint_part_remove_stale(const std::string& out_dir, const std::string& name, int rank,
                                  int parts);

// Writes <out>/checkpoints/PART durably (no `latest`, no rotation). A failure
// ends the job on every rank (kExitCheckpointWriteFailed). Any thread.
CheckpointPartEntry checkpoint_part_write(const std::string& out_dir, const std::string& part,
                                          torch::serialize::OutputArchive& archive,
                                          const CheckpointProgress& progress = {});

// Rank 0: waits until every part of `name` is in place with its sidecar and
// returns their entries (rank order); ends the job after kPartsWaitSeconds.
std::vector<CheckpointPartEntry> checkpoint_parts_await(const std::string& out_dir,
                                                        const std::string& name, int parts);

// Rank 0, after NAME itself: NAME.manifest listing `main` and `parts`.
void checkpoint_manifest_write(const std::filesystem::path& directory, const std::string& name,
                               const CheckpointPartEntry& main,
                               const std::vector<CheckpointPartEntry>& parts);

// True when `directory` holds a part or a manifest of `name`.
bool checkpoint_is_sharded(const std::filesystem::path& directory, const std::string& name);
// The manifest and every part it names, each against its sidecar and the
// manifest; `problem` names the file at fault.
CheckpointCheck checkpoint_shards_verify(const std::filesystem::path& directory,
                                         const std::string& name);
// Rotation: the manifest, then the parts and their sidecars. `error` is the
// first failure.
void checkpoint_shards_remove(const std::filesystem::path& directory, const std::string& name,
                              std::error_code& error);

// Loads the moments of the sharded checkpoint `path` (its manifest and
// `parts` parts) into `optimizer`; every tensor onto `device`. Throws
// std::runtime_error naming the file.
void checkpoint_parts_load(const std::string& path, int64_t parts, model::M3AE& model,
                           VqaOptimizer& optimizer, const torch::Device& device, RunLog& log);

}  // namespace vqa::train
