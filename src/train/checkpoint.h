// Checkpoints of the whole run: model, optimiser (AdamW moments and step
// counts), schedule position, epoch, best result and the resolved config.
// The sampler and the random state need no bytes of their own: both are
// derived from (seed, epoch), and checkpoints are taken at epoch boundaries.
//
// Files are written under a temporary name and renamed when complete, so a
// crash never leaves a half-written checkpoint under the real name. Only
// rank 0 writes; every rank reads (the run directory is on a shared file
// system on clusters).
#pragma once

#include <torch/torch.h>

#include <string>

#include "model/m3ae.h"       // M3AE
#include "train/optimizer.h"  // VqaOptimizer
#include "train/trainer.h"    // TrainState

namespace vqa::train {

// <out>/checkpoints/epoch-NNNN.pt, and <out>/checkpoints/latest naming it.
std::string checkpoint_save(const std::string& out_dir, model::M3AE& model, VqaOptimizer& optimizer,
                            const TrainState& state, const std::string& config_ini);

// <out>/best_model.pt: the model (and state) of the best epoch so far.
void checkpoint_save_best(const std::string& out_dir, model::M3AE& model, const TrainState& state);

// The checkpoint `latest` names, or "" when there is none.
std::string checkpoint_latest(const std::string& out_dir);

// Loads model, optimiser and state; throws std::runtime_error naming the file
// when it is missing or unreadable.
void checkpoint_load(const std::string& path, model::M3AE& model, VqaOptimizer& optimizer,
                     TrainState& state);

// Writes `text` to `path` atomically (temporary file, then rename).
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace vqa::train
