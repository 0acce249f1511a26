// Start-up steps of vqa_train for the data: the files alike on every rank,
// the recipe against the dataset, the loaders, the epoch's step count
// (declared in setup.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/dataset_format.h"  // kTokenizerRoberta, kNormalizationClip
#include "model/safetensors.h"    // SafetensorsFile

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

// RoBERTa-base's vocabulary, and the two rows of its position table before
// the first position (RoBERTa counts positions from pad + 1).
constexpr int64_t kRobertaVocabularySize = 50265;
constexpr int64_t kRobertaPositionOffset = 2;
constexpr const char* kM3aeWordEmbedding = "language_encoder.embeddings.word_embeddings.weight";
constexpr const char* kM3aePositionEmbedding =
    "language_encoder.embeddings.position_embeddings.weight";

// What the file records about how it was made, in the words of the message.
std::string dataset_description(const data::DatasetInfo& dataset) {
  std::string text = "the " + dataset.tokenizer + " tokenizer (" +
                     std::to_string(dataset.vocab_size) + " tokens), " +
                     std::to_string(dataset.max_question_length) + " tokens per question, ";
  if (dataset.has_features) return text + "pre-extracted features instead of pixels";
  return text + dataset.image_normalization + " image normalisation, " +
         std::to_string(dataset.image_size) + " px images";
}

// `vqa_prep convert` as the file records it (created_by), with the options
// in `replaced` (and their values) left out and `needed` added; without a
// recorded convert command, "vqa_prep convert <your inputs> -o FILE" and `needed`.
std::string convert_command(const data::DatasetInfo& dataset, const std::set<std::string>& replaced,
                            const std::string& needed) {
  const std::string prefix = "vqa_prep convert ";
  if (dataset.created_by.compare(0, prefix.size(), prefix) != 0) {
    return prefix + "<your inputs> -o " + dataset.path + " " + needed;
  }
  static const std::set<std::string> kFlags = {"--features-float16", "--include-test-answers",
                                               "--strict", "--keep-source-images"};
  std::istringstream words(dataset.created_by.substr(prefix.size()));
  std::string command = prefix, word;
  while (words >> word) {
    const std::string name = word.substr(0, word.find('='));
    if (replaced.count(name) == 0) {
      command += word + " ";
    } else if (word.find('=') == std::string::npos && kFlags.count(name) == 0) {
      words >> word;  // its value
    }
  }
  return command + needed;
}

}  // namespace

void require_dataset_fits_recipe(const TrainConfig& config, const data::DatasetInfo& dataset,
                                 int64_t preset_image_size) {
  const std::string& path = config.init_from;
  const std::string suffix = ".safetensors";
  if (path.size() <= suffix.size() ||
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return;
  }
  int64_t vocabulary_rows = -1, position_rows = -1;
  try {
    const model::SafetensorsFile file(path);
    if (!file.contains(kM3aeWordEmbedding)) return;  // init_model_if_asked names what is missing
    vocabulary_rows = file.entry(kM3aeWordEmbedding).shape.at(0);
    if (file.contains(kM3aePositionEmbedding))
      position_rows = file.entry(kM3aePositionEmbedding).shape.at(0);
  } catch (const std::exception&) {
    return;  // an unreadable file: init_model_if_asked says why
  }
  const bool m3ae = vocabulary_rows == kRobertaVocabularySize;
  std::vector<std::string> needs;
  std::set<std::string> replaced;
  std::string options;
  bool fits = true;
  if (m3ae) {
    const int64_t max_length = position_rows > kRobertaPositionOffset
                                   ? position_rows - kRobertaPositionOffset
                                   : dataset.max_question_length;
    fits = dataset.tokenizer == data::kTokenizerRoberta && dataset.vocab_size == vocabulary_rows &&
           !dataset.has_features && dataset.image_normalization == data::kNormalizationClip &&
           dataset.image_size == preset_image_size && dataset.max_question_length <= max_length;
    needs = {"RoBERTa's tokens (" + std::to_string(vocabulary_rows) + ")",
             "at most " + std::to_string(max_length) + " tokens per question",
             "CLIP's image normalisation",
             std::to_string(preset_image_size) + " px images (--preset " + config.preset + ")"};
    replaced = {"--tokenizer",        "--vocab-json",    "--merges-txt",       "--normalize",
                "--image-size",       "--features",      "--features-dataset", "--features-index",
                "--features-float16", "--min-word-count"};
    options =
        "--tokenizer roberta --vocab-json models/roberta-base/vocab.json --merges-txt "
        "models/roberta-base/merges.txt --normalize clip --image-size " +
        std::to_string(preset_image_size);
    if (dataset.max_question_length > max_length) {
      replaced.insert("--max-len");
      options += " --max-len " + std::to_string(std::min<int64_t>(32, max_length));
    }
  } else {
    fits = dataset.vocab_size == vocabulary_rows;
    needs = {"a vocabulary of " + std::to_string(vocabulary_rows) +
             " tokens (the rows of its word embedding)"};
    options = "with the tokenizer the checkpoint was trained with";
  }
  if (fits) return;
  std::string need_text;
  for (size_t i = 0; i < needs.size(); ++i)
    need_text += (i == 0 ? "" : i + 1 == needs.size() ? " and " : ", ") + needs[i];
  runtime::fatal_user_error_from_rank0(
      dataset.path + " does not fit the recipe: --init-from " + path +
      (m3ae ? " is M3AE (RoBERTa-base's vocabulary), which needs a dataset with "
            : " needs a dataset with ") +
      need_text + "; " + dataset.path + " has " + dataset_description(dataset) +
      ". Make a fitting file with: " +
      (m3ae ? convert_command(dataset, replaced, options)
            : "vqa_prep convert <your inputs> " + options));
}

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
  // With the word embedding's row sync a step takes all its micro-batches
  // before its first forward (their rows are gathered then: train_step.cpp);
  // the reads of a whole step overlap the previous step's compute only when
  // the loader runs that far ahead.
  if (train && config.prefetch_depth > 0) {
    options.prefetch_depth =
        static_cast<int>(std::max<int64_t>(config.prefetch_depth, config.accumulation_steps));
  }
  options.rank = rank.rank;
  options.world_size = rank.world_size;
  options.pin_memory = device.is_cuda();
  options.images_as_bytes = device.is_cuda();  // normalised there: batch_to_device
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
