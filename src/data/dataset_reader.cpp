#include "data/dataset_reader.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <tuple>

#include "util/hdf5_error.h"  // hdf5_error_stack

namespace vqa::data {

namespace {

constexpr int64_t kValidationBlockRows = 16384;  // bounds validation memory to a few MB

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// FNV-1a, 64 bit: a checksum for the identity string, not for security.
class Fingerprint {
 public:
  void add(const std::string& text) {
    for (unsigned char c : text) hash_ = (hash_ ^ c) * 0x100000001B3ull;
    hash_ = (hash_ ^ 0xFF) * 0x100000001B3ull;  // separator: ["ab","c"] != ["a","bc"]
  }
  void add(int64_t value) { add(std::to_string(value)); }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof(text), "%016" PRIx64, hash_);
    return text;
  }

 private:
  uint64_t hash_ = 0xCBF29CE484222325ull;
};

// Rows of a chunked dataset stored one row per chunk, one read each: a union
// of hyperslabs over chunks makes HDF5 1.10 map every element to its chunk
// (~10x slower for a batch of images), while a single-chunk selection is
// one chunk read.
template <typename T>
std::vector<T> read_chunk_rows(hid_t dataset, hid_t memory_type,
                               const std::vector<int64_t>& sorted_rows, int64_t row_elements,
                               const std::string& name, const std::string& path) {
  std::vector<T> values(sorted_rows.size() * static_cast<size_t>(row_elements));
  for (size_t i = 0; i < sorted_rows.size(); ++i) {
    Hdf5RowSelection selection = hdf5_select_rows(dataset, {sorted_rows[i]}, name, path);
    if (H5Dread(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                H5P_DEFAULT, values.data() + i * row_elements) < 0) {
      // Not validated on open (that would read every image): a damaged chunk shows here.
      throw DataFormatError(path + ": dataset '" + name + "' row " +
                            std::to_string(sorted_rows[i]) +
                            ": cannot be read (a damaged chunk?): " + util::hdf5_error_stack());
    }
  }
  return values;
}

std::vector<int64_t> row_range(int64_t first, int64_t count) {
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) rows[i] = first + i;
  return rows;
}

}  // namespace

void DatasetReader::fail(const std::string& object, const std::string& problem) const {
  throw DataFormatError(path_ + ": " + object + ": " + problem);
}

DatasetReader::DatasetReader(const std::string& path, const std::string& split, hid_t file_access,
                             ReadProgress* progress)
    : path_(path), split_(split), progress_(progress) {
  const Hdf5CrashScope crash_scope(path);
  hdf5_silence_errors();
  info_.path = path;
  info_.split = split;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw DataFormatError(path + ": is a directory, not a dataset file");
  }
  if (!std::filesystem::is_regular_file(path, error)) {
    throw DataFormatError(path + ": no such dataset file");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) throw DataFormatError(path + ": not an HDF5 file");
  file_ = Hdf5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, file_access));
  if (!file_.valid()) {
    const std::string stack = util::hdf5_error_stack();
    if (stack.find("truncated file") != std::string::npos) {
      throw DataFormatError(path +
                            ": the file is truncated, shorter than its header says (a copy or a "
                            "write that did not finish?): " +
                            stack);
    }
    throw DataFormatError(path + ": H5Fopen failed: " + stack);
  }
  validate_header();
  open_split_datasets();
  validate_rows();
}

Hdf5Id DatasetReader::open_checked(const std::string& name, const std::vector<std::string>& dtypes,
                                   const std::vector<int64_t>& expected_shape,
                                   std::vector<int64_t>* shape) {
  mark("dataset '" + name + "'");
  Hdf5Id dataset = hdf5_open_dataset(file_.get(), name, path_);
  const std::string dtype = hdf5_element_type(dataset.get(), false, name, path_).describe();
  if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) {
    std::string expected;
    for (const auto& d : dtypes) expected += (expected.empty() ? "" : " or ") + d;
    fail("dataset '" + name + "'", "dtype is " + dtype + ", expected " + expected);
  }
  std::vector<int64_t> actual = hdf5_shape(dataset.get(), name, path_);
  bool matches = actual.size() == expected_shape.size();
  for (size_t i = 0; matches && i < actual.size(); ++i) {
    matches = expected_shape[i] < 0 || expected_shape[i] == actual[i];
  }
  if (!matches) {
    fail("dataset '" + name + "'", "shape is " + shape_string(actual) + ", expected " +
                                       shape_string(expected_shape) + " (-1: any)");
  }
  if (shape) *shape = actual;
  return dataset;
}

