// Data-parallel gradient averaging that overlaps communication with backward.
//
// Parameters are grouped into buckets of about --bucket-mb in reverse
// registration order (the order backward produces their gradients). The
// buckets' flat buffers, consecutive parts of one buffer, hold the
// gradients, and param.grad() is a view of the parameter's slot (DDP's
// gradient_as_bucket_view): a post hook on each parameter's gradient
// accumulator points param.grad() at the slot and stages the first gradient
// of an optimiser step; once a bucket's gradients have all arrived they are
// copied in with one multi-tensor operator (one per tensor with LibTorch
// 1.13, which has none) and autograd's tensors freed, so autograd adds later
// micro-steps' gradients into the slots themselves and backward holds one
// copy of the gradients, not two. After backward nothing runs per parameter
// tensor: the finite check and clipping are one pass over the one buffer.
// One rank (or --no-comm) sends nothing: its gradients are their own
// average. The moment a bucket's last gradient of the last
// micro-step arrives its average-allreduce is launched, while backward goes on. Buckets are
// launched in bucket order on every rank, so all ranks issue the same collectives in the same
// sequence. finish_backward() waits only for what is still in flight and points every param.grad()
// at its slot: no copy back, no zeroing pass between steps.
//
// The buckets can be laid out again at another size between steps
// (rebucket, for the in-training tuning of --bucket-mb 0): they are
// consecutive parts of one buffer in a fixed parameter order, so only their
// boundaries move; the gradients, and param.grad() as views of them, stay.
//
// A parameter the forward uses through a lower-precision copy
// (NamedTensor::compute: model::WeightCopies) has a hook on the copy's
// accumulator too: its gradient arrives in the copy's dtype and is staged
// in every micro-step, then copied into the float32 slot (the first
// micro-step) or added to it (later ones: first copied, converted, into one
// float32 buffer, as ATen's multi-tensor add takes one dtype), a
// multi-tensor operator per bucket and dtype, converting as the cast back
// in backward would have.
//
// Row sync (GradientSyncOptions::row_sync_parameter, the word embedding):
// that table gets a bucket of its own, and instead of its whole gradient
// only the rows that some rank's batches touched in this optimiser step are
// averaged (the union of every rank's token ids, one small host-only gather
// before the step's first forward: gather_step_rows); every other row's
// gradient is exactly zero on every rank, so its average is the zero already
// there. The result equals the dense average (the same sums, element by
// element), with rows x width values sent instead of the table's.
//
// Sharded optimiser state (GradientSyncOptions::shard, ZeRO-1): every bucket
// but the row bucket is padded to a multiple of the rank count and split
// into that many equal blocks; rank r owns block r. The parameters become
// views of a flat float32 buffer per bucket with the gradients' layout
// (shard_layout()). A bucket is reduce-scattered instead of allreduced, so
// after finish_backward() only the owned block holds the average; the
// optimiser updates the owned block of the values, and gather_parameters()
// all-gathers them back into every rank's copy (the same bytes as an
// allreduce, in two halves). The row bucket stays replicated: its few rows
// are allreduced and every rank updates the whole table, since the table's
// every row changes each step (weight decay, Adam's moments) and gathering
// it would send it whole.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/communicator.h"  // Communicator, WorkHandle
#include "train/shard_layout.h"    // ShardBucket

namespace vqa::train {

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
  // The copy in a lower precision that the forward computes with in the
  // parameter's place (model::WeightCopies), whose gradient is the
  // parameter's; undefined: the forward uses the parameter itself.
  torch::Tensor compute = {};
};

// PyTorch DDP's default bucket_cap_mb.
constexpr double kDefaultBucketMiB = 25.0;

