// Reads one split of a dataset file: opens it, validates all of it, and reads
// batches of question rows with their images. Used by the loader on its I/O
// thread and, single-threaded, by `vqa_prep inspect`. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/hdf5_util.h"  // Hdf5Id
#include "data/loader.h"     // DatasetInfo, Batch

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

class DatasetReader {
 public:
  // use_mpio: open through MPI-IO on the runtime's I/O communicator
  // (collective); otherwise the default driver. Validates the header, the
  // vocabularies, every dataset's shape and dtype and every index value,
  // streaming the question arrays in blocks (memory does not grow with the
  // file). Throws DataFormatError.
  DatasetReader(const std::string& path, const std::string& split, bool use_mpio);

  const DatasetInfo& info() const { return info_; }
  const SplitStatistics& statistics() const { return statistics_; }
  const std::vector<std::string>& token_vocabulary() const { return tokens_; }

  // Questions `rows` (any order, repeats allowed) and their images, in that
  // order; valid[i] becomes batch.valid[i].
  Batch read_batch(const std::vector<int64_t>& rows, const std::vector<float>& valid);

  std::vector<QuestionRecord> read_records(int64_t first, int64_t count);

 private:
  void validate_header();
  void open_split_datasets();
  void validate_rows();
  Hdf5Id open_checked(const std::string& name, const std::vector<std::string>& dtypes,
                      const std::vector<int64_t>& expected_shape, std::vector<int64_t>* shape);
  [[noreturn]] void fail(const std::string& object, const std::string& problem) const;

  std::string path_, split_;
  DatasetInfo info_;
  SplitStatistics statistics_;
  std::vector<std::string> tokens_, question_types_;
  int64_t max_targets_ = 0;
  Hdf5Id file_, group_;
  Hdf5Id images_, image_names_, token_ids_, attention_mask_, image_row_, answer_type_, question_id_,
      question_type_, question_text_, answer_text_, target_labels_, target_scores_;
};

}  // namespace vqa::data
