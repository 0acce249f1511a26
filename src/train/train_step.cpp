// One optimiser step (train_step): its micro-steps' batches, forward and
// backward, eager or as the step's CUDA graph, with the --test-* faults;
// then the non-finite decision, clipping and the optimiser.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/check.h"   // fatal_user_error
#include "train/autocast.h"  // AutocastScope
#include "train/batches.h"   // next_batch_or_exit, batch_to_device, vqa_loss
#include "train/trainer.h"   // train_step, TrainingParts, DeferredSkip
#include "util/clock.h"      // SteadyClock, seconds_since, thread_cpu_seconds

namespace vqa::train {

namespace {

// Seeds dropout and any other randomness from (seed, optimiser step, rank),
// so a step run after a resume draws what it would have drawn without one.
void seed_step(uint64_t seed, int64_t global_step, int rank) {
  torch::manual_seed(seed * 1000003ull + static_cast<uint64_t>(global_step) * 7919ull +
                     static_cast<uint64_t>(rank));
}

// The --test-* faults (FaultInjection), each applied at its point of a step.
class FaultInjector {
 public:
  FaultInjector(const FaultInjection& faults, const runtime::Communicator& comm)
      : faults_(faults),
        slow_(comm.rank() == faults.slow_rank),
        nan_rank_(comm.rank() == std::min(1, comm.world_size() - 1)) {}

  void before_batch() const { sleep_ms(faults_.data_delay_ms); }
  void after_forward() const {
    if (slow_) sleep_ms(faults_.slow_ms);
  }
  torch::Tensor loss(torch::Tensor loss, int64_t global_step) const {
    if (nan_rank_ && global_step == faults_.nan_step) {
      return loss * std::numeric_limits<double>::quiet_NaN();
    }
    return loss;
  }