struct GradientSyncOptions {
  double bucket_mb = kDefaultBucketMiB;
  bool bf16 = false;            // send gradients as bfloat16
  bool skip_allreduce = false;  // benchmarks of exposed communication only: no communication
  // The parameter synchronised by rows (a table [rows, width] indexed by the
  // ids given to gather_step_rows); empty: none, every parameter is dense.
  std::string row_sync_parameter;
  // Rows expected per step before the first one is seen (bucket_bytes()).
  int64_t row_sync_expected_rows = 0;
  // ZeRO-1: reduce-scatter the buckets, parameters in flat buffers (above).
  bool shard = false;
};

struct GradientSyncStats {
  int64_t buckets = 0;
  // Bytes each rank allreduces per optimiser step: the dense buckets' plus,
  // with row sync, the rows expected (before the first step) or the last
  // step's rows.
  int64_t bytes_per_step = 0;
  int64_t sent_bytes = 0;             // allreduced over all synchronised steps, for per-epoch means
  int64_t synced_rows = 0;            // row sync: rows averaged over all synchronised steps
  double exposed_wait_seconds = 0.0;  // cumulative host time finish_backward waited
  int64_t synchronised_steps = 0;
  // Bucket layouts so far (rebucket adds one) and synchronised_steps when
  // the current one began: the per-bucket sums below count from there.
  int64_t layouts = 1;
  int64_t layout_first_step = 0;
  // Cumulative seconds the backend spent running gradient allreduces
  // (queueing excluded), over the steps it could tell (timed_steps).
  double allreduce_seconds = 0.0;
  int64_t timed_steps = 0;
  // Per bucket of the current layout (launch order): seconds from the bucket's launch (its last
  // gradient's arrival) to the end of backward (finish_backward), summed over
  // the synchronised steps; what the projection (projection.h) works from.
  std::vector<double> ready_before_end_sums;
  std::vector<int64_t> sent_bytes_sums;  // per bucket, as ready_before_end_sums
};

// One bucket's allreduce in the last synchronised step, in
// std::chrono::steady_clock seconds (time_since_epoch): launched when its
// last gradient arrived, ran from began to ended (0 when the backend cannot
// tell: NCCL).
struct BucketTiming {
  int64_t bucket = 0;
  int64_t bytes = 0;
  double launched = 0.0, began = 0.0, ended = 0.0;
};

class GradientSynchronizer {
 public:
  // `parameters` in registration order; all must require grad and live on
  // the communicator's device. Registers one hook per parameter.
  GradientSynchronizer(std::vector<NamedTensor> parameters, runtime::Communicator& comm,
                       const GradientSyncOptions& options);
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  // Call before each backward. sync = true on the last micro-step of an
  // optimiser step (its gradients are averaged); false on accumulation
  // micro-steps (no communication: gradients accumulate in the buckets).
  // The first micro-step of an optimiser step drops every param.grad(), so
  // that autograd hands its fresh gradient over without adding it to last
  // step's: the buckets are where gradients accumulate. With row sync,
  // gather_step_rows comes first in each optimiser step.
  void prepare_backward(bool sync);

  // Row sync: once per optimiser step, before its first prepare_backward and
  // forward, with every micro-batch's row ids (integer, on the host, any
  // shape: the token ids), the rows the step's forwards read. The ranks'
  // rows are gathered here (collective: gather_host_strings, host bytes
  // only), so on a GPU the host never waits for the device for them, and
  // from the step's first forward to its optimiser the synchronizer makes
  // no blocking host call (the buckets' collectives are launched and
  // waited for as device work). A no-op without row sync.
  void gather_step_rows(const std::vector<torch::Tensor>& row_ids);

  // After the backward of a sync micro-step: zeros the slots of parameters
  // that got no gradient in this optimiser step (their names are reported
  // once), launches the buckets still waiting, waits for every bucket, and
  // points each param.grad() at its slot, which holds the average over ranks
  // of the accumulated gradients. A no-op after a non-sync backward.
  void finish_backward();

