#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <utility>

#include "runtime/check.h"   // fatal_user_error, VQA_CHECK
#include "train/autocast.h"  // AutocastScope
#include "train/batches.h"   // next_batch_or_exit, batch_to_device, vqa_loss
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

// This rank's share of a stopped epoch's running totals, from the state a
// checkpoint restored: its own entry when the rank count is unchanged; with
// another rank count rank 0 carries the sums (the loss mean stays right, the
// per-rank split does not matter).
std::pair<double, int64_t> restored_partial_totals(const TrainState& state, int rank,
                                                   int world_size) {
  const auto ranks = static_cast<int>(state.partial_samples.size());
  if (ranks == 0) return {0.0, 0};
  if (ranks == world_size)
    return {state.partial_loss_sums.at(rank), state.partial_samples.at(rank)};
  if (rank != 0) return {0.0, 0};
  double loss = 0.0;
  int64_t samples = 0;
  for (int r = 0; r < ranks; ++r) {
    loss += state.partial_loss_sums.at(r);
    samples += state.partial_samples.at(r);
  }
  return {loss, samples};
}

// Every rank's running totals, gathered for the checkpoint, exactly (hex floats).
void gather_partial_totals(runtime::Communicator& comm, double loss_sum, int64_t samples,
                           TrainState& state) {
  char text[64];
  std::snprintf(text, sizeof(text), "%a %lld", loss_sum, static_cast<long long>(samples));
  state.partial_loss_sums.clear();
  state.partial_samples.clear();
  for (const auto& entry : comm.gather_strings(text)) {
    double loss = 0.0;
    long long count = 0;
    VQA_CHECK(std::sscanf(entry.c_str(), "%la %lld", &loss, &count) == 2,
              "bad running totals: " + entry);
    state.partial_loss_sums.push_back(loss);
    state.partial_samples.push_back(count);
  }
}

// Open MPI gives every rank a pseudo-terminal even when mpirun's own output
// goes to a file, so under it "auto" means plain lines.
bool progress_bar_wanted(Progress mode) {
  if (mode != Progress::kAuto) return mode == Progress::kOn;
  return isatty(STDOUT_FILENO) && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
         std::getenv("PMI_SIZE") == nullptr;
}

// After optimiser step `step` (0-based) of `steps`: a line every
// --log-every-steps, else the in-place bar when wanted.
void report_progress(RunLog& log, const TrainConfig& config, bool bar, int64_t epoch, int64_t step,
                     int64_t steps, double seconds) {
  char line[160];
  if (config.log_every_steps > 0 && (step + 1) % config.log_every_steps == 0) {
    std::snprintf(line, sizeof(line), "  epoch %lld step %lld/%lld  %.1f s", (long long)epoch,
                  (long long)step + 1, (long long)steps, seconds);
    log.info(line);
  } else if (bar) {
    const int width = 30;
    const int filled = static_cast<int>(width * (step + 1) / std::max<int64_t>(1, steps));
    std::snprintf(line, sizeof(line), "  epoch %lld [%s%s] %lld/%lld", (long long)epoch,
                  std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                  (long long)step + 1, (long long)steps);
    log.progress(line);
  }
}

// --grad-clip: over the parameters' gradients, or with sharded optimiser
// state over every rank's owned blocks.
void clip_gradients(TrainingParts& parts, double max_norm) {
  if (parts.gradients.sharded()) {
    parts.gradients.clip_gradient_norm(max_norm);
  } else {
    clip_gradient_norm(parts.model->parameters(), max_norm);
  }
}

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

// Forward and loss of one micro-step, under autocast on a GPU (without its
// cache of casts inside a capture: autocast.h).
torch::Tensor forward_loss(TrainingParts& parts, const data::Batch& batch, bool autocast_cache) {
  AutocastScope autocast(parts.device, parts.config.autocast_dtype(), autocast_cache);
  return vqa_loss(parts.model->forward(batch.images, batch.token_ids, batch.attention_mask),
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
  parts.gradients.prepare_backward(/*sync=*/micro == micro_steps - 1,
                                   /*row_ids=*/host_batch.token_ids);
  torch::Tensor loss = forward_loss(parts, batch, /*autocast_cache=*/true);
  faults.after_forward();
  loss = faults.loss(loss, global_step);
  parts.timer.end_phase(Phase::kForward);
  const auto micro_loss = loss / static_cast<double>(micro_steps);
  (parts.scaler ? parts.scaler->scale(micro_loss) : micro_loss).backward();
  parts.timer.end_phase(Phase::kBackward);
  return loss;
}

}  // namespace