 private:
  static void sleep_ms(double ms) {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  }
  const FaultInjection& faults_;
  bool slow_;
  bool nan_rank_;
};

// The buckets' allreduces of the step just taken, for the timeline.
void timeline_add_collectives(TrainingParts& parts, int64_t global_step) {
  if (!parts.timeline.active() || !parts.timeline.in_window(global_step)) return;
  for (const auto& bucket : parts.gradients.last_step_timings()) {
    // Without the backend's timing (NCCL), a mark at the launch.
    const double began = bucket.ended > 0 ? bucket.began : bucket.launched;
    const double ended = bucket.ended > 0 ? bucket.ended : bucket.launched;
    parts.timeline.add_collective(global_step, bucket.bucket, bucket.bytes,
                                  parts.timer.from_steady(began), parts.timer.from_steady(ended));
  }
}

// Whether the host batch's questions have padding, read from its mask in
// host memory (no operator, no wait for a device), so that a batch without
// padding attends without a mask on a GPU too; nullopt where the mask is not
// a contiguous int64 host tensor (the model then decides: m3ae.h).
std::optional<bool> text_padded(const data::Batch& host_batch) {
  const torch::Tensor& mask = host_batch.attention_mask;
  if (!mask.defined() || !mask.device().is_cpu() || mask.scalar_type() != torch::kInt64 ||
      !mask.is_contiguous()) {
    return std::nullopt;
  }
  const int64_t* values = mask.data_ptr<int64_t>();
  return std::find(values, values + mask.numel(), 0) != values + mask.numel();
}

// Forward and loss of one micro-step, under autocast where it runs (without
// its cache of casts inside a capture: autocast.h). padded: text_padded.
torch::Tensor forward_loss(TrainingParts& parts, const data::Batch& batch, bool autocast_cache,
                           std::optional<bool> padded = std::nullopt) {
  AutocastScope autocast(parts.device, parts.config.autocast_dtype(), autocast_cache);
  return vqa_loss(parts.model->forward(batch.images, batch.token_ids, batch.attention_mask, padded),
                  batch.targets);
}

// After a replay of the step's graph: the watchdog watches it as one
// collective (unless the graph holds none: --no-comm).
void watch_graph(TrainingParts& parts) {
  if (!parts.config.no_comm) {
    parts.comm.watch_replayed_graph(parts.gradients.stats().bytes_per_step);
  }
}

// The step captured into parts.graph (step_graph.h), and run by the graph's
// first replay: forward, loss, backward and the buckets' averaging
// (finish_backward) on `batch`, which becomes the graph's static input.
torch::Tensor capture_step(TrainingParts& parts, const data::Batch& batch, int64_t epoch,
                           int64_t global_step) {
  parts.gradients.prepare_backward(/*sync=*/true);
  const auto began = util::SteadyClock::now();
  torch::Tensor loss;
  try {
    loss = parts.graph->capture(batch, [&](const data::Batch& input) {
      const torch::Tensor captured = forward_loss(parts, input, /*autocast_cache=*/false);
      (parts.scaler ? parts.scaler->scale(captured) : captured).backward();
      parts.gradients.finish_backward();
      return captured.detach();
    });
  } catch (const std::exception& e) {
    // LibTorch may be left in capture mode: no eager fallback in this process.
    runtime::fatal_user_error("--cuda-graph: capturing the step at epoch " + std::to_string(epoch) +
                              " step " + std::to_string(global_step) + " failed: " + e.what() +
                              "; run without --cuda-graph (the eager step computes the same)");
  }
  watch_graph(parts);
  parts.timer.end_phase(Phase::kBackward);  // forward, backward and averaging as one
  char line[200];
  std::snprintf(line, sizeof(line),
                "CUDA graph: captured at epoch %lld step %lld in %.2f s (%lld samples per rank, "
                "images %lld x %lld px, questions of %lld tokens); later steps replay it",
                static_cast<long long>(epoch), static_cast<long long>(global_step),
                util::seconds_since(began), static_cast<long long>(batch.images.size(0)),
                static_cast<long long>(batch.images.size(-1)),
                static_cast<long long>(batch.images.size(-2)),
                static_cast<long long>(batch.token_ids.size(1)));
  parts.log.info(line);
  return loss;
}

// A step replayed from parts.graph, its batch already in the static input.
torch::Tensor replay_step(TrainingParts& parts) {
  const torch::Tensor loss = parts.graph->replay();
  parts.gradients.count_replayed_step();
  watch_graph(parts);
  parts.timer.end_phase(Phase::kBackward);  // forward, backward and averaging as one
  return loss;
}

// One eager micro-step (`micro` of the step's accumulation): forward, loss
// (with the --test-* faults), backward; the buckets average as backward runs
// on the last micro-step.
torch::Tensor eager_micro_step(TrainingParts& parts, const FaultInjector& faults,
                               const data::Batch& host_batch, const data::Batch& batch,
                               int64_t micro, int64_t global_step) {
  if (parts.graph) {
    const std::string note = parts.graph->note_eager_step(host_batch, global_step);
    if (!note.empty()) parts.log.info(note);
  }
  const int64_t micro_steps = parts.config.accumulation_steps;
  parts.gradients.prepare_backward(/*sync=*/micro == micro_steps - 1);
  torch::Tensor loss = forward_loss(parts, batch, /*autocast_cache=*/true, text_padded(host_batch));
  faults.after_forward();
  loss = faults.loss(loss, global_step);
  parts.timer.end_phase(Phase::kForward);
  const auto micro_loss = loss / static_cast<double>(micro_steps);
  (parts.scaler ? parts.scaler->scale(micro_loss) : micro_loss).backward();
  parts.timer.end_phase(Phase::kBackward);
  return loss;
}

}  // namespace

int64_t train_step(TrainingParts& parts, data::ShardedLoader& loader, int64_t epoch,
                   TrainState& state, torch::Tensor& loss_sum, int64_t& samples,
                   double& compute_cpu_seconds, DeferredSkip& deferred) {
  const TrainConfig& config = parts.config;
  const FaultInjector faults(config.faults, parts.comm);
  parts.comm.set_position(epoch, state.global_step);
  seed_step(config.seed, state.global_step, parts.comm.rank());
  parts.timer.begin_step(state.global_step);
  auto step_loss = torch::zeros_like(loss_sum);
  int64_t step_samples = 0;
  const auto take_batch = [&](data::Batch& host_batch) {
    faults.before_batch();
    if (!next_batch_or_exit(loader, host_batch)) {
      runtime::fatal_user_error("the train loader ran out of batches at epoch " +
                                std::to_string(epoch) + " global step " +
                                std::to_string(state.global_step));
    }
    parts.timer.end_phase(Phase::kDataWait);
  };
  // Row sync: every micro-batch is taken before the first forward and the
  // ranks' rows are gathered (host bytes over MPI, no wait for the device),
  // so that nothing between the step's first forward and its optimiser
  // waits on the host for the other ranks.
  const bool rows_first = parts.gradients.row_sync();
  std::vector<data::Batch> host_batches(rows_first ? config.accumulation_steps : 1);
  if (rows_first) {
    std::vector<torch::Tensor> row_ids;
    for (auto& host_batch : host_batches) {
      take_batch(host_batch);
      row_ids.push_back(host_batch.token_ids);
    }
    parts.gradients.gather_step_rows(row_ids);
    parts.timer.end_phase(Phase::kCommExposed);
  }
  // With a CUDA graph (one micro-step per step, step_graph_plan) the step's
  // forward, backward and averaging ran as the graph, finish_backward included.
  bool graph_ran = false;
  for (int64_t micro = 0; micro < config.accumulation_steps; ++micro) {
    data::Batch& host_batch = host_batches[rows_first ? micro : 0];
    if (!rows_first) take_batch(host_batch);
    const bool replay = parts.graph && parts.graph->replayable(host_batch);
    const data::Batch batch =
        parts.copy ? parts.copy->to_device(host_batch) : batch_to_device(host_batch, parts.device);
    if (replay) parts.graph->load(batch);  // into the graph's static input
    parts.timer.end_phase(Phase::kHostToDevice);
    if (micro == 0 && parts.gradients.sharded()) {
      // The previous step's parameter allgathers ran behind its optimiser
      // step and this step's batch; what is left of them is exposed.
      parts.gradients.wait_parameters();
      parts.timer.end_phase(Phase::kCommExposed);
    }
    const double cpu_before = util::thread_cpu_seconds();
    const bool capture =
        !replay && parts.graph && parts.graph->capture_due(host_batch, config.batch_per_rank);
    graph_ran = replay || capture;
    const torch::Tensor loss =
        replay    ? replay_step(parts)
        : capture ? capture_step(parts, batch, epoch, state.global_step)
                  : eager_micro_step(parts, faults, host_batch, batch, micro, state.global_step);
    compute_cpu_seconds += util::thread_cpu_seconds() - cpu_before;
    step_loss += loss.detach().to(torch::kFloat64) * static_cast<double>(host_batch.size());
    step_samples += host_batch.size();
  }
  if (!graph_ran) parts.gradients.finish_backward();  // a graph's ran inside it
  parts.timer.end_phase(Phase::kCommExposed);

  // The averaged gradients are the same on every rank, so every rank takes
  // the same decision.
  if (parts.optimizer.masks_on_device()) {
    // No host read: the optimiser skips on the device; the host learns of it
    // a step later (the flag of the previous step is read first, before this
    // step's scaler update, so that its message sees that step's scale).
    const int64_t learnt = settle_deferred_skip(parts, deferred, samples);
    torch::Tensor found_inf;
    if (parts.scaler) {
      found_inf = parts.gradients.any_rank(
          parts.scaler->unscale_and_check(parts.gradients.bucket_gradients()));
      parts.scaler->update(found_inf);
    } else if (config.nonfinite != NonFinite::kOff) {
      found_inf = parts.gradients.nonfinite_flag();
    }
    // A skipped step's loss (NaN, perhaps) stays out of the total on the
    // device; its samples come off on the host once it knows.
    loss_sum += found_inf.defined()
                    ? torch::where(found_inf, torch::zeros_like(step_loss), step_loss)
                    : step_loss;
    samples += step_samples;
    if (config.grad_clip > 0) parts.gradients.clip_gradient_norm(config.grad_clip);
    parts.optimizer.step(state.global_step, found_inf);
    if (found_inf.defined()) {
      deferred.flag.capture(found_inf);
      deferred.epoch = epoch;
      deferred.step = state.global_step;
      deferred.samples = step_samples;
    }
    parts.timer.end_phase(Phase::kOptimizer);
    parts.timer.end_step();
    if (!graph_ran) timeline_add_collectives(parts, state.global_step);
    ++state.global_step;
    return learnt;
  }

  // Decided by the host: one read per step (none with --nonfinite off).
  bool applied = true;
  if (parts.scaler) {
    // fp16: unscaled before clipping; an overflow skips the step and halves
    // the scale, on every rank alike (docs/training.md).
    const auto found_inf = parts.gradients.any_rank(
        parts.scaler->unscale_and_check(parts.gradients.bucket_gradients()));
    const bool overflow = found_inf.item<bool>();
    const double scale = overflow ? parts.scaler->current_scale() : 0.0;
    parts.scaler->update(found_inf);
    if (overflow) {
      const std::string where =
          "epoch " + std::to_string(epoch) + " optimiser step " + std::to_string(state.global_step);
      if (scale < kMinLossScale && config.nonfinite == NonFinite::kStop) {
        runtime::fatal_user_error(
            "non-finite gradient at " + where + " even at loss scale " + std::to_string(scale) +
                " (first bad parameter: " +
                first_nonfinite_parameter(parts.model, /*check_values=*/false) +
                "): not an fp16 overflow; stopping without a checkpoint of this step. Lower "
                "--lr, set --grad-clip, or --nonfinite skip",
            kExitNonFinite);
      }
      parts.log.info("fp16 overflow at " + where + ": step skipped, loss scale " +
                     format_loss_scale(scale) + " -> " + format_loss_scale(scale * 0.5));
      applied = false;
    }
  } else if (config.nonfinite != NonFinite::kOff && !parts.gradients.gradients_finite()) {
    const std::string where =
        "epoch " + std::to_string(epoch) + " optimiser step " + std::to_string(state.global_step);
    const std::string first = first_nonfinite_parameter(parts.model, /*check_values=*/false);
    if (config.nonfinite == NonFinite::kStop) {
      runtime::fatal_user_error(
          "non-finite gradient at " + where + " (first bad parameter: " + first +
              "); stopping without a checkpoint of this step. Lower --lr, set --grad-clip, "
              "or --nonfinite skip",
          kExitNonFinite);
    }
    parts.log.warn("non-finite gradient at " + where + " (first bad parameter: " + first +
                   "): step skipped");
    applied = false;  // the next prepare_backward drops these gradients
  }
  if (applied) {
    loss_sum += step_loss;
    samples += step_samples;
    if (config.grad_clip > 0) parts.gradients.clip_gradient_norm(config.grad_clip);
    parts.optimizer.step(state.global_step);
  }
  parts.timer.end_phase(Phase::kOptimizer);
  parts.timer.end_step();
  if (applied && !graph_ran) timeline_add_collectives(parts, state.global_step);
  ++state.global_step;
  return applied ? 0 : 1;
}

}  // namespace vqa::train