  // A step replayed from a CUDA graph (step_graph.h), whose buckets were
  // filled, averaged and finished inside the replay: counts it in stats() as
  // the captured step counted itself (the same bytes; each bucket's launch
  // before the end of backward as in the last step finish_backward() saw).
  void count_replayed_step();

  // True when every gradient of the last finish_backward() is finite: one
  // sum (one per bucket, sharded), read once (the exact check only when a
  // sum is not finite).
  bool gradients_finite() const;
  // The same check left on the device (no host read): a 0-dim bool, true
  // when some bucket's sum is not finite (which finite values whose sum
  // passes float32's 3.4e38 also give).
  torch::Tensor nonfinite_flag() const;

  // Names of parameters that received no gradient on the first sync step,
  // handed over once: later calls return nothing.
  std::vector<std::string> take_unused_parameters() { return std::move(unused_names_); }
  const GradientSyncStats& stats() const { return stats_; }
  double bucket_mb() const { return options_.bucket_mb; }
  // Bucket sizes in bytes as sent (bfloat16 with options.bf16), in launch
  // order; the row bucket's as averaged over the steps so far (or expected).
  std::vector<int64_t> bucket_bytes() const;
  // The same for the buckets a --bucket-mb of `bucket_mb` would lay out.
  std::vector<int64_t> bucket_bytes_at(double bucket_mb) const;
  // Lays the buckets out again at `bucket_mb` (the in-training tuning of
  // --bucket-mb 0, allreduce_autotune.h). Between optimiser steps only,
  // every rank alike at the same step (the ranks must launch the same
  // buckets); not with sharded optimiser state, whose parameters and
  // optimiser shards are views of the buckets (refused). Every gradient
  // keeps its place in the one buffer; the per-bucket stats start afresh.
  void rebucket(double bucket_mb);
  // Float32 bytes of all the gradients (the parameters' size).
  int64_t gradient_bytes() const;
  // True when a parameter is synchronised by rows.
  bool row_sync() const { return row_bucket_ >= 0; }
  // The float32 gradients, as param.grad() views them: the one buffer that
  // holds every bucket (sharded: this rank's blocks, the only averaged part).
  std::vector<torch::Tensor> bucket_gradients() const;
  // Bytes the buckets hold: the float32 gradients and the bfloat16 copies sent.
  int64_t memory_bytes() const;
  // The buckets of the last synchronised step, in launch order.
  std::vector<BucketTiming> last_step_timings() const;

  // ---- sharded optimiser state (options.shard) -------------------------------
  bool sharded() const { return options_.shard; }
  // The flat buffers and the owned ranges, for the optimiser.
  std::vector<ShardBucket> shard_layout() const;
  // Launches the allgather of bucket `bucket`'s values once the optimiser
  // has updated this rank's block (no-op for a replicated bucket).
  void gather_parameters(int64_t bucket);
  // Waits for the allgathers launched since the last call: call before the
  // parameters are read (the next forward, evaluation, a checkpoint).
  void wait_parameters();
  // `flag` (0-dim bool on the device, true: some owned gradient is not
  // finite) or-ed over the ranks; unchanged when not sharded.
  torch::Tensor any_rank(const torch::Tensor& flag) const;
  // Scales the gradients (sharded: the owned ones) so that their global L2
  // norm (over every rank's blocks) is at most max_norm; the norm is
  // accumulated in float64 and the scale stays on the device.
  void clip_gradient_norm(double max_norm);