void DatasetReader::open_split_datasets() {
  if (split_.empty() || split_.find('/') != std::string::npos ||
      !hdf5_exists(file_.get(), "/" + split_)) {
    fail("split '" + split_ + "'", "no such group in the file (expected /train or /test)");
  }
  const std::string prefix = "/" + split_ + "/";
  const int64_t length = info_.max_question_length;
  std::vector<int64_t> shape;
  token_ids_ = open_checked(prefix + kTokenIds, {"int32"}, {-1, length}, &shape);
  info_.num_questions = shape[0];
  if (info_.num_questions < 1 || info_.num_questions > INT32_MAX) {
    fail("dataset '" + prefix + kTokenIds + "'", "has " + std::to_string(shape[0]) + " questions");
  }
  if (info_.has_features) {
    images_ = open_checked(prefix + kFeatures, {"float16", "float32"}, {-1, -1, -1}, &shape);
    info_.feature_tokens = shape[1];
    info_.feature_dim = shape[2];
    if (shape[1] < 1 || shape[2] < 1 || shape[1] * shape[2] > kMaxFeatureElements) {
      fail("dataset '" + prefix + kFeatures + "'",
           "per-image shape " + shape_string(shape) + " is empty or larger than " +
               std::to_string(kMaxFeatureElements) + " values");
    }
  } else {
    const int64_t size = info_.image_size;
    images_ = open_checked(prefix + kImages, {"uint8"}, {-1, 3, size, size}, &shape);
  }
  info_.num_images = shape[0];
  if (info_.num_images < 1) fail("dataset '" + prefix + kImages + "'", "holds no images");
  const int64_t n = info_.num_questions;
  image_names_ = open_checked(prefix + kImageNames, {"string"}, {info_.num_images}, nullptr);
  attention_mask_ = open_checked(prefix + kAttentionMask, {"uint8"}, {n, length}, nullptr);
  image_row_ = open_checked(prefix + kImageRow, {"int32"}, {n}, nullptr);
  answer_type_ = open_checked(prefix + kAnswerType, {"uint8"}, {n}, nullptr);
  question_id_ = open_checked(prefix + kQuestionId, {"int64"}, {n}, nullptr);
  question_type_ = open_checked(prefix + kQuestionType, {"int32"}, {n}, nullptr);
  question_text_ = open_checked(prefix + kQuestionText, {"string"}, {n}, nullptr);
  answer_text_ = open_checked(prefix + kAnswerText, {"string"}, {n}, nullptr);
  target_labels_ = open_checked(prefix + kTargetLabels, {"int32"}, {n, -1}, &shape);
  max_targets_ = shape[1];
  if (max_targets_ < 1 || max_targets_ > kMaxTargetsPerQuestion) {
    fail("dataset '" + prefix + kTargetLabels + "'", "has " + std::to_string(max_targets_) +
                                                         " targets per question, expected 1.." +
                                                         std::to_string(kMaxTargetsPerQuestion));
  }
  target_scores_ = open_checked(prefix + kTargetScores, {"float32"}, {n, max_targets_}, nullptr);
  open_source_images();

  Fingerprint fingerprint;
  for (const auto& text : {info_.tokenizer, std::string(info_.has_features ? "features" : "pixels"),
                           info_.tokenizer_sha256, info_.image_normalization}) {
    fingerprint.add(text);
  }
  const SpecialTokenIds& special = info_.special_tokens;
  for (int64_t value : {info_.image_size, info_.max_question_length, info_.feature_tokens,
                        info_.feature_dim, max_targets_, special.pad, special.cls, special.eos,
                        special.unk, int64_t{info_.has_source_images}}) {
    fingerprint.add(value);
  }
  for (double value : info_.image_mean) fingerprint.add(std::to_string(value));
  for (double value : info_.image_std) fingerprint.add(std::to_string(value));
  for (const auto& label : info_.answer_labels) fingerprint.add(label);
  for (const auto& token : tokens_) fingerprint.add(token);
  info_.identity = "v" + std::to_string(info_.format_version) + "/" + split_ + "/q" +
                   std::to_string(n) + "/i" + std::to_string(info_.num_images) + "/K" +
                   std::to_string(info_.num_answers) + "/V" + std::to_string(info_.vocab_size) +
                   "/" + fingerprint.hex();
}

