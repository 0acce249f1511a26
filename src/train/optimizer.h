// The optimiser: AdamW (betas 0.9/0.98, eps 1e-8) with three learning-rate
// groups (encoders x1, fusion x5, head x50) and a linear warm-up then linear
// decay to 0, stepped every optimiser step, in one of two recipes:
//  - vqa-hpc: groups by the model's parts (model_parameter_groups), no weight
//    decay on biases and LayerNorm weights, LibTorch's AdamW formula, warm-up
//    of ceil(ratio x steps);
//  - m3ae: M3AE's own set_schedule, so that fine-tuning the pretrained M3AE
//    follows its recipe: groups by M3AE's parameter names (x5 for names with
//    "multi_modal", poolers included, x50 for the heads), no decay for names
//    containing "bias", "LayerNorm.", "norm." (so CLIP's ln_* weights, the
//    head's LayerNorm weight and the position tables are decayed),
//    transformers' AdamW (eps added to sqrt(v) before the bias correction,
//    which goes into the step size; decoupled decay applied after the Adam
//    step) and a warm-up of floor(ratio x steps).
//
// The parameter groups and the moments live in a torch::optim::AdamW, so
// checkpoints keep LibTorch's format. On the CPU the update itself is one
// fused pass per tensor (adamw_update_fused) instead of LibTorch's eight
// tensor operations and two temporaries per tensor: about 4x faster for the
// `small` preset on one core. On a GPU with LibTorch 2.4 or later the step is
// ATen's fused multi-tensor AdamW (at::_fused_adamw_, PyTorch's fused=True):
// one call per parameter group, the step counts on the device, and a device
// flag (found_inf) that turns the whole step into a no-op without the host
// reading it; the m3ae recipe goes through it too, its formula mapped exactly
// (aten_fused_coefficients). Elsewhere, or with fused_cpu = false,
// torch::optim::AdamW::step runs (transformers' formula in tensor operations
// for the m3ae recipe).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/m3ae.h"          // M3AE, model_parameter_groups
#include "train/adamw_update.h"  // adamw_update_fused, AdamWCoefficients
#include "train/shard_layout.h"  // ShardBucket
#include "train/train_config.h"  // OptimizerRecipe

namespace vqa::train {

struct OptimizerSettings {
  OptimizerRecipe recipe = OptimizerRecipe::kVqaHpc;
  double lr = 5e-5;
  double fusion_multiplier = 5.0;
  double head_multiplier = 50.0;
  double weight_decay = 0.01;
  double warmup_ratio = 0.1;
  int64_t total_steps = 1;  // optimiser steps over the whole run
  bool fused_cpu = true;    // false: LibTorch's AdamW::step on the CPU too
  // ATen's fused AdamW on the CPU as well as on GPUs (tests of that path on
  // machines without a GPU); needs LibTorch 2.4 or later.
  bool aten_fused_on_cpu = false;
};

// True when this LibTorch has ATen's fused AdamW (2.4 or later).
bool aten_fused_adamw_available();

// transformers' AdamW in the terms of PyTorch's (what at::_fused_adamw_
// computes): lr' = lr d and wd' = wd / d with d = 1 - lr wd turn "decay
// after the step" into "decay before it", and eps' = eps / sqrt(1 -
// beta2^t) moves eps inside the bias correction as transformers has it.
struct AtenAdamWCoefficients {
  double lr, weight_decay, eps;
};
AtenAdamWCoefficients aten_fused_coefficients(bool transformers, double lr, double weight_decay,
                                              double eps, double beta2, int64_t step);

class VqaOptimizer {
 public:
  VqaOptimizer(model::M3AE& model, const OptimizerSettings& settings);
  ~VqaOptimizer();

