// Writes the dataset format (FORMAT.md) with the HDF5 C API and the default
// (POSIX) driver: the prep tool is a serial program and needs no MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset_format.h"  // kPadToken
#include "data/dataset_info.h"    // SpecialTokenIds
#include "data/hdf5_util.h"       // Hdf5Id
#include "data/image_resample.h"  // SourceImage

namespace vqa::prep {

// Root attributes and vocabularies: what makes a file self-describing.
struct FileHeader {
  bool features = false;   // false: pixels
  int64_t image_size = 0;  // pixels: side of the square images; 0 with features
  std::vector<double> image_mean{0.5, 0.5, 0.5}, image_std{0.5, 0.5, 0.5};  // [0, 1] units
  std::string image_normalization = "dataset";  // data::kNormalization*: what mean/std are
  int64_t max_question_length = 32;
  std::string tokenizer = "word";
  data::SpecialTokenIds special_tokens;       // the word tokenizer's by default
  std::string tokenizer_sha256;               // roberta: "<vocab.json sha256> <merges.txt sha256>"
  std::string created_by;                     // the command line that wrote the file
  std::string answer_normalization;           // "vqa" or "m3ae"; "" (not written): synthetic
  std::string answer_label_set;               // "train", "train+test", "train+val+test"; "" too
  std::vector<std::string> answer_labels;     // label id -> answer
  std::vector<std::string> token_vocabulary;  // token id -> token
  std::vector<std::string> question_types;    // question type code -> name
};

// The questions of one split, row by row, as stored.
struct QuestionTable {
  QuestionTable(int64_t max_length, int64_t max_targets, int32_t pad_token = data::kPadToken)
      : max_length(max_length), max_targets(max_targets), pad_token(pad_token) {}
  int64_t size() const { return static_cast<int64_t>(image_row.size()); }
  // tokens: at most max_length ids (padded here with pad_token); labels/scores: at most
  // max_targets pairs (none when the answer is outside the label set).
  void add(const std::vector<int32_t>& tokens, int32_t image, int answer_type, int64_t question_id,
           int32_t question_type, const std::string& question, const std::string& answer,
           const std::vector<int32_t>& labels, const std::vector<float>& scores);

  int64_t max_length, max_targets;
  int32_t pad_token;
  std::vector<int32_t> token_ids;       // [n, max_length]
  std::vector<uint8_t> attention_mask;  // [n, max_length]
  std::vector<int32_t> image_row;
  std::vector<uint8_t> answer_type;
  std::vector<int64_t> question_id;
  std::vector<int32_t> question_type;
  std::vector<std::string> question_text, answer_text;
  std::vector<int32_t> target_labels;  // [n, max_targets], -1 = none
  std::vector<float> target_scores;    // [n, max_targets]
};

// Writes `<path>.partial` and renames it to `path` in commit(): a run that
// fails (an exception, a destructor without commit) leaves no dataset behind.
// Usage: per split begin_split, append images or features, end_images; then
// write_questions per split (in any order); then commit.
class DatasetWriter {
 public:
  explicit DatasetWriter(const std::string& path);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Pixels: image_size > 0. Features: feature_tokens, feature_dim > 0,
  // stored as float16 when half_precision.
  void begin_split(const std::string& split, int64_t image_size, int64_t feature_tokens = 0,
                   int64_t feature_dim = 0, bool half_precision = false);
  // Appends one image (uint8 [3, S, S], RGB) or one feature row (float
  // [tokens, dim]); returns its row.
  int64_t append_image(const uint8_t* pixels);
  int64_t append_features(const float* values);
  // Pixels only, optional: the decoded source of the image just appended
  // (format version 3's source_images, for the loader's random resized
  // crop). Either every image of the split gets one or none does.
  void append_source_image(const data::SourceImage& source);
  // Closes the split's images; image_names[row] names each appended row.
  void end_images(const std::vector<std::string>& image_names);
  void write_questions(const std::string& split, const QuestionTable& questions);

  // Writes the header, closes and renames. The only step that makes `path` appear.
  void commit(const FileHeader& header);

 private:
  int64_t append_row(hid_t memory_type, const void* row);

  std::string path_, partial_path_;
  data::Hdf5Id file_, split_group_, images_, source_pixels_;
  int64_t image_rows_ = 0;
  std::vector<int64_t> source_offsets_;  // per source image; the next one's is source_bytes_
  std::vector<int32_t> source_shapes_;   // [n, 2]: height, width
  int64_t source_bytes_ = 0;
  std::vector<int64_t> row_shape_;
  bool committed_ = false;
};

// One split held in memory (synthetic data, tests): written in one go.
struct SplitData {
  std::string name;
  int64_t image_size = 0;
  std::vector<uint8_t> pixels;             // [n_images, 3, S, S]
  std::vector<data::SourceImage> sources;  // none, or one per image (format version 3)
  std::vector<std::string> image_names;
  QuestionTable questions{32, 1};
};
void prep_write_dataset(const std::string& path, const FileHeader& header,
                        const std::vector<SplitData>& splits);

}  // namespace vqa::prep
