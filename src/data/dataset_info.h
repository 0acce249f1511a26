// What one split of a dataset file holds, read from the file's root
// attributes and vocabularies. Plain data: shared by the reader (no LibTorch)
// and the loader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vqa::data {

struct DatasetInfo {
  std::string path, split;
  int64_t num_questions = 0, num_images = 0;
  int64_t num_answers = 0;  // K, the size of the answer label set
  int64_t vocab_size = 0, max_question_length = 0;
  bool has_features = false;                    // false: pixels
  int64_t image_size = 0;                       // pixels: H == W; 0 when features
  int64_t feature_tokens = 0, feature_dim = 0;  // features: [n_images, tokens, dim]; 0 when pixels
  // Format version, split, counts and a checksum of the header and
  // vocabularies: equal strings on two ranks mean the same dataset.
  std::string identity;
  std::vector<std::string> answer_labels;     // label id -> answer text
  std::string tokenizer;                      // the tokenizer kind, e.g. "word"
  std::vector<double> image_mean, image_std;  // per channel, pixel values in [0, 1]
};

}  // namespace vqa::data