  // Sets every group's lr for optimiser step `step` (0-based), then steps
  // every parameter that has a gradient. With `found_inf` (a 0-dim tensor on
  // the parameters' device, true: skip), only where masks_on_device(): the
  // step is a no-op on the device when it is true, and the host does not
  // read it; call undo_step_count() once the host learns it was.
  void step(int64_t step, const torch::Tensor& found_inf = {});
  // True when step() takes the ATen fused path (GPU, or aten_fused_on_cpu).
  bool masks_on_device() const;
  // A step that found_inf skipped on the device: its count comes off every
  // parameter's state again (the next step's bias correction is right).
  void undo_step_count();
  // The encoders' learning rate at `step` (the others are multiples of it).
  double learning_rate(int64_t step) const;

  torch::optim::AdamW& adamw() { return *adamw_; }
  // Bytes of the AdamW moments this rank holds (0 before the first step).
  int64_t state_bytes() const;

  // ZeRO-1 (--shard-optimizer): from here on step() updates only each
  // bucket's owned range [begin, end) of the flat values, with AdamW moments
  // for that range alone (1/N of the state at N ranks), and calls
  // after_bucket(k) as soon as bucket k is updated, so that its allgather
  // runs while the next bucket is. The update is the fused CPU pass or, on
  // a GPU, ATen's fused AdamW: per element the unsharded step's formula and
  // coefficients. Moments a checkpoint loaded into adamw() are taken over at
  // the next step. Throws on a GPU without ATen's fused AdamW (LibTorch 2.4).
  void shard(std::vector<ShardBucket> layout, std::function<void(int64_t)> after_bucket);
  bool sharded() const { return shard_ != nullptr; }
  // Sharded: this rank's part of the state for a sharded checkpoint
  // (checkpoint_shards.h), without any collective. `moments` are live views
  // of the owned ranges, one pair per bucket written; each run says where a
  // parameter's elements sit in their concatenation. Buckets every rank
  // holds whole (not sharded) are in rank 0's part only (with_replicated).
  struct OwnedRun {
    torch::Tensor parameter;
    int64_t parameter_offset = 0;  // elements into the parameter
    int64_t length = 0;
    int64_t flat_offset = 0;  // elements into the concatenated moments
    // The parameter's place in adamw().param_groups(), as LibTorch's archive
    // orders the states (for tools that pair two runs' states up).
    int64_t group = 0, index_in_group = 0;
  };
  struct OwnedMoments {
    int64_t step = 0;
    std::vector<torch::Tensor> exp_avg, exp_avg_sq;  // per bucket written
    std::vector<OwnedRun> runs;
    int64_t elements = 0;  // of each moment
  };
  OwnedMoments owned_moments(bool with_replicated);
  // A run of a parameter's moments read from a checkpoint part, into
  // adamw()'s per-parameter state (zero moments first, for the elements no
  // part holds), where an unsharded load puts them and take_loaded_state()
  // takes them from.
  void load_moments(const torch::Tensor& parameter, int64_t step, int64_t parameter_offset,
                    const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq);

 private:
  struct ShardState;
  void sharded_step(const torch::Tensor& found_inf);
  void take_loaded_state();

  bool fused_step_possible() const;
  void fused_step();
  void aten_fused_step(const torch::Tensor& found_inf);
  // transformers' AdamW in tensor operations (any device), for the m3ae
  // recipe where the fused CPU step cannot run.
  void transformers_step();

  OptimizerSettings settings_;
  int64_t warmup_steps_ = 0;
  std::vector<double> multipliers_;  // per parameter group
  std::unique_ptr<torch::optim::AdamW> adamw_;
  bool on_device_path_ = false;  // masks_on_device(), fixed at construction
  // Per parameter (in group order) its step count on the device, float32,
  // and the moment tensor it was made for (a checkpoint load replaces the
  // moments, so the counts are made again from the states).
  std::vector<torch::Tensor> device_steps_;
  std::vector<const void*> device_steps_for_;
  std::unique_ptr<ShardState> shard_;  // --shard-optimizer
};

// Linear warm-up over `warmup` steps from 0, then linear decay to 0 at
// `total` (the schedule of M3AE and of transformers' get_linear_schedule_with_warmup).
double linear_schedule_factor(int64_t step, int64_t warmup, int64_t total);

}  // namespace vqa::train
