// Times one forward + backward of the tiny and small presets on one CPU
// thread (batch 32, text length 32), the numbers the CPU benchmarks assume,
// with the attention projections packed into one GEMM and
// separate, interleaved round by round, medians of 5 rounds.
// Not a test: it prints milliseconds and checks nothing. Process CPU time is
// printed beside wall time because on a shared machine the wall time also
// counts the time other processes held the core.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include <algorithm>
#include <vector>

#include "model/layers.h"  // set_packed_projections
#include "model/m3ae.h"    // M3AE, model_config_preset, parameter_count

int main() {
  using vqa::model::M3AE;
  torch::set_num_threads(1);
  constexpr int64_t kBatch = 32;
  constexpr int64_t kTextLength = 32;
  constexpr int kTimedSteps = 3;
  constexpr int kRounds = 5;
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
    const auto set_packed = [&](bool packed) {
      vqa::model::set_packed_projections(*model, packed);
    };
    // Mean wall and CPU milliseconds of kTimedSteps steps.
    const auto time_steps = [&] {
      const auto start = std::chrono::steady_clock::now();
      const std::clock_t cpu_start = std::clock();
      for (int i = 0; i < kTimedSteps; ++i) step();
      const double cpu = 1e3 * double(std::clock() - cpu_start) / CLOCKS_PER_SEC / kTimedSteps;
      const double wall =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() /
          kTimedSteps;
      return std::make_pair(wall, cpu);
    };
    step();  // warm-up: first-touch allocations
    std::vector<double> wall[2], cpu[2];
    for (int round = 0; round < kRounds; ++round) {
      for (const bool packed : {true, false}) {
        set_packed(packed);
        const auto [w, c] = time_steps();
        wall[packed].push_back(w);
        cpu[packed].push_back(c);
      }
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (const bool packed : {true, false}) {
      std::printf(
          "%s: %lld parameters, forward+backward batch %lld, text %lld, 1 thread, attention "
          "projections %s: %.1f ms wall, %.1f ms CPU\n",
          preset, static_cast<long long>(vqa::model::parameter_count(*model)),
          static_cast<long long>(kBatch), static_cast<long long>(kTextLength),
          packed ? "packed" : "separate", median(wall[packed]), median(cpu[packed]));
    }
  }
  return 0;
}
