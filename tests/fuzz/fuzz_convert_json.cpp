// Fuzz target: `vqa_prep convert`'s JSON side. The input's first byte picks
// the options (strict, features, language, tokenizer settings), the rest is
// the text of one JSON file. The records that survive go through the rest of
// convert that needs no images: the label set, the tokenizer and encoding.
// Checked: a refusal is a DataFormatError naming the file; every kept record
// satisfies what convert relies on; answer normalisation is idempotent.
#include <filesystem>
#include <set>

#include "answer_text.h"      // answer_normalize, answer_normalize_m3ae, text_collapse_whitespace
#include "convert_records.h"  // records_parse_json, records_build_labels
#include "data/dataset_format.h"  // DataFormatError, kClassToken, kAnswerType*
#include "fuzz_support.h"         // fuzz_require, fuzz_scratch_path
#include "tokenizer.h"            // WordTokenizer

namespace {

using vqa::fuzz::fuzz_require;
namespace prep = vqa::prep;

const std::string& image_folder() {
  static const std::string folder = [] {
    const std::string path = vqa::fuzz::fuzz_scratch_path("images");
    std::filesystem::create_directories(path);
    return path;
  }();
  return folder;
}

void check_records(const prep::RecordSplit& split, const prep::RecordOptions& options) {
  std::set<int64_t> qids;
  for (const prep::Record& record : split.records) {
    const std::string where = "record " + std::to_string(record.index) + ": ";
    fuzz_require(qids.insert(record.qid).second, where + "duplicate qid kept");
    fuzz_require(!record.question.empty(), where + "empty question kept");
    fuzz_require(prep::text_collapse_whitespace(record.question) == record.question,
                 where + "question not collapsed");
    fuzz_require(!record.image_name.empty(), where + "empty image name kept");
    fuzz_require(!record.normalized_answer.empty(), where + "empty answer kept");
    fuzz_require(prep::answer_normalize(record.normalized_answer) == record.normalized_answer,
                 where + "answer_normalize is not idempotent on '" + record.normalized_answer +
                     "' (from '" + record.answer + "')");
    fuzz_require(record.answer_type == vqa::data::kAnswerTypeClosed ||
                     record.answer_type == vqa::data::kAnswerTypeOpen,
                 where + "answer type");
    if (!options.features) {
      fuzz_require(record.image_path.rfind(options.image_dir + "/", 0) == 0,
                   where + "image path '" + record.image_path + "' outside the image folder");
    }
  }
  fuzz_require(static_cast<int64_t>(qids.size()) == static_cast<int64_t>(split.first_seen.size()),
               "first_seen and kept records disagree");
}

void check_labels_and_tokens(const prep::RecordSplit& split, int64_t min_count,
                             int64_t max_length) {
  const auto labels = prep::records_build_labels({&split.records});
  fuzz_require(std::set<std::string>(labels.begin(), labels.end()).size() == labels.size(),
               "duplicate answer labels");
  fuzz_require(labels.size() <= split.records.size(), "more labels than records");
  std::vector<std::string> questions;
  for (const prep::Record& record : split.records) questions.push_back(record.question);
  const auto tokenizer = prep::WordTokenizer::build(questions, min_count);
  const auto vocabulary_size = static_cast<int32_t>(tokenizer->vocabulary().size());
  fuzz_require(vocabulary_size > vqa::data::kClassToken, "vocabulary without special tokens");
  for (const std::string& question : questions) {
    const std::vector<int32_t> ids = tokenizer->encode(question, max_length);
    fuzz_require(!ids.empty() && ids[0] == vqa::data::kClassToken, "first token is not <cls>");
    fuzz_require(static_cast<int64_t>(ids.size()) <= max_length, "encoding longer than max_length");
    for (int32_t id : ids) fuzz_require(id >= 0 && id < vocabulary_size, "token id out of range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  prep::RecordOptions options;
  options.image_dir = image_folder();
  options.strict = flags & 1;
  options.features = flags & 2;
  options.language = flags & 4 ? "zh" : "en";
  const int64_t min_count = 1 + ((flags >> 3) & 1);
  const int64_t max_length = 2 + ((flags >> 4) & 15);  // 2..17, convert allows 2..4096
  const std::string file = "fuzz.json";
  prep::RecordProblems problems(options.strict);
  prep::RecordSplit split;
  try {
    prep::records_parse_json(text, file, options, problems, split);
  } catch (const vqa::data::DataFormatError& e) {
    const std::string message = e.what();
    fuzz_require(message.rfind(file + ": ", 0) == 0, "error without the file name: " + message);
    return 0;
  }
  check_records(split, options);
  check_labels_and_tokens(split, min_count, max_length);
  return 0;
}