std::string first_nonfinite_parameter(model::M3AE& model, bool check_values) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_parameters()) {
    const auto& tensor = check_values ? item.value() : item.value().grad();
    if (tensor.defined() && !torch::isfinite(tensor).all().item<bool>()) return item.key();
  }
  return "";
}

void clip_gradient_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) norms.push_back(parameter.grad().norm());
  }
  if (norms.empty()) return;
  const auto scale = (max_norm / (torch::stack(norms).norm() + 1e-6)).clamp_max(1.0);
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) parameter.grad().mul_(scale);
  }
}

int64_t optimizer_steps_per_epoch(const data::ShardedLoader& loader, const TrainConfig& config) {
  // Micro-steps that do not fill a whole optimiser step are left out, so every
  // optimiser step averages exactly --global-batch samples.
  int64_t steps = loader.steps_per_epoch() / config.accumulation_steps;
  if (config.max_steps_per_epoch > 0) steps = std::min(steps, config.max_steps_per_epoch);
  return steps;
}

namespace {

// Under this loss scale a non-finite gradient is not taken for an fp16
// overflow: the --nonfinite policy applies.
constexpr double kMinLossScale = 1.0;

std::string format_scale(double scale) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", scale);
  return text;
}

// fp16: the scaler's state into `state` (for checkpoints) and `stats`, after
// checking that every rank holds the same scale (they decide alike from the
// same averaged gradients; a difference is a defect, not bad input).
// Collective when a scaler exists.
void record_loss_scale(TrainingParts& parts, TrainState& state, EpochStats& stats) {
  if (!parts.scaler) return;
  const double scale = parts.scaler->current_scale();
  const double highest = parts.comm.max(scale), lowest = parts.comm.min(scale);
  VQA_CHECK(highest == lowest, "the fp16 loss scale differs across ranks: " + format_scale(lowest) +
                                   " to " + format_scale(highest));
  state.loss_scale = scale;
  state.loss_scale_growth = parts.scaler->growth_tracker();
  stats.loss_scale = scale;
}

}  // namespace

int64_t settle_deferred_skip(TrainingParts& parts, DeferredSkip& deferred, int64_t& samples) {
  if (!deferred.flag.pending() || !deferred.flag.take()) return 0;
  const TrainConfig& config = parts.config;
  parts.optimizer.undo_step_count();
  samples -= deferred.samples;  // its loss never went in (masked on the device)
  const std::string where = "epoch " + std::to_string(deferred.epoch) + " optimiser step " +
                            std::to_string(deferred.step);
  if (parts.scaler) {
    // The scale now is what that step's overflow left (read only now, rarely).
    const double scale = parts.scaler->current_scale() / parts.scaler->options().backoff_factor;
    if (scale < kMinLossScale && config.nonfinite == NonFinite::kStop) {
      runtime::fatal_user_error("non-finite gradient at " + where + " even at loss scale " +
                                    format_scale(scale) +
                                    ": not an fp16 overflow; stopping without a checkpoint of "
                                    "that step. Lower --lr, set --grad-clip, or --nonfinite skip",
                                kExitNonFinite);
    }
    parts.log.info("fp16 overflow at " + where + ": step skipped, loss scale " +
                   format_scale(scale) + " -> " + format_scale(parts.scaler->current_scale()));
    return 1;
  }
  if (config.nonfinite == NonFinite::kStop) {
    runtime::fatal_user_error("non-finite gradient at " + where +
                                  " (found on the device, a step later; the weights never took "
                                  "it); stopping without a checkpoint of that step. Lower --lr, "
                                  "set --grad-clip, or --nonfinite skip",
                              kExitNonFinite);
  }
  parts.log.warn("non-finite gradient at " + where + ": step skipped");
  return 1;
}

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
  data::Batch host_batch;
  // With a CUDA graph (one micro-step per step, step_graph_plan) the step's
  // forward, backward and averaging ran as the graph, finish_backward included.
  bool graph_ran = false;
  for (int64_t micro = 0; micro < config.accumulation_steps; ++micro) {
    faults.before_batch();
    if (!next_batch_or_exit(loader, host_batch)) {
      runtime::fatal_user_error("the train loader ran out of batches at epoch " +
                                std::to_string(epoch) + " global step " +
                                std::to_string(state.global_step));
    }
    parts.timer.end_phase(Phase::kDataWait);
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
    if (config.grad_clip > 0) clip_gradients(parts, config.grad_clip);
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
                     format_scale(scale) + " -> " + format_scale(scale * 0.5));
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
    if (config.grad_clip > 0) clip_gradients(parts, config.grad_clip);
    parts.optimizer.step(state.global_step);
  }
  parts.timer.end_phase(Phase::kOptimizer);
  parts.timer.end_step();
  if (applied && !graph_ran) timeline_add_collectives(parts, state.global_step);
  ++state.global_step;
  return applied ? 0 : 1;
}

