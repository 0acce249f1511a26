// The on-disk VQA format shared by the writer (data_prep) and the reader
// (loader): names, version and the limits a reader checks before it
// allocates anything. data_prep/FORMAT.md describes the layout for people.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vqa::data {

// The version this build writes; bump on any change an older reader would
// misread. Version 2 records the tokenizer's special token ids (a RoBERTa
// vocabulary has <s> = 0, <pad> = 1: version 1 fixed <pad> = 0, <cls> = 2),
// the image normalisation and the tokenizer files' SHA-256. Readers accept
// kOldestFormatVersion..kFormatVersion; a version-1 file reads as the word
// tokenizer with ids 0, 1, 2 and no end token. Version 3 may hold a split's
// source images (kSourcePixels ...), which the loader's random resized crop
// cuts from; a version-2 file reads as one without them.
constexpr int64_t kFormatVersion = 3;
constexpr int64_t kOldestFormatVersion = 1;
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
constexpr const char* kAttrTokenizer = "tokenizer";  // kTokenizerWord | kTokenizerRoberta
constexpr const char* kAttrCreatedBy = "created_by";
// Since version 2.
constexpr const char* kAttrPadTokenId = "pad_token_id";  // int64: padding after the question
constexpr const char* kAttrClsTokenId = "cls_token_id";  // int64: first token (<cls>, <s>)
constexpr const char* kAttrEosTokenId = "eos_token_id";  // int64: last real token (</s>), -1 none
constexpr const char* kAttrUnkTokenId = "unk_token_id";  // int64: out-of-vocabulary token
constexpr const char* kAttrTokenizerSha256 = "tokenizer_sha256";        // string, see FORMAT.md
constexpr const char* kAttrImageNormalization = "image_normalization";  // kNormalization*
// Optional, any version: how the answers became labels. A reader that does
// not know them reads the file as before, so they need no version; a file
// without them (older than these names) reads as "" (not recorded).
constexpr const char* kAttrAnswerNormalization = "answer_normalization";  // "vqa" | "m3ae"
constexpr const char* kAttrAnswerLabelSet = "answer_label_set";  // "train" | "train+test" ...

constexpr const char* kTokenizerWord = "word";
constexpr const char* kTokenizerRoberta = "roberta";

// What image_mean/image_std are: the training images' statistics, CLIP's
// constants, or nothing to undo (features: mean 0, std 1).
constexpr const char* kNormalizationDataset = "dataset";
constexpr const char* kNormalizationClip = "clip";
constexpr const char* kNormalizationNone = "none";
// OpenAI CLIP's per-channel mean and std (RGB, [0, 1] units), which M3AE uses.
constexpr double kClipMean[3] = {0.48145466, 0.4578275, 0.40821073};
constexpr double kClipStd[3] = {0.26862954, 0.26130258, 0.27577711};

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
// Since version 3, optional: the decoded source images, RGB interleaved,
// image after image (image i: offsets[i] .. + height x width x 3 bytes).
constexpr const char* kSourceImages = "source_images";           // the group
constexpr const char* kSourcePixels = "source_images/pixels";    // uint8 [total bytes]
constexpr const char* kSourceOffsets = "source_images/offsets";  // int64 [n_images]
constexpr const char* kSourceShapes = "source_images/shapes";    // int32 [n_images, 2]: h, w

constexpr int kAnswerTypeClosed = 0;
constexpr int kAnswerTypeOpen = 1;

// The word tokenizer's special token ids (and every version-1 file's). Other
// tokenizers record theirs (kAttr*TokenId; DatasetInfo::special_tokens).
constexpr int32_t kPadToken = 0;
constexpr int32_t kUnknownToken = 1;
constexpr int32_t kClassToken = 2;  // first token of every question; the text encoder pools it

// Upper bounds a reader checks before it allocates: a corrupt header must give
// an error, not a multi-gigabyte allocation.
constexpr int64_t kMaxAnswers = 1'000'000;
constexpr int64_t kMaxVocabulary = 10'000'000;
constexpr int64_t kMaxQuestionLength = 4096;
constexpr int64_t kMaxImageSize = 4096;
constexpr int64_t kMaxSourceImageSide = 16384;             // a source image's height and width
constexpr int64_t kMaxFeatureElements = int64_t{1} << 24;  // tokens x dim per image
constexpr int64_t kMaxTargetsPerQuestion = 64;

// A malformed or unreadable dataset file, or bad prep input. The message names
// the file, the dataset/attribute/field and the offending value.
class DataFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace vqa::data
