// Reads one split of a dataset file: opens it, validates all of it, and reads
// question rows and images as plain arrays. Used by the loader on its I/O
// thread (which turns the arrays into a Batch), single-threaded by `vqa_prep
// inspect`, and by the fuzz targets. Needs HDF5 only (no LibTorch, no MPI
// start-up). Not thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset_format.h"  // DataFormatError, dataset names, limits
#include "data/dataset_info.h"    // DatasetInfo
#include "data/hdf5_crash.h"      // hdf5_crash_context
#include "data/hdf5_util.h"       // Hdf5Id
#include "data/image_resample.h"  // SourceImage

namespace vqa::data {

// Counts gathered while validating, for the inspector's summary.
struct SplitStatistics {
  int64_t closed = 0, open = 0;
  int64_t unlabelled = 0;                 // questions with no target label
  std::vector<int64_t> top_label_counts;  // [K]: questions whose best-scored label is k
};

// One question as stored, decoded for reports.
struct QuestionRecord {
  int64_t row = 0, question_id = 0, image_row = 0;
  int answer_type = 0;
  std::string question_type, question_text, answer_text, image_name;
  std::vector<int32_t> token_ids;  // without padding
  std::vector<int32_t> labels;
  std::vector<float> scores;
};

// What a reader is reading, for a watchdog on another thread: the count grows
// before every attribute, dataset or block of rows the reader reads, and
// `what` names it. Thread-safe.
class ReadProgress {
 public:
  void mark(std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    what_ = std::move(what);
    ++count_;
  }
  std::pair<int64_t, std::string> snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {count_, what_};
  }

 private:
  mutable std::mutex mutex_;
  int64_t count_ = 0;
  std::string what_ = "the file's superblock";
};

// Question rows as stored, each array row-major over the rows asked for.
struct QuestionRows {
  std::vector<int64_t> token_ids, attention_mask;            // [n, L]
  std::vector<int64_t> image_row, answer_type, question_id;  // [n]
  std::vector<int64_t> question_type;                        // [n], -1 = unknown
  std::vector<int32_t> labels;                               // [n, M], -1 = none
  std::vector<float> scores;                                 // [n, M]
};

class DatasetReader {
 public:
  // file_access: an HDF5 file-access property list; H5P_DEFAULT for the
  // default (POSIX) driver, or one set up for MPI-IO (then the open is
  // collective). Validates the header, the vocabularies, every dataset's
  // shape and dtype and every index value, streaming the question arrays in
  // blocks (memory does not grow with the file). Throws DataFormatError.
  // progress: optional, marked before each read for the whole reader's life.
  DatasetReader(const std::string& path, const std::string& split, hid_t file_access = H5P_DEFAULT,
                ReadProgress* progress = nullptr);

  const DatasetInfo& info() const { return info_; }
  const SplitStatistics& statistics() const { return statistics_; }
  const std::vector<std::string>& token_vocabulary() const { return tokens_; }
  int64_t max_targets() const { return max_targets_; }  // M
  // [n_images, 2] (height, width) of the source images; empty without them.
  const std::vector<int32_t>& source_image_shapes() const { return source_shapes_; }

  // Rows must be sorted, unique and in range (else DataFormatError).
  QuestionRows read_question_rows(const std::vector<int64_t>& rows);
  // Image rows (sorted, unique, in range): pixels uint8 [n, 3, S, S] or
  // features float32 [n, T, D], whichever the file stores.
  std::vector<uint8_t> read_pixels(const std::vector<int64_t>& image_rows);
  std::vector<float> read_features(const std::vector<int64_t>& image_rows);
  // The source images of image rows (sorted, unique, in range) of a split
  // that has them (DatasetInfo::has_source_images), in that order.
  std::vector<SourceImage> read_source_images(const std::vector<int64_t>& image_rows);

  std::vector<QuestionRecord> read_records(int64_t first, int64_t count);

 private:
  void validate_header();
  void validate_version2_header();  // tokenizer kind, special ids, normalisation (v1: defaults)
  void validate_special_tokens();   // once the vocabulary size is known
  void open_split_datasets();
  void open_source_images();  // version 3's optional group; validates offsets and shapes
  void validate_rows();
  Hdf5Id open_checked(const std::string& name, const std::vector<std::string>& dtypes,
                      const std::vector<int64_t>& expected_shape, std::vector<int64_t>* shape);
  void mark(const std::string& what) {
    if (progress_) progress_->mark(what);
    hdf5_crash_context(what);
  }
  // The question and target columns as stored (validation and records).
  struct StoredColumns {
    std::vector<int32_t> tokens;  // [n, L]
    std::vector<uint8_t> mask;    // [n, L]
    std::vector<int32_t> image_rows;
    std::vector<uint8_t> answer_types;
    std::vector<int32_t> question_types;
    std::vector<int32_t> labels;  // [n, M]
    std::vector<float> scores;    // [n, M]
  };
  StoredColumns read_stored_columns(const std::vector<int64_t>& rows);
  void check_rows(const std::vector<int64_t>& rows, int64_t limit, const char* what) const;
  [[noreturn]] void fail(const std::string& object, const std::string& problem) const;

  std::string path_, split_;
  ReadProgress* progress_ = nullptr;
  DatasetInfo info_;
  SplitStatistics statistics_;
  std::vector<std::string> tokens_, question_types_;
  int64_t max_targets_ = 0;
  std::vector<int64_t> source_offsets_;  // [n_images] when has_source_images
  std::vector<int32_t> source_shapes_;   // [n_images, 2]: height, width
  Hdf5Id source_pixels_;
  Hdf5Id file_, group_;
  Hdf5Id images_, image_names_, token_ids_, attention_mask_, image_row_, answer_type_, question_id_,
      question_type_, question_text_, answer_text_, target_labels_, target_scores_;
};

}  // namespace vqa::data