void DatasetReader::open_source_images() {
  const std::string prefix = "/" + split_ + "/";
  mark("group '" + prefix + kSourceImages + "'");
  // Version 1 and 2 files have none; a reader of those versions never looked.
  if (info_.format_version < 3 || !hdf5_exists(file_.get(), prefix + kSourceImages)) return;
  if (info_.has_features) {
    fail("group '" + prefix + kSourceImages + "'",
         "the file stores features; source images go with pixels only");
  }
  const int64_t n = info_.num_images;
  std::vector<int64_t> shape;
  source_pixels_ = open_checked(prefix + kSourcePixels, {"uint8"}, {-1}, &shape);
  const int64_t total = shape[0];
  Hdf5Id offsets = open_checked(prefix + kSourceOffsets, {"int64"}, {n}, nullptr);
  Hdf5Id shapes = open_checked(prefix + kSourceShapes, {"int32"}, {n, 2}, nullptr);
  const std::vector<int64_t> rows = row_range(0, n);
  mark("dataset '" + prefix + kSourceOffsets + "' (its values)");
  source_offsets_ = hdf5_read_rows<int64_t>(offsets.get(), H5T_NATIVE_INT64, rows, 1,
                                            prefix + kSourceOffsets, path_);
  mark("dataset '" + prefix + kSourceShapes + "' (its values)");
  source_shapes_ = hdf5_read_rows<int32_t>(shapes.get(), H5T_NATIVE_INT32, rows, 2,
                                           prefix + kSourceShapes, path_);
  // Images lie back to back in row order: each offset is where the previous ends.
  int64_t expected = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t height = source_shapes_[2 * i], width = source_shapes_[2 * i + 1];
    if (height < 1 || width < 1 || height > kMaxSourceImageSide || width > kMaxSourceImageSide) {
      fail("dataset '" + prefix + kSourceShapes + "' row " + std::to_string(i),
           "height x width " + std::to_string(height) + "x" + std::to_string(width) +
               " is outside 1.." + std::to_string(kMaxSourceImageSide));
    }
    if (source_offsets_[i] != expected) {
      fail("dataset '" + prefix + kSourceOffsets + "' row " + std::to_string(i),
           "value " + std::to_string(source_offsets_[i]) + " is not " + std::to_string(expected) +
               ", where the previous image ends");
    }
    expected += height * width * 3;
  }
  if (expected != total) {
    fail("dataset '" + prefix + kSourcePixels + "'",
         "holds " + std::to_string(total) + " bytes, the shapes in '" + prefix + kSourceShapes +
             "' add up to " + std::to_string(expected));
  }
  info_.has_source_images = true;
}

