// The on-disk VQA format shared by the writer (data_prep) and the reader
// (loader): names, version and the limits a reader checks before it
// allocates anything. data_prep/FORMAT.md describes the layout for people.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vqa::data {

// Bump on any change a version-1 reader would misread.
constexpr int64_t kFormatVersion = 1;
constexpr const char* kFormatName = "vqa-hpc";

// Root attributes.
constexpr const char* kAttrFormat = "format";
constexpr const char* kAttrFormatVersion = "format_version";
constexpr const char* kAttrImageStorage = "image_storage";  // "pixels" | "features"
constexpr const char* kAttrImageSize = "image_size";
constexpr const char* kAttrImageMean = "image_mean";  // float64[3], pixel values in [0, 1]
constexpr const char* kAttrImageStd = "image_std";
constexpr const char* kAttrMaxQuestionLength = "max_question_length";
constexpr const char* kAttrNumAnswers = "num_answers";
constexpr const char* kAttrTokenizer = "tokenizer";
constexpr const char* kAttrCreatedBy = "created_by";

// Vocabularies (variable-length UTF-8 strings), shared by every split.
constexpr const char* kAnswerVocabulary = "/vocab/answers";
constexpr const char* kTokenVocabulary = "/vocab/tokens";
constexpr const char* kQuestionTypeVocabulary = "/vocab/question_types";

// Datasets inside a split group ("/train", "/test").
constexpr const char* kImages = "images";                 // uint8 [n_images, 3, S, S]
constexpr const char* kFeatures = "features";             // float16|float32 [n_images, T, D]
constexpr const char* kImageNames = "image_names";        // string [n_images]
constexpr const char* kTokenIds = "questions/token_ids";  // int32 [n_q, L]
constexpr const char* kAttentionMask = "questions/attention_mask";  // uint8 [n_q, L]
constexpr const char* kImageRow = "questions/image_row";            // int32 [n_q]
constexpr const char* kAnswerType = "questions/answer_type";        // uint8 [n_q]
constexpr const char* kQuestionId = "questions/question_id";        // int64 [n_q]
constexpr const char* kQuestionType = "questions/question_type";    // int32 [n_q]
constexpr const char* kQuestionText = "questions/question_text";    // string [n_q]
constexpr const char* kAnswerText = "questions/answer_text";        // string [n_q]
constexpr const char* kTargetLabels = "targets/labels";             // int32 [n_q, M], -1 = none
constexpr const char* kTargetScores = "targets/scores";             // float32 [n_q, M]

constexpr int kAnswerTypeClosed = 0;
constexpr int kAnswerTypeOpen = 1;

// Token ids with a fixed meaning in every tokenizer's vocabulary.
constexpr int32_t kPadToken = 0;
constexpr int32_t kUnknownToken = 1;
constexpr int32_t kClassToken = 2;  // first token of every question; the text encoder pools it

// Upper bounds a reader checks before it allocates: a corrupt header must give
// an error, not a multi-gigabyte allocation.
constexpr int64_t kMaxAnswers = 1'000'000;
constexpr int64_t kMaxVocabulary = 10'000'000;
constexpr int64_t kMaxQuestionLength = 4096;
constexpr int64_t kMaxImageSize = 4096;
constexpr int64_t kMaxFeatureElements = int64_t{1} << 24;  // tokens x dim per image
constexpr int64_t kMaxTargetsPerQuestion = 64;

// A malformed or unreadable dataset file, or bad prep input. The message names
// the file, the dataset/attribute/field and the offending value.
class DataFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace vqa::data