EpochStats train_epoch(TrainingParts& parts, data::ShardedLoader& loader,
                       runtime::StopAgreement& stop, TrainState& state) {
  const TrainConfig& config = parts.config;
  const auto start = util::SteadyClock::now();
  const int64_t epoch = state.next_epoch;
  const int64_t steps = optimizer_steps_per_epoch(loader, config);
  const int64_t first_step = std::min(state.step_in_epoch, steps);
  parts.model->train();
  loader.start_epoch(epoch, /*skip_steps=*/first_step * config.accumulation_steps);
  const double data_wait_before = loader.wait_seconds();
  const double comm_wait_before = parts.gradients.stats().exposed_wait_seconds;
  const bool show_progress = progress_bar_wanted(config.progress);

  // Loss and sample count stay on the device until the epoch ends: no host
  // synchronisation per step.
  const auto [restored_loss, restored_samples] =
      restored_partial_totals(state, parts.comm.rank(), parts.comm.world_size());
  auto loss_sum = torch::full({}, restored_loss,
                              torch::TensorOptions().dtype(torch::kFloat64).device(parts.device));
  int64_t samples = restored_samples;
  EpochStats stats;
  DeferredSkip deferred;  // where the optimiser skips on the device
  int64_t step = first_step;
  for (; step < steps; ++step) {
    if (stop.poll()) {
      stats.stop_signal = stop.signal();
      break;
    }
    stats.learning_rate = parts.optimizer.learning_rate(state.global_step);
    if (parts.profile) parts.profile->before_step(state.global_step);
    stats.skipped_steps += train_step(parts, loader, epoch, state, loss_sum, samples,
                                      stats.compute_cpu_seconds, deferred);
    if (parts.profile) {
      try {  // a profile that cannot be written costs the profile, not the run
        for (const auto& line : parts.profile->after_step(state.global_step - 1)) {
          parts.log.info(line);
        }
      } catch (const std::exception& e) {
        parts.log.warn("cannot write the profile " + config.profile + " (" + e.what() +
                       "); training goes on without it");
      }
    }
    // Timings of steps the device has finished; never waits.
    for (auto& times : parts.timer.collect(/*wait=*/false)) {
      stats.step_times.push_back(std::move(times));
    }
    report_progress(parts.log, config, show_progress, epoch, step, steps,
                    util::seconds_since(start));
  }
  parts.gradients.wait_parameters();  // evaluation and checkpoints read them
  if (show_progress) parts.log.clear_progress();
  for (auto& times : parts.timer.collect(/*wait=*/true))
    stats.step_times.push_back(std::move(times));
  stats.skipped_steps += settle_deferred_skip(parts, deferred, samples);
  stats.optimizer_steps = steps;
  stats.data_wait_seconds = loader.wait_seconds() - data_wait_before;
  stats.comm_wait_seconds = parts.gradients.stats().exposed_wait_seconds - comm_wait_before;

  if (stats.stop_signal != 0) {
    // Stopped at a step boundary: keep the position and every rank's running
    // totals for the checkpoint; the epoch's line is written when it ends.
    state.step_in_epoch = step;
    gather_partial_totals(parts.comm, loss_sum.item<double>(), samples, state);
    record_loss_scale(parts, state, stats);
    stats.seconds = util::seconds_since(start);
    return stats;
  }

  // One small allreduce at the end of the epoch: loss sum, sample count and
  // the samples this process timed (float32, exact for counts below 2^24).
  const int64_t timed_samples = samples - restored_samples;
  auto totals =
      torch::stack({loss_sum, torch::tensor(static_cast<double>(samples), loss_sum.options()),
                    torch::tensor(static_cast<double>(timed_samples), loss_sum.options())})
          .to(torch::kFloat32);
  parts.comm.allreduce(totals, runtime::ReduceOp::kSum);
  const auto host_totals = totals.to(torch::kCPU).to(torch::kFloat64);
  stats.samples = std::llround(host_totals[1].item<double>());
  stats.timed_samples = std::llround(host_totals[2].item<double>());
  stats.mean_loss = stats.samples > 0 ? host_totals[0].item<double>() / stats.samples : 0.0;
  stats.seconds = util::seconds_since(start);
  state.next_epoch = epoch + 1;
  state.step_in_epoch = 0;
  state.partial_loss_sums.clear();
  state.partial_samples.clear();
  record_loss_scale(parts, state, stats);
  return stats;
}

}  // namespace vqa::train