 private:
  struct Slot {
    int64_t bucket;
    int64_t offset;    // elements into the bucket's flat buffer
    int64_t position;  // index within the bucket's parameter list
  };
  struct Bucket {
    std::vector<int64_t> parameters;  // indices into parameters_
    torch::Tensor flat;               // float32, same device as the parameters
    torch::Tensor wire;               // bfloat16 copy sent when options_.bf16
    int64_t pending = 0;
    int64_t row_width = 0;  // > 0: the row bucket (one table of rows x row_width)
    std::vector<bool> arrived;
    runtime::WorkHandle work;
    double launched = 0.0;  // steady_clock seconds
    // Sharded optimiser state: the parameters' flat values, this rank's block.
    torch::Tensor values;
    bool sharded = false;
    int64_t begin = 0, end = 0;
    runtime::WorkHandle gather;
    // Gradients staged by on_gradient for one copy into their slots (the
    // parameters' and, apart, the compute copies' of another dtype), and
    // compute copies' gradients of later micro-steps for one addition.
    std::vector<torch::Tensor> staged_into, staged_from, copied_into, copied_from;
    std::vector<torch::Tensor> added_into, added_from;
    int64_t micro_arrivals = 0;  // gradients arrived in this micro-step
    // Bytes one averaging of this bucket sends (its bfloat16 copy or the
    // float32 buffer; the row bucket's last rows).
    int64_t sent_bytes() const {
      return static_cast<int64_t>((wire.defined() ? wire : flat).nbytes());
    }
    // The block this rank averages and updates (the whole bucket unless sharded).
    torch::Tensor owned(const torch::Tensor& flat) const {
      return flat.narrow(0, begin, end - begin);
    }
  };

  class ArrivalHook;
  bool is_row_parameter(int64_t index) const;
  // The parameters' indices per bucket at `bucket_mb`, in launch order.
  std::vector<std::vector<int64_t>> group_parameters(double bucket_mb) const;
  // buckets_, slots_ and row_bucket_ at options_.bucket_mb; returns each
  // bucket's elements (sharded: padded).
  std::vector<int64_t> lay_out_buckets();
  // The buckets' flat buffers as consecutive parts of all_gradients_, the
  // parameters' slot views and the per-bucket stats.
  void view_buckets(const std::vector<int64_t>& bucket_elements);
  int64_t row_bucket_bytes() const;
  // from_copy: the gradient is in the compute copy's grad(), else in the parameter's.
  void on_gradient(int64_t index, bool from_copy);
  void launch_ready_buckets();
  void count_sent(int64_t index);  // the bucket's bytes into stats_
  void note_rows(const torch::Tensor& row_ids);
  void make_flat_parameters();
  void gather_rows();  // local_rows_ of every rank into row_index_
  void copy_staged(Bucket& bucket);
  void copy_staged_gradients();  // every bucket's
  torch::Tensor owned_gradient_sums() const;

  std::vector<NamedTensor> parameters_;
  std::vector<Slot> slots_;
  std::vector<torch::Tensor> slot_views_;  // per parameter: its slot, shaped like it
  // per parameter: autograd's gradient accumulator, which runs ArrivalHook
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<bool> touched_;  // per parameter: slot written this optimiser step
  std::vector<Bucket> buckets_;
  runtime::Communicator& comm_;
  GradientSyncOptions options_;
  bool communicates_;            // more than one rank and not skip_allreduce
  torch::Tensor all_gradients_;  // float32: every bucket's flat buffer, in bucket order
  bool step_open_ = false;       // micro-steps of an optimiser step have begun
  bool last_micro_ = false;
  int64_t next_to_launch_ = 0;
  bool reported_unused_ = false;
  std::vector<std::string> unused_names_;
  GradientSyncStats stats_;
  std::vector<double> last_ready_before_end_;  // per bucket, of the last finish_backward()
  int64_t row_bucket_ = -1;                    // index into buckets_, or -1
  std::vector<int32_t> local_rows_;            // this optimiser step's row ids on this rank
  torch::Tensor row_index_;     // the union over ranks, int64 on the parameters' device
  bool rows_gathered_ = false;  // gather_step_rows ran for the step now open or next
};

// Copies rank 0's parameters and buffers to every rank (call once at start,
// and after loading a checkpoint on rank 0 only).
void broadcast_module_state(torch::nn::Module& module, runtime::Communicator& comm);

}  // namespace vqa::train
