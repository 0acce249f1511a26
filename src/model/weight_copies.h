// Low-precision copies of the weights that autocast casts on every use.
//
// Under autocast a linear, a convolution or an attention projection casts
// its float32 weight and bias to the compute dtype at each call, and
// backward casts each gradient back: two operators (kernels on a GPU) per
// parameter tensor and step, which scale with the number of tensors and not
// with the arithmetic. With WeightCopies each such parameter has a copy in
// the compute dtype, made once per forward for all of them by one
// multi-tensor copy, and the modules compute with the copies: autocast finds
// them in its dtype already and casts nothing. Each copy is a leaf of its
// own, so its gradient (in the compute dtype, the same values the cast back
// would have widened) arrives per tensor during backward, where
// GradientSynchronizer (train/gradient_sync.h) copies it into the float32
// parameter's slot with its bucket's other copies' in one operator (the
// bucket's float32 gradients in another: one per source dtype). The float32
// parameters stay the model's parameters: the optimiser, checkpoints, the
// M3AE import and export see only them. This is the arithmetic of autocast
// for a weight used once per forward (every weight here), bit for bit.
#pragma once

#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace vqa::model {

// into[i] = from[i] for every i, converting the dtype where they differ:
// one multi-tensor operator where this LibTorch has one (on a GPU one
// kernel per chunk of tensors of one dtype pair), one per tensor with
// LibTorch 1.13, which has no multi-tensor copy.
void copy_tensors(const std::vector<torch::Tensor>& into, const std::vector<torch::Tensor>& from);
// into[i] += from[i] for every i, each sum add_'s. ATen's multi-tensor add
// runs one kernel per chunk only when all its tensors share one dtype (else
// one per tensor), so the `from` tensors of a narrower dtype than their
// `into` (bf16 gradients into float32 slots) are first widened, exactly,
// into one buffer by copy_tensors.
void add_tensors(const std::vector<torch::Tensor>& into, const std::vector<torch::Tensor>& from);

class WeightCopies {
 public:
  // The weights and biases of every torch::nn::Linear (applied through
  // apply_linear), torch::nn::Conv2d and MultiHeadAttention under `root`
  // (the parameters autocast casts at each use), with copies in `dtype`
  // (bfloat16 or float16) on each parameter's device. Make them after the model has its
  // device: a parameter moved later is refused at the next forward.
  WeightCopies(torch::nn::Module& root, at::ScalarType dtype);
  WeightCopies(const WeightCopies&) = delete;
  WeightCopies& operator=(const WeightCopies&) = delete;

  // At the start of each forward: when autocast is on for `device` in this
  // dtype, refreshes every copy from its parameter (one operator) and points
  // the modules at the copies; otherwise points them back at the float32
  // parameters (a float32 forward, or one in the other dtype, runs as
  // without copies).
  void select_for_forward(const torch::Device& device);

  // The copy standing in for the parameter of that full name (as
  // named_parameters() names it), or an undefined tensor when it has none.
  torch::Tensor copy_of(const std::string& name) const;
  at::ScalarType dtype() const { return dtype_; }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Bytes the copies hold.
  int64_t bytes() const;

 private:
  struct Entry {
    std::string name;
    torch::Tensor* member;  // the module's tensor its forward reads
    torch::Tensor parameter;
    torch::Tensor copy;
  };
  void point_at(bool copies);

  at::ScalarType dtype_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_of_;  // entries_' positions by name
  std::vector<torch::Tensor> parameters_, copies_;    // the entries', for the multi-tensor copy
  bool on_copies_ = false;
};

}  // namespace vqa::model