void DatasetReader::validate_rows() {
  const std::string prefix = "/" + split_ + "/";
  const int64_t n = info_.num_questions, length = info_.max_question_length;
  statistics_.top_label_counts.assign(static_cast<size_t>(info_.num_answers), 0);
  auto out_of_range = [&](const char* name, int64_t row, int64_t value, int64_t low, int64_t high) {
    fail("dataset '" + prefix + name + "' row " + std::to_string(row),
         "value " + std::to_string(value) + " is outside [" + std::to_string(low) + ", " +
             std::to_string(high) + ")");
  };
  for (int64_t first = 0; first < n; first += kValidationBlockRows) {
    const int64_t count = std::min(kValidationBlockRows, n - first);
    mark("rows " + std::to_string(first) + ".." + std::to_string(first + count - 1) + " of " +
         prefix + "questions and targets");
    const StoredColumns columns = read_stored_columns(row_range(first, count));
    const auto& [tokens, mask, image_rows, answer_types, question_types, labels, scores] = columns;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = first + i;
      for (int64_t t = 0; t < length; ++t) {
        const int64_t token = tokens[i * length + t];
        if (token < 0 || token >= info_.vocab_size)
          out_of_range(kTokenIds, row, token, 0, info_.vocab_size);
        if (mask[i * length + t] > 1) out_of_range(kAttentionMask, row, mask[i * length + t], 0, 2);
      }
      if (image_rows[i] < 0 || image_rows[i] >= info_.num_images) {
        out_of_range(kImageRow, row, image_rows[i], 0, info_.num_images);
      }
      if (answer_types[i] > 1) out_of_range(kAnswerType, row, answer_types[i], 0, 2);
      (answer_types[i] == kAnswerTypeClosed ? statistics_.closed : statistics_.open) += 1;
      const auto num_types = static_cast<int64_t>(question_types_.size());
      if (question_types[i] < -1 || question_types[i] >= num_types) {
        out_of_range(kQuestionType, row, question_types[i], -1, num_types);
      }
      int64_t best = -1;
      float best_score = -1.0f;
      for (int64_t m = 0; m < max_targets_; ++m) {
        const int64_t label = labels[i * max_targets_ + m];
        const float score = scores[i * max_targets_ + m];
        if (label < -1 || label >= info_.num_answers) {
          out_of_range(kTargetLabels, row, label, -1, info_.num_answers);
        }
        if (!(score >= 0.0f && score <= 1.0f)) {
          fail("dataset '" + prefix + kTargetScores + "' row " + std::to_string(row),
               "score " + number_text(score) + " is outside [0, 1]");
        }
        if (label >= 0 && score > best_score) best = label, best_score = score;
      }
      if (best < 0) {
        ++statistics_.unlabelled;
      } else {
        ++statistics_.top_label_counts[static_cast<size_t>(best)];
      }
    }
  }
}

DatasetReader::StoredColumns DatasetReader::read_stored_columns(const std::vector<int64_t>& rows) {
  const std::string prefix = "/" + split_ + "/";
  const int64_t length = info_.max_question_length;
  StoredColumns c;
  c.tokens = hdf5_read_rows<int32_t>(token_ids_.get(), H5T_NATIVE_INT32, rows, length,
                                     prefix + kTokenIds, path_);
  c.mask = hdf5_read_rows<uint8_t>(attention_mask_.get(), H5T_NATIVE_UINT8, rows, length,
                                   prefix + kAttentionMask, path_);
  c.image_rows = hdf5_read_rows<int32_t>(image_row_.get(), H5T_NATIVE_INT32, rows, 1,
                                         prefix + kImageRow, path_);
  c.answer_types = hdf5_read_rows<uint8_t>(answer_type_.get(), H5T_NATIVE_UINT8, rows, 1,
                                           prefix + kAnswerType, path_);
  c.question_types = hdf5_read_rows<int32_t>(question_type_.get(), H5T_NATIVE_INT32, rows, 1,
                                             prefix + kQuestionType, path_);
  c.labels = hdf5_read_rows<int32_t>(target_labels_.get(), H5T_NATIVE_INT32, rows, max_targets_,
                                     prefix + kTargetLabels, path_);
  c.scores = hdf5_read_rows<float>(target_scores_.get(), H5T_NATIVE_FLOAT, rows, max_targets_,
                                   prefix + kTargetScores, path_);
  return c;
}

void DatasetReader::check_rows(const std::vector<int64_t>& rows, int64_t limit,
                               const char* what) const {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= limit || (i > 0 && rows[i] <= rows[i - 1])) {
      fail(what, "row " + std::to_string(rows[i]) + " is out of range [0, " +
                     std::to_string(limit) + ") or not sorted and unique");
    }
  }
}

