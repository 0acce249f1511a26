// One epoch (train_epoch): its optimiser steps with the stop polls, the
// progress lines, the running totals a stopped epoch keeps for its
// checkpoint, and the epoch's one allreduce of loss and sample counts.
#include "train/trainer.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "runtime/check.h"  // VQA_CHECK
#include "util/clock.h"     // SteadyClock, seconds_since

namespace vqa::train {

namespace {

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

// fp16: the scaler's state into `state` (for checkpoints) and `stats`, after
// checking that every rank holds the same scale (they decide alike from the
// same averaged gradients; a difference is a defect, not bad input).
// Collective when a scaler exists.
void record_loss_scale(TrainingParts& parts, TrainState& state, EpochStats& stats) {
  if (!parts.scaler) return;
  const double scale = parts.scaler->current_scale();
  const double highest = parts.comm.max(scale), lowest = parts.comm.min(scale);
  VQA_CHECK(highest == lowest, "the fp16 loss scale differs across ranks: " +
                                   format_loss_scale(lowest) + " to " + format_loss_scale(highest));
  state.loss_scale = scale;
  state.loss_scale_growth = parts.scaler->growth_tracker();
  stats.loss_scale = scale;
}

}  // namespace

int64_t optimizer_steps_per_epoch(const data::ShardedLoader& loader, const TrainConfig& config) {
  // Micro-steps that do not fill a whole optimiser step are left out, so every
  // optimiser step averages exactly --global-batch samples.
  int64_t steps = loader.steps_per_epoch() / config.accumulation_steps;
  if (config.max_steps_per_epoch > 0) steps = std::min(steps, config.max_steps_per_epoch);
  return steps;
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
    if (parts.autotune) parts.autotune->before_step(state.global_step);
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
    // Timings of steps the device has finished; never waits, except once
    // when the allreduce trials end (the decision needs all of theirs).
    const bool decide = parts.autotune && parts.autotune->decision_due(state.global_step);
    for (auto& times : parts.timer.collect(/*wait=*/decide)) {
      if (parts.autotune) parts.autotune->record(times);
      stats.step_times.push_back(std::move(times));
    }
    if (decide) parts.autotune->decide();
    report_progress(parts.log, config, show_progress, epoch, step, steps,
                    util::seconds_since(start));
  }
  parts.gradients.wait_parameters();  // evaluation and checkpoints read them
  if (show_progress) parts.log.clear_progress();
  for (auto& times : parts.timer.collect(/*wait=*/true)) {
    if (parts.autotune) parts.autotune->record(times);
    stats.step_times.push_back(std::move(times));
  }
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
