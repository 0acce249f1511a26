#include "train/trainer.h"

#include <ATen/autocast_mode.h>

#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <utility>

#include "runtime/check.h"        // fatal_user_error, VQA_CHECK
#include "runtime/distributed.h"  // distributed_gather_strings

namespace vqa::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// bfloat16 autocast for the forward pass on GPU, restored on scope exit.
class AutocastScope {
 public:
  explicit AutocastScope(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
  }
  ~AutocastScope() {
    if (!enabled_) return;
    at::autocast::set_enabled(false);
    at::autocast::clear_cache();
  }

 private:
  bool enabled_;
};

// Seeds dropout and any other randomness from (seed, optimiser step, rank),
// so a step run after a resume draws what it would have drawn without one.
void seed_step(uint64_t seed, int64_t global_step, int rank) {
  torch::manual_seed(seed * 1000003ull + static_cast<uint64_t>(global_step) * 7919ull +
                     static_cast<uint64_t>(rank));
}

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
void gather_partial_totals(double loss_sum, int64_t samples, TrainState& state) {
  char text[64];
  std::snprintf(text, sizeof(text), "%a %lld", loss_sum, static_cast<long long>(samples));
  state.partial_loss_sums.clear();
  state.partial_samples.clear();
  for (const auto& entry : runtime::distributed_gather_strings(text)) {
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
bool progress_bar_wanted(const std::string& mode) {
  if (mode != "auto") return mode == "on";
  return isatty(STDOUT_FILENO) && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
         std::getenv("PMI_SIZE") == nullptr;
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

namespace {
// The loader's next(). A read error met mid-epoch (a damaged chunk, a file
// gone from a shared file system) ends the job as a user error: the message
// names the file and row, and every rank exits with status 2.
bool next_batch(data::ShardedLoader& loader, data::Batch& batch) {
  try {
    return loader.next(batch);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(e.what());
  }
}
}  // namespace

int64_t optimizer_steps_per_epoch(const data::ShardedLoader& loader, const TrainConfig& config) {
  // Micro-steps that do not fill a whole optimiser step are left out, so every
  // optimiser step averages exactly --global-batch samples.
  int64_t steps = loader.steps_per_epoch() / config.accumulation_steps;
  if (config.max_steps_per_epoch > 0) steps = std::min(steps, config.max_steps_per_epoch);
  return steps;
}

data::Batch batch_to_device(const data::Batch& batch, const torch::Device& device) {
  if (device.is_cpu()) return batch;
  data::Batch moved = batch;
  moved.images = batch.images.to(device, /*non_blocking=*/true);
  moved.token_ids = batch.token_ids.to(device, /*non_blocking=*/true);
  moved.attention_mask = batch.attention_mask.to(device, /*non_blocking=*/true);
  moved.targets = batch.targets.to(device, /*non_blocking=*/true);
  moved.answer_type = batch.answer_type.to(device, /*non_blocking=*/true);
  moved.valid = batch.valid.to(device, /*non_blocking=*/true);
  return moved;
}

torch::Tensor vqa_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::binary_cross_entropy_with_logits(logits.to(torch::kFloat32), targets) *
         targets.size(1);
}

EpochStats train_epoch(model::M3AE& model, data::ShardedLoader& loader, VqaOptimizer& optimizer,
                       GradientSynchronizer& gradients, runtime::Communicator& comm,
                       runtime::StopAgreement& stop, StepTimer& timer, Timeline& timeline,
                       const TrainConfig& config, const torch::Device& device, TrainState& state) {
  const auto start = Clock::now();
  const int64_t epoch = state.next_epoch;
  const int64_t steps = optimizer_steps_per_epoch(loader, config);
  const int64_t first_step = std::min(state.step_in_epoch, steps);
  model->train();
  loader.start_epoch(epoch, /*skip_steps=*/first_step * config.accumulation_steps);
  const double data_wait_before = loader.wait_seconds();
  const double comm_wait_before = gradients.stats().exposed_wait_seconds;
  const bool show_progress = comm.rank() == 0 && progress_bar_wanted(config.progress);

  // Loss and sample count stay on the device until the epoch ends: no host
  // synchronisation per step.
  const auto [restored_loss, restored_samples] =
      restored_partial_totals(state, comm.rank(), comm.world_size());
  auto loss_sum =
      torch::full({}, restored_loss, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  int64_t samples = restored_samples;
  data::Batch host_batch;
  EpochStats stats;
  // Test-only fault injection (--test-slow-rank/--test-slow-ms, --test-data-delay-ms).
  using Milliseconds = std::chrono::duration<double, std::milli>;
  const Milliseconds slow_delay(comm.rank() == config.test_slow_rank ? config.test_slow_ms : 0.0);
  const Milliseconds data_delay(config.test_data_delay_ms);
  int64_t step = first_step;
  for (; step < steps; ++step) {
    if (stop.poll()) {
      stats.stop_signal = stop.signal();
      break;
    }
    comm.set_position(epoch, state.global_step);
    seed_step(config.seed, state.global_step, comm.rank());
    timer.begin_step(state.global_step);
    auto step_loss = torch::zeros_like(loss_sum);
    int64_t step_samples = 0;
    for (int64_t micro = 0; micro < config.accumulation_steps; ++micro) {
      if (data_delay.count() > 0) std::this_thread::sleep_for(data_delay);
      if (!next_batch(loader, host_batch)) {
        runtime::fatal_user_error("the train loader ran out of batches at epoch " +
                                  std::to_string(epoch) + " step " + std::to_string(step));
      }
      timer.end_phase(Phase::kDataWait);
      const data::Batch batch = batch_to_device(host_batch, device);
      timer.end_phase(Phase::kHostToDevice);
      gradients.prepare_backward(/*sync=*/micro == config.accumulation_steps - 1);
      torch::Tensor loss;
      {
        AutocastScope autocast(config.bf16_autocast && device.is_cuda());
        loss = vqa_loss(model->forward(batch.images, batch.token_ids, batch.attention_mask),
                        batch.targets);
      }
      if (slow_delay.count() > 0) std::this_thread::sleep_for(slow_delay);
      if (state.global_step == config.test_nan_step &&
          comm.rank() == std::min(1, comm.world_size() - 1)) {
        loss = loss * std::numeric_limits<double>::quiet_NaN();
      }
      timer.end_phase(Phase::kForward);
      (loss / static_cast<double>(config.accumulation_steps)).backward();
      timer.end_phase(Phase::kBackward);
      step_loss += loss.detach().to(torch::kFloat64) * static_cast<double>(host_batch.size());
      step_samples += host_batch.size();
    }
    gradients.finish_backward();
    timer.end_phase(Phase::kCommExposed);
    // The averaged gradients are the same on every rank, so every rank takes
    // the same decision. One host read per step (none with --nonfinite off).
    if (config.nonfinite != "off" && !gradients.gradients_finite()) {
      const std::string where =
          "epoch " + std::to_string(epoch) + " optimiser step " + std::to_string(state.global_step);
      const std::string first = first_nonfinite_parameter(model, /*check_values=*/false);
      if (config.nonfinite == "stop") {
        runtime::fatal_user_error(
            "non-finite gradient at " + where + " (first bad parameter: " + first +
                "); stopping without a checkpoint of this step. Lower --lr, set --grad-clip, "
                "or --nonfinite skip",
            kExitNonFinite);
      }
      if (comm.rank() == 0) {
        std::printf("warning: non-finite gradient at %s (first bad parameter: %s): step skipped\n",
                    where.c_str(), first.c_str());
        std::fflush(stdout);
      }
      ++stats.skipped_steps;  // the next prepare_backward drops these gradients
      timer.end_phase(Phase::kOptimizer);
      timer.end_step();
      ++state.global_step;
      continue;
    }
    loss_sum += step_loss;
    samples += step_samples;
    if (config.grad_clip > 0) clip_gradient_norm(model->parameters(), config.grad_clip);
    stats.learning_rate = optimizer.learning_rate(state.global_step);
    optimizer.step(state.global_step);
    timer.end_phase(Phase::kOptimizer);
    timer.end_step();
    if (timeline.active() && timeline.in_window(state.global_step)) {
      for (const auto& bucket : gradients.last_step_timings()) {
        // Without the backend's timing (NCCL), a mark at the launch.
        const double began = bucket.ended > 0 ? bucket.began : bucket.launched;
        const double ended = bucket.ended > 0 ? bucket.ended : bucket.launched;
        timeline.add_collective(state.global_step, bucket.bucket, bucket.bytes,
                                timer.from_steady(began), timer.from_steady(ended));
      }
    }
    ++state.global_step;
    // Timings of steps the device has finished; never waits.
    for (auto& times : timer.collect(/*wait=*/false)) stats.step_times.push_back(std::move(times));
    if (config.log_every_steps > 0 && (step + 1) % config.log_every_steps == 0 &&
        comm.rank() == 0) {
      std::printf("  epoch %lld step %lld/%lld  %.1f s\n", (long long)epoch, (long long)step + 1,
                  (long long)steps, seconds_since(start));
      std::fflush(stdout);
    } else if (show_progress) {
      const int width = 30;
      const int filled = static_cast<int>(width * (step + 1) / std::max<int64_t>(1, steps));
      std::printf("\r  epoch %lld [%s%s] %lld/%lld", (long long)epoch,
                  std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                  (long long)step + 1, (long long)steps);
      std::fflush(stdout);
    }
  }
  if (show_progress) std::printf("\r%80s\r", "");
  for (auto& times : timer.collect(/*wait=*/true)) stats.step_times.push_back(std::move(times));
  stats.optimizer_steps = steps;
  stats.data_wait_seconds = loader.wait_seconds() - data_wait_before;
  stats.comm_wait_seconds = gradients.stats().exposed_wait_seconds - comm_wait_before;

  if (stats.stop_signal != 0) {
    // Stopped at a step boundary: keep the position and every rank's running
    // totals for the checkpoint; the epoch's line is written when it ends.
    state.step_in_epoch = step;
    gather_partial_totals(loss_sum.item<double>(), samples, state);
    stats.seconds = seconds_since(start);
    return stats;
  }

  // One small allreduce at the end of the epoch: loss sum, sample count and
  // the samples this process timed (float32, exact for counts below 2^24).
  const int64_t timed_samples = samples - restored_samples;
  auto totals =
      torch::stack({loss_sum, torch::tensor(static_cast<double>(samples), loss_sum.options()),
                    torch::tensor(static_cast<double>(timed_samples), loss_sum.options())})
          .to(torch::kFloat32);
  comm.allreduce(totals, runtime::ReduceOp::kSum);
  const auto host_totals = totals.to(torch::kCPU).to(torch::kFloat64);
  stats.samples = std::llround(host_totals[1].item<double>());
  stats.timed_samples = std::llround(host_totals[2].item<double>());
  stats.mean_loss = stats.samples > 0 ? host_totals[0].item<double>() / stats.samples : 0.0;
  stats.seconds = seconds_since(start);
  state.next_epoch = epoch + 1;
  state.step_in_epoch = 0;
  state.partial_loss_sums.clear();
  state.partial_samples.clear();
  return stats;
}

EvalStats evaluate(model::M3AE& model, data::ShardedLoader& loader, runtime::Communicator& comm,
                   const torch::Device& device, int64_t epoch, bool bf16_autocast) {
  const auto start = Clock::now();
  torch::NoGradGuard no_grad;
  model->eval();
  loader.start_epoch(epoch);
  auto counts = torch::zeros({kAnswerCounts + 1}, torch::TensorOptions().device(device));
  data::Batch host_batch;
  while (next_batch(loader, host_batch)) {
    const data::Batch batch = batch_to_device(host_batch, device);
    torch::Tensor logits;
    {
      AutocastScope autocast(bf16_autocast && device.is_cuda());
      logits =
          model->forward(batch.images, batch.token_ids, batch.attention_mask).to(torch::kFloat32);
    }
    counts.narrow(0, 0, kAnswerCounts) +=
        count_answers(logits, batch.targets, batch.answer_type, batch.valid);
    // Per-sample loss, padding excluded.
    const auto per_sample =
        torch::binary_cross_entropy_with_logits(logits, batch.targets, {}, {}, at::Reduction::None)
            .sum(/*dim=*/1);
    counts[kAnswerCounts] += (per_sample * batch.valid).sum();
  }
  comm.allreduce(counts, runtime::ReduceOp::kSum);
  EvalStats stats;
  const auto host = counts.to(torch::kCPU);
  stats.accuracy = accuracy_from_counts(host.narrow(0, 0, kAnswerCounts));
  stats.mean_loss =
      stats.accuracy.total > 0 ? host[kAnswerCounts].item<float>() / stats.accuracy.total : 0.0;
  stats.seconds = seconds_since(start);
  model->train();
  return stats;
}

}  // namespace vqa::train