QuestionRows DatasetReader::read_question_rows(const std::vector<int64_t>& rows) {
  const Hdf5CrashScope crash_scope(path_);
  check_rows(rows, info_.num_questions, "read_question_rows");
  mark(std::to_string(rows.size()) + " rows of /" + split_ + "/questions and targets");
  const int64_t length = info_.max_question_length;
  const std::string prefix = "/" + split_ + "/";
  QuestionRows result;
  result.token_ids = hdf5_read_rows<int64_t>(token_ids_.get(), H5T_NATIVE_INT64, rows, length,
                                             prefix + kTokenIds, path_);
  result.attention_mask = hdf5_read_rows<int64_t>(attention_mask_.get(), H5T_NATIVE_INT64, rows,
                                                  length, prefix + kAttentionMask, path_);
  result.image_row = hdf5_read_rows<int64_t>(image_row_.get(), H5T_NATIVE_INT64, rows, 1,
                                             prefix + kImageRow, path_);
  result.answer_type = hdf5_read_rows<int64_t>(answer_type_.get(), H5T_NATIVE_INT64, rows, 1,
                                               prefix + kAnswerType, path_);
  result.question_id = hdf5_read_rows<int64_t>(question_id_.get(), H5T_NATIVE_INT64, rows, 1,
                                               prefix + kQuestionId, path_);
  result.question_type = hdf5_read_rows<int64_t>(question_type_.get(), H5T_NATIVE_INT64, rows, 1,
                                                 prefix + kQuestionType, path_);
  result.labels = hdf5_read_rows<int32_t>(target_labels_.get(), H5T_NATIVE_INT32, rows,
                                          max_targets_, prefix + kTargetLabels, path_);
  result.scores = hdf5_read_rows<float>(target_scores_.get(), H5T_NATIVE_FLOAT, rows, max_targets_,
                                        prefix + kTargetScores, path_);
  // Validated on open; checked again because the batch code indexes with them.
  for (size_t i = 0; i < rows.size(); ++i) {
    if (result.image_row[i] < 0 || result.image_row[i] >= info_.num_images) {
      fail("dataset '" + prefix + kImageRow + "' row " + std::to_string(rows[i]),
           "value " + std::to_string(result.image_row[i]) + " is out of range");
    }
  }
  for (size_t i = 0; i < result.labels.size(); ++i) {
    if (result.labels[i] < -1 || result.labels[i] >= info_.num_answers) {
      fail("dataset '" + prefix + kTargetLabels + "' row " +
               std::to_string(rows[i / static_cast<size_t>(max_targets_)]),
           "label " + std::to_string(result.labels[i]) + " is out of range");
    }
  }
  return result;
}

std::vector<uint8_t> DatasetReader::read_pixels(const std::vector<int64_t>& image_rows) {
  const Hdf5CrashScope crash_scope(path_);
  if (info_.has_features) fail("read_pixels", "the file stores features, not pixels");
  check_rows(image_rows, info_.num_images, "read_pixels");
  mark(std::to_string(image_rows.size()) + " rows of /" + split_ + "/" + kImages);
  const int64_t size = info_.image_size;
  return read_chunk_rows<uint8_t>(images_.get(), H5T_NATIVE_UINT8, image_rows, 3 * size * size,
                                  "/" + split_ + "/" + kImages, path_);
}

std::vector<float> DatasetReader::read_features(const std::vector<int64_t>& image_rows) {
  const Hdf5CrashScope crash_scope(path_);
  if (!info_.has_features) fail("read_features", "the file stores pixels, not features");
  check_rows(image_rows, info_.num_images, "read_features");
  mark(std::to_string(image_rows.size()) + " rows of /" + split_ + "/" + kFeatures);
  return read_chunk_rows<float>(images_.get(), H5T_NATIVE_FLOAT, image_rows,
                                info_.feature_tokens * info_.feature_dim,
                                "/" + split_ + "/" + kFeatures, path_);
}

