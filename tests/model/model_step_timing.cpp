// Times one forward + backward of the tiny and small presets on one CPU
// thread (batch 32, text length 32), the numbers the CPU benchmarks assume.
// Not a test: it prints milliseconds and checks nothing. Process CPU time is
// printed beside wall time because on a shared machine the wall time also
// counts the time other processes held the core.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "model/m3ae.h"  // M3AE, model_config_preset, parameter_count

int main() {
  using vqa::model::M3AE;
  torch::set_num_threads(1);
  constexpr int64_t kBatch = 32;
  constexpr int64_t kTextLength = 32;
  constexpr int kTimedSteps = 5;
  for (const char* preset : {"tiny", "small"}) {
    torch::manual_seed(0);
    const vqa::model::ModelConfig config = vqa::model::model_config_preset(preset);
    M3AE model(config);
    const torch::Tensor images = torch::randn({kBatch, 3, config.image_size, config.image_size});
    const torch::Tensor token_ids = torch::randint(config.vocab_size, {kBatch, kTextLength});
    const torch::Tensor attention_mask = torch::ones({kBatch, kTextLength}, torch::kLong);
    const torch::Tensor labels = torch::randint(config.num_answers, {kBatch});
    const auto step = [&] {
      model->zero_grad();
      torch::nn::functional::cross_entropy(model->forward(images, token_ids, attention_mask),
                                           labels)
          .backward();
    };
    step();  // warm-up: first-touch allocations
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    for (int i = 0; i < kTimedSteps; ++i) step();
    const double cpu_ms = 1e3 * double(std::clock() - cpu_start) / CLOCKS_PER_SEC / kTimedSteps;
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        kTimedSteps;
    std::printf(
        "%s: %lld parameters, forward+backward batch %lld, text %lld, 1 thread: %.1f ms wall, "
        "%.1f ms CPU\n",
        preset, static_cast<long long>(vqa::model::parameter_count(*model)),
        static_cast<long long>(kBatch), static_cast<long long>(kTextLength), wall_ms, cpu_ms);
  }
  return 0;
}
