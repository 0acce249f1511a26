// DatasetReader's checks of the file's root attributes and vocabularies
// (format version, sizes, normalisation, tokenizer and its special ids),
// before any split is opened. The rest of the reader is dataset_reader.cpp.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "data/dataset_reader.h"  // DatasetReader
#include "data/hdf5_util.h"       // number_text, hdf5_read_* helpers

namespace vqa::data {

void DatasetReader::validate_header() {
  const hid_t root = file_.get();
  mark(std::string("attribute '") + kAttrFormat + "'");
  const std::string format = hdf5_read_string_attribute(root, kAttrFormat, path_);
  if (format != kFormatName) fail("attribute 'format'", "is '" + format + "', expected 'vqa-hpc'");
  mark(std::string("attribute '") + kAttrFormatVersion + "'");
  const int64_t version = hdf5_read_int_attribute(root, kAttrFormatVersion, path_);
  if (version < kOldestFormatVersion || version > kFormatVersion) {
    fail("attribute 'format_version'",
         "is " + std::to_string(version) + ", this build reads versions " +
             std::to_string(kOldestFormatVersion) + ".." + std::to_string(kFormatVersion));
  }
  info_.format_version = version;
  mark(std::string("attribute '") + kAttrImageStorage + "'");
  const std::string storage = hdf5_read_string_attribute(root, kAttrImageStorage, path_);
  if (storage != "pixels" && storage != "features") {
    fail("attribute 'image_storage'", "is '" + storage + "', expected 'pixels' or 'features'");
  }
  info_.has_features = storage == "features";
  mark(std::string("attribute '") + kAttrImageSize + "'");
  info_.image_size = hdf5_read_int_attribute(root, kAttrImageSize, path_);
  if (info_.has_features ? info_.image_size != 0
                         : (info_.image_size < 1 || info_.image_size > kMaxImageSize)) {
    fail("attribute 'image_size'",
         "is " + std::to_string(info_.image_size) +
             (info_.has_features ? ", expected 0 with features"
                                 : ", expected 1.." + std::to_string(kMaxImageSize)));
  }
  mark(std::string("attribute '") + kAttrImageMean + "'");
  info_.image_mean = hdf5_read_double_attribute(root, kAttrImageMean, path_);
  mark(std::string("attribute '") + kAttrImageStd + "'");
  info_.image_std = hdf5_read_double_attribute(root, kAttrImageStd, path_);
  if (info_.image_mean.size() != 3 || info_.image_std.size() != 3) {
    fail("attributes 'image_mean'/'image_std'",
         "need 3 values each, found " + std::to_string(info_.image_mean.size()) + " and " +
             std::to_string(info_.image_std.size()));
  }
  for (size_t c = 0; c < 3; ++c) {
    if (!std::isfinite(info_.image_mean[c])) {
      fail("attribute 'image_mean'", "channel " + std::to_string(c) + " is " +
                                         number_text(info_.image_mean[c]) +
                                         ", expected a finite number");
    }
    if (!(info_.image_std[c] > 0.0) || !std::isfinite(info_.image_std[c])) {
      fail("attribute 'image_std'", "channel " + std::to_string(c) + " is " +
                                        number_text(info_.image_std[c]) +
                                        ", expected a number > 0");
    }
  }
  mark(std::string("attribute '") + kAttrMaxQuestionLength + "'");
  info_.max_question_length = hdf5_read_int_attribute(root, kAttrMaxQuestionLength, path_);
  if (info_.max_question_length < 1 || info_.max_question_length > kMaxQuestionLength) {
    fail("attribute 'max_question_length'", "is " + std::to_string(info_.max_question_length) +
                                                ", expected 1.." +
                                                std::to_string(kMaxQuestionLength));
  }
  mark(std::string("attribute '") + kAttrNumAnswers + "'");
  info_.num_answers = hdf5_read_int_attribute(root, kAttrNumAnswers, path_);
  if (info_.num_answers < 1 || info_.num_answers > kMaxAnswers) {
    fail("attribute 'num_answers'", "is " + std::to_string(info_.num_answers) + ", expected 1.." +
                                        std::to_string(kMaxAnswers));
  }
  mark(std::string("attribute '") + kAttrTokenizer + "'");
  info_.tokenizer = hdf5_read_string_attribute(root, kAttrTokenizer, path_);
  validate_version2_header();
  // Optional: files written before these attributes read as "" (not recorded).
  for (auto [name, value] : {std::pair{kAttrCreatedBy, &info_.created_by},
                             std::pair{kAttrAnswerNormalization, &info_.answer_normalization},
                             std::pair{kAttrAnswerLabelSet, &info_.answer_label_set}}) {
    mark(std::string("attribute '") + name + "'");
    const htri_t exists = H5Aexists(root, name);
    if (exists < 0) fail(std::string("attribute '") + name + "'", "cannot be read");
    if (exists > 0) *value = hdf5_read_string_attribute(root, name, path_);
  }

  std::vector<int64_t> shape;
  Hdf5Id answers = open_checked(kAnswerVocabulary, {"string"}, {info_.num_answers}, &shape);
  mark(std::string("dataset '") + kAnswerVocabulary + "' (its strings)");
  info_.answer_labels = hdf5_read_strings(answers.get(), 0, shape[0], kAnswerVocabulary, path_);
  Hdf5Id tokens = open_checked(kTokenVocabulary, {"string"}, {-1}, &shape);
  if (shape[0] <= kClassToken || shape[0] > kMaxVocabulary) {
    fail(std::string("dataset '") + kTokenVocabulary + "'",
         "has " + std::to_string(shape[0]) + " entries, expected " +
             std::to_string(kClassToken + 1) + ".." + std::to_string(kMaxVocabulary));
  }
  mark(std::string("dataset '") + kTokenVocabulary + "' (its strings)");
  tokens_ = hdf5_read_strings(tokens.get(), 0, shape[0], kTokenVocabulary, path_);
  info_.vocab_size = shape[0];
  validate_special_tokens();
  Hdf5Id types = open_checked(kQuestionTypeVocabulary, {"string"}, {-1}, &shape);
  if (shape[0] > kMaxAnswers)
    fail(kQuestionTypeVocabulary, "has " + std::to_string(shape[0]) + " entries");
  mark(std::string("dataset '") + kQuestionTypeVocabulary + "' (its strings)");
  question_types_ = hdf5_read_strings(types.get(), 0, shape[0], kQuestionTypeVocabulary, path_);
  info_.question_types = question_types_;
}

void DatasetReader::validate_version2_header() {
  const hid_t root = file_.get();
  if (info_.format_version < 2) {
    // Version 1 knew only the word tokenizer and normalised with the training images.
    info_.special_tokens = SpecialTokenIds{};
    info_.image_normalization = info_.has_features ? kNormalizationNone : kNormalizationDataset;
    return;
  }
  if (info_.tokenizer != kTokenizerWord && info_.tokenizer != kTokenizerRoberta) {
    fail("attribute 'tokenizer'", "is '" + info_.tokenizer + "', expected '" + kTokenizerWord +
                                      "' or '" + kTokenizerRoberta + "'");
  }
  for (auto [name, id] : {std::pair{kAttrPadTokenId, &info_.special_tokens.pad},
                          std::pair{kAttrClsTokenId, &info_.special_tokens.cls},
                          std::pair{kAttrEosTokenId, &info_.special_tokens.eos},
                          std::pair{kAttrUnkTokenId, &info_.special_tokens.unk}}) {
    mark(std::string("attribute '") + name + "'");
    *id = hdf5_read_int_attribute(root, name, path_);
  }
  mark(std::string("attribute '") + kAttrTokenizerSha256 + "'");
  info_.tokenizer_sha256 = hdf5_read_string_attribute(root, kAttrTokenizerSha256, path_);
  mark(std::string("attribute '") + kAttrImageNormalization + "'");
  info_.image_normalization = hdf5_read_string_attribute(root, kAttrImageNormalization, path_);
  const std::string& kind = info_.image_normalization;
  if (kind != kNormalizationDataset && kind != kNormalizationClip && kind != kNormalizationNone) {
    fail("attribute 'image_normalization'",
         "is '" + kind + "', expected '" + kNormalizationDataset + "', '" + kNormalizationClip +
             "' or '" + kNormalizationNone + "'");
  }
}

void DatasetReader::validate_special_tokens() {
  const SpecialTokenIds& ids = info_.special_tokens;
  const int64_t size = info_.vocab_size;
  const std::vector<std::tuple<const char*, int64_t, int64_t>> roles = {
      {kAttrPadTokenId, ids.pad, 0},
      {kAttrClsTokenId, ids.cls, 0},
      {kAttrEosTokenId, ids.eos, -1},
      {kAttrUnkTokenId, ids.unk, 0}};
  for (size_t i = 0; i < roles.size(); ++i) {
    const auto& [name, id, lowest] = roles[i];
    if (id < lowest || id >= size) {
      fail(std::string("attribute '") + name + "'",
           "is " + std::to_string(id) + ", outside [" + std::to_string(lowest) + ", " +
               std::to_string(size) + ") (the size of " + kTokenVocabulary + ")");
    }
    for (size_t j = 0; j < i; ++j) {
      if (id >= 0 && id == std::get<1>(roles[j])) {
        fail(std::string("attribute '") + name + "'",
             "is " + std::to_string(id) + ", the same token as '" + std::get<0>(roles[j]) + "'");
      }
    }
  }
}

}  // namespace vqa::data