std::vector<SourceImage> DatasetReader::read_source_images(const std::vector<int64_t>& image_rows) {
  const Hdf5CrashScope crash_scope(path_);
  const std::string name = "/" + split_ + "/" + kSourcePixels;
  if (!info_.has_source_images) fail("read_source_images", "the split holds no source images");
  check_rows(image_rows, info_.num_images, "read_source_images");
  mark(std::to_string(image_rows.size()) + " images of " + name);
  std::vector<SourceImage> images(image_rows.size());
  for (size_t i = 0; i < image_rows.size(); ++i) {
    const auto row = static_cast<size_t>(image_rows[i]);
    SourceImage& image = images[i];
    image.height = source_shapes_[2 * row];
    image.width = source_shapes_[2 * row + 1];
    image.rgb.resize(static_cast<size_t>(image.height) * image.width * 3);
    const hsize_t start[1] = {static_cast<hsize_t>(source_offsets_[row])};
    const hsize_t count[1] = {image.rgb.size()};
    Hdf5Id file_space(H5Dget_space(source_pixels_.get()));
    hdf5_try(file_space.get(), "H5Dget_space", path_);
    hdf5_try(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
             "H5Sselect_hyperslab", path_);
    Hdf5Id memory_space(H5Screate_simple(1, count, nullptr));
    hdf5_try(memory_space.get(), "H5Screate_simple", path_);
    if (H5Dread(source_pixels_.get(), H5T_NATIVE_UINT8, memory_space.get(), file_space.get(),
                H5P_DEFAULT, image.rgb.data()) < 0) {
      throw DataFormatError(path_ + ": dataset '" + name + "' image " + std::to_string(row) +
                            ": cannot be read (a damaged chunk?): " + util::hdf5_error_stack());
    }
  }
  return images;
}

std::vector<QuestionRecord> DatasetReader::read_records(int64_t first, int64_t count) {
  const Hdf5CrashScope crash_scope(path_);
  count = std::max<int64_t>(0, std::min(count, info_.num_questions - first));
  std::vector<QuestionRecord> records(static_cast<size_t>(count));
  if (count == 0) return records;
  const std::string prefix = "/" + split_ + "/";
  const std::vector<int64_t> rows = row_range(first, count);
  const int64_t length = info_.max_question_length;
  const StoredColumns columns = read_stored_columns(rows);
  const auto& [tokens, mask, image_rows, answer_types, question_types, labels, scores] = columns;
  const auto question_ids = hdf5_read_rows<int64_t>(question_id_.get(), H5T_NATIVE_INT64, rows, 1,
                                                    prefix + kQuestionId, path_);
  const auto questions =
      hdf5_read_strings(question_text_.get(), first, count, prefix + kQuestionText, path_);
  const auto answers =
      hdf5_read_strings(answer_text_.get(), first, count, prefix + kAnswerText, path_);
  for (int64_t i = 0; i < count; ++i) {
    QuestionRecord& record = records[i];
    record.row = first + i;
    record.question_id = question_ids[i];
    record.image_row = image_rows[i];
    record.answer_type = answer_types[i];
    record.question_type =
        question_types[i] >= 0 && question_types[i] < static_cast<int64_t>(question_types_.size())
            ? question_types_[question_types[i]]
            : "";
    record.question_text = questions[i];
    record.answer_text = answers[i];
    record.image_name =
        hdf5_read_strings(image_names_.get(), image_rows[i], 1, prefix + kImageNames, path_).at(0);
    for (int64_t t = 0; t < length; ++t) {
      if (mask[i * length + t]) record.token_ids.push_back(tokens[i * length + t]);
    }
    for (int64_t m = 0; m < max_targets_; ++m) {
      if (labels[i * max_targets_ + m] >= 0) {
        record.labels.push_back(labels[i * max_targets_ + m]);
        record.scores.push_back(scores[i * max_targets_ + m]);
      }
    }
  }
  return records;
}

}  // namespace vqa::data
