// Start-up steps of vqa_train for the data: the files alike on every rank,
// the loaders, the epoch's step count (declared in setup.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/check.h"           // fatal_user_error
#include "runtime/rank_agreement.h"  // require_same_on_all_ranks
#include "train/setup.h"
#include "util/stable_hash.h"  // stable_hash

namespace vqa::train {

namespace {

// A file's identity without HDF5: "PATH: N bytes, checksum X of its first
// and last 64 KiB", "PATH: missing or unreadable" or "PATH: not a regular
// file" (the dataset reader then says what is wrong with it).
std::string file_identity(const std::string& path) {
  constexpr std::streamoff kEdgeBytes = 64 * 1024;
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status)) return path + ": missing or unreadable";
  // A directory opens as a stream too; its size from seeking is the
  // filesystem's choice (LLONG_MAX on ext4, -1 on tmpfs), never a length.
  if (!std::filesystem::is_regular_file(status)) return path + ": not a regular file";
  std::ifstream file(path, std::ios::binary);
  if (!file) return path + ": missing or unreadable";
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  if (size < 0) return path + ": unreadable";
  std::string edges(static_cast<size_t>(std::min(size, kEdgeBytes)), '\0');
  file.seekg(0);
  file.read(edges.data(), static_cast<std::streamsize>(edges.size()));
  if (size > kEdgeBytes) {
    std::string tail(static_cast<size_t>(std::min(size - kEdgeBytes, kEdgeBytes)), '\0');
    file.seekg(size - static_cast<std::streamoff>(tail.size()));
    file.read(tail.data(), static_cast<std::streamsize>(tail.size()));
    edges += tail;
  }
  if (!file) return path + ": unreadable";
  char checksum[32];
  std::snprintf(checksum, sizeof(checksum), "%016llx",
                static_cast<unsigned long long>(util::stable_hash(edges)));
  return path + ": " + std::to_string(size) + " bytes, checksum " + checksum +
         " of its first and last 64 KiB";
}

}  // namespace

void require_same_setting_on_all_ranks(const std::string& what, const std::string& text) {
  runtime::require_same_on_all_ranks(
      "the " + what + " differs between the ranks; every rank must run with the same " + what,
      text);
}

void require_same_files_on_all_ranks(const std::vector<std::string>& paths) {
  std::string identity;
  std::vector<std::string> seen;
  for (const auto& path : paths) {
    if (std::find(seen.begin(), seen.end(), path) != seen.end()) continue;
    seen.push_back(path);
    identity += (identity.empty() ? "" : "\n") + file_identity(path);
  }
  runtime::require_same_on_all_ranks(
      "the dataset files differ between the ranks; copy the same file to every node", identity);
}

data::ShardedLoader open_loader(const std::string& path, data::Split split,
                                const TrainConfig& config, const runtime::RankInfo& rank,
                                const torch::Device& device) {
  const bool train = split == data::Split::kTrain;
  data::LoaderOptions options;
  options.batch_per_rank = config.batch_per_rank;
  options.seed = config.seed;
  options.shuffle = train;
  options.drop_last = train && config.drop_last;
  options.prefetch_depth = config.prefetch_depth;
  options.rank = rank.rank;
  options.world_size = rank.world_size;
  options.pin_memory = device.is_cuda();
  options.trim_text_padding = config.trim_text_padding;
  // Evaluation stays deterministic: the test split reads the stored
  // (resized, centre-cropped) images.
  options.random_resized_crop = train && config.augment == data::Augment::kResizedCrop;
  options.crop_ranges = {config.crop_scale_min, config.crop_scale_max, config.crop_ratio_min,
                         config.crop_ratio_max};
  options.augment_threads =
      config.augment_threads > 0 ? config.augment_threads : std::max(1, at::get_num_threads());
  try {
    return data::ShardedLoader(path, data::split_name(split), options);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(e.what());
  }
}

int64_t steps_per_epoch_or_exit(const data::ShardedLoader& train_loader,
                                const TrainConfig& config) {
  const int64_t steps = optimizer_steps_per_epoch(train_loader, config);
  if (steps < 1) {
    runtime::fatal_user_error("the train split of " + config.train_data + " has " +
                              std::to_string(train_loader.info().num_questions) +
                              " questions, fewer than one --global-batch of " +
                              std::to_string(config.global_batch));
  }
  return steps;
}

}  // namespace vqa::train
