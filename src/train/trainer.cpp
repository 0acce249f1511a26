#include "train/trainer.h"

#include <ATen/autocast_mode.h>

#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "runtime/check.h"  // fatal_user_error

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

// Seeds dropout and any other randomness from (seed, epoch, rank), so an
// epoch run after a resume draws what it would have drawn without one.
void seed_epoch(uint64_t seed, int64_t epoch, int rank) {
  torch::manual_seed(seed * 1000003ull + static_cast<uint64_t>(epoch) * 7919ull +
                     static_cast<uint64_t>(rank));
}

// Open MPI gives every rank a pseudo-terminal even when mpirun's own output
// goes to a file, so under it "auto" means plain lines.
bool progress_bar_wanted(const std::string& mode) {
  if (mode != "auto") return mode == "on";
  return isatty(STDOUT_FILENO) && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
         std::getenv("PMI_SIZE") == nullptr;
}

}  // namespace

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
                       const TrainConfig& config, const torch::Device& device, TrainState& state) {
  const auto start = Clock::now();
  const int64_t epoch = state.next_epoch;
  const int64_t steps = optimizer_steps_per_epoch(loader, config);
  seed_epoch(config.seed, epoch, comm.rank());
  model->train();
  loader.start_epoch(epoch);
  const double data_wait_before = loader.wait_seconds();
  const double comm_wait_before = gradients.stats().exposed_wait_seconds;
  const bool show_progress = comm.rank() == 0 && progress_bar_wanted(config.progress);

  // Loss and sample count stay on the device until the epoch ends: no host
  // synchronisation per step.
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  int64_t samples = 0;
  data::Batch host_batch;
  EpochStats stats;
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t micro = 0; micro < config.accumulation_steps; ++micro) {
      if (!loader.next(host_batch)) {
        runtime::fatal_user_error("the train loader ran out of batches at epoch " +
                                  std::to_string(epoch) + " step " + std::to_string(step));
      }
      const data::Batch batch = batch_to_device(host_batch, device);
      gradients.prepare_backward(/*sync=*/micro == config.accumulation_steps - 1);
      torch::Tensor loss;
      {
        AutocastScope autocast(config.bf16_autocast && device.is_cuda());
        loss = vqa_loss(model->forward(batch.images, batch.token_ids, batch.attention_mask),
                        batch.targets);
      }
      (loss / static_cast<double>(config.accumulation_steps)).backward();
      loss_sum += loss.detach().to(torch::kFloat64) * static_cast<double>(host_batch.size());
      samples += host_batch.size();
    }
    gradients.finish_backward();
    if (config.grad_clip > 0) clip_gradient_norm(model->parameters(), config.grad_clip);
    stats.learning_rate = optimizer.learning_rate(state.global_step);
    optimizer.step(state.global_step);
    optimizer.zero_grad();
    ++state.global_step;
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

  // One small allreduce at the end of the epoch: loss sum and sample count.
  auto totals = torch::stack(
      {loss_sum.to(torch::kFloat32),
       torch::tensor(static_cast<float>(samples), loss_sum.options().dtype(torch::kFloat32))});
  comm.allreduce(totals, runtime::ReduceOp::kSum);
  const auto host_totals = totals.to(torch::kCPU);
  stats.samples = static_cast<int64_t>(host_totals[1].item<float>());
  stats.mean_loss = stats.samples > 0 ? host_totals[0].item<float>() / stats.samples : 0.0;
  stats.optimizer_steps = steps;
  stats.data_wait_seconds = loader.wait_seconds() - data_wait_before;
  stats.comm_wait_seconds = gradients.stats().exposed_wait_seconds - comm_wait_before;
  stats.seconds = seconds_since(start);
  state.next_epoch = epoch + 1;
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
  while (loader.next(host_batch)) {
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
