// What one split of a dataset file holds, read from the file's root
// attributes and vocabularies. Plain data: shared by the reader (no LibTorch)
// and the loader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/mode_names.h"  // ModeNames

namespace vqa::data {

// A file's two question sets; split_name gives their HDF5 groups.
enum class Split { kTrain, kTest };
inline const char* split_name(Split split) { return split == Split::kTrain ? "train" : "test"; }

// Train-time augmentation (--augment): none, or M3AE's random resized crop
// of each sample's source image (LoaderOptions::random_resized_crop).
enum class Augment { kNone, kResizedCrop };
inline const util::ModeNames<Augment> kAugmentNames = {{"none", Augment::kNone},
                                                       {"resized-crop", Augment::kResizedCrop}};

// Token ids with a role, as the file records them (FORMAT.md). The defaults
// are the word tokenizer's (and every version-1 file's).
struct SpecialTokenIds {
  int64_t pad = 0;   // padding after the question (attention mask 0)
  int64_t cls = 2;   // the first token: <cls> (word), <s> (roberta)
  int64_t eos = -1;  // the last real token: </s> (roberta); -1 when the tokenizer has none
  int64_t unk = 1;   // a token outside the vocabulary
};

struct DatasetInfo {
  std::string path, split;
  int64_t num_questions = 0, num_images = 0;
  int64_t num_answers = 0;  // K, the size of the answer label set
  int64_t vocab_size = 0, max_question_length = 0;
  bool has_features = false;                    // false: pixels
  int64_t image_size = 0;                       // pixels: H == W; 0 when features
  bool has_source_images = false;               // the split holds its source images (version 3)
  int64_t feature_tokens = 0, feature_dim = 0;  // features: [n_images, tokens, dim]; 0 when pixels
  // Format version, split, counts and a checksum of the header and
  // vocabularies: equal strings on two ranks mean the same dataset.
  std::string identity;
  std::vector<std::string> answer_labels;   // label id -> answer text
  std::vector<std::string> question_types;  // question type code -> name
  std::string tokenizer;                    // the tokenizer kind: "word" or "roberta"
  SpecialTokenIds special_tokens;
  // "<vocab.json sha256> <merges.txt sha256>" of a roberta tokenizer; empty for word.
  std::string tokenizer_sha256;
  std::vector<double> image_mean, image_std;  // per channel, pixel values in [0, 1]
  std::string image_normalization;            // what mean/std are: "dataset", "clip" or "none"
  int64_t format_version = 0;                 // the file's
  // How the answers became labels ("vqa" or "m3ae") and from which splits
  // ("train", "train+test", "train+val+test"); "" when the file does not say.
  std::string answer_normalization, answer_label_set;
  std::string created_by;  // the vqa_prep command line that wrote the file
};

}  // namespace vqa::data
