#include "train/setup.h"

#include <cstdio>
#include <thread>

#include "runtime/check.h"         // fatal_user_error
#include "runtime/communicator.h"  // cuda_device_count

namespace vqa::train {

torch::Device setup_device(const TrainConfig& config, const runtime::RankInfo& rank) {
  const bool gpu = torch::cuda::is_available() && runtime::cuda_device_count() > 0;
  if (config.device == "cuda" && !gpu) {
    runtime::fatal_user_error(
        "--device cuda, but this LibTorch build or host has no usable CUDA "
        "device (torch::cuda::is_available() is false)");
  }
  int threads = config.threads;
  if (threads <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, cores / std::max(1, rank.local_size));
  }
  torch::set_num_threads(threads);
  if (config.device == "cuda" || (config.device == "auto" && gpu)) {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank.local_rank));
  }
  return torch::Device(torch::kCPU);
}

void require_same_on_all_ranks(const std::string& what, const std::string& text) {
  const auto hashes = runtime::distributed_gather_strings(std::to_string(stable_hash(text)));
  std::string differing;
  for (size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!differing.empty()) {
    runtime::fatal_user_error("the " + what + " differs between rank 0 and rank(s) " + differing +
                              " (hash " + hashes[0] +
                              " on rank 0); every rank must run with the "
                              "same " +
                              what);
  }
}

model::ModelConfig setup_model_config(const TrainConfig& config, const data::DatasetInfo& dataset) {
  model::ModelConfig model;
  try {
    model = model::model_config_preset(config.preset);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(std::string("--preset: ") + e.what());
  }
  auto override_if_set = [](int64_t value, int64_t& field) {
    if (value > 0) field = value;
  };
  override_if_set(config.hidden, model.hidden);
  override_if_set(config.heads, model.heads);
  override_if_set(config.ffn, model.ffn);
  override_if_set(config.vision_layers, model.vision_layers);
  override_if_set(config.text_layers, model.text_layers);
  override_if_set(config.fusion_layers, model.fusion_layers);
  override_if_set(config.patch_size, model.patch_size);
  if (config.dropout >= 0) model.dropout = config.dropout;
  if (model.hidden % model.heads != 0) {
    runtime::fatal_user_error("--hidden " + std::to_string(model.hidden) +
                              " is not divisible by --heads " + std::to_string(model.heads));
  }
  model.vocab_size = dataset.vocab_size;
  model.num_answers = dataset.num_answers;
  model.max_text_length = std::max<int64_t>(model.max_text_length, dataset.max_question_length);
  model.use_features = dataset.has_features;
  if (dataset.has_features) {
    model.feature_tokens = dataset.feature_tokens;
    model.feature_dim = dataset.feature_dim;
  } else {
    model.image_size = dataset.image_size;
    if (model.image_size % model.patch_size != 0) {
      runtime::fatal_user_error("the dataset's image size " + std::to_string(model.image_size) +
                                " (" + dataset.path + ") is not a multiple of the patch size " +
                                std::to_string(model.patch_size) + "; set --patch-size");
    }
  }
  return model;
}

}  // namespace vqa::train
