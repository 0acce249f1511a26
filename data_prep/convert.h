// `vqa_prep convert`: VQA-RAD and SLAKE style JSON plus an image folder (or
// precomputed features) to the dataset format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqa::prep {

struct ConvertOptions {
  std::vector<std::string> train_json, test_json;
  std::vector<std::string> val_json;  // answers for the label set only (with include_test_answers)
  std::string image_dir;
  std::string medvqa2019_root;  // VQA-Med 2019 instead of JSON (convert_medvqa.h)
  std::string output;
  int64_t image_size = 224;
  int64_t max_length = 32;
  int64_t min_word_count = 1;          // word tokenizer only
  std::string tokenizer = "word";      // "word" (from the training questions) or "roberta"
  std::string vocab_json, merges_txt;  // roberta: the tokenizer folder's two files
  std::string normalize = "dataset";   // image mean/std: "dataset" (training images) or "clip"
  std::string language = "en";         // SLAKE's q_lang; records of other languages are left out
  // How answers become labels: "vqa" (answer_normalize) or "m3ae"
  // (answer_normalize_m3ae: M3AE's label sets, e.g. K = 222 for SLAKE).
  std::string answer_normalization = "vqa";
  bool include_test_answers = false;  // label set from train + val + test (as M3AE does)
  bool strict = false;                // fail on the first bad record instead of skipping it
  std::string features;               // an HDF5 file of per-image features instead of images
  std::string features_dataset = "image_features";
  std::string features_index = "image_names";
  bool features_float16 = false;
  // Also store the train split's decoded source images (format version 3),
  // which vqa_train's --augment resized-crop cuts from.
  bool keep_source_images = false;
  int threads = 0;  // image decoding threads; 0: all cores
  std::string created_by;
};

// Throws std::invalid_argument naming the option and its value when the
// options contradict each other or name an unknown kind (a bad command line).
void convert_check_options(const ConvertOptions& options);

// Converts and prints a summary of counts; throws DataFormatError on a bad
// input that cannot be skipped (or on any with `strict`), invalid_argument on
// bad options (convert_check_options). The output appears only when the
// whole conversion succeeded.
void convert_run(const ConvertOptions& options);

}  // namespace vqa::prep
