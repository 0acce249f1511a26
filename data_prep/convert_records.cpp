#include "convert_records.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "answer_text.h"          // answer_normalize, text_collapse_whitespace
#include "data/dataset_format.h"  // DataFormatError, kAnswerType*

namespace vqa::prep {

namespace fs = std::filesystem;

void RecordProblems::report(const std::string& file, size_t index, const std::string& qid,
                            const std::string& field, const std::string& message) {
  report_at(file, "record " + std::to_string(index), qid, field, message);
}

void RecordProblems::report_at(const std::string& file, const std::string& where,
                               const std::string& qid, const std::string& field,
                               const std::string& message) {
  const std::string text = file + ": " + where + (qid.empty() ? "" : " (qid " + qid + ")") +
                           ": field '" + field + "': " + message;
  if (strict_) throw data::DataFormatError(text + " (--strict)");
  std::fprintf(stderr, "vqa_prep convert: skipping %s\n", text.c_str());
  ++count_;
}

namespace {

// The text of a scalar JSON value: a string as it is, a number, boolean or
// null as JSON writes it. Arrays and objects have none (false): a field that
// holds one is a bad record. (Writing them out recursed once per nesting
// level: a deeply nested answer overflowed the stack.)
bool json_scalar_text(const nlohmann::json& value, std::string& text) {
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_number_integer()) {
    text = std::to_string(value.get<int64_t>());
  } else if (value.is_structured()) {
    text.clear();
    return false;
  } else {
    text = value.dump();
  }
  return true;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string upper_trimmed(const std::string& text) {
  std::string result = text_collapse_whitespace(text);
  for (char& c : result) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return result;
}

// One record, or false when it is bad (reported) or in another language.
bool parse_record(const nlohmann::json& item, const std::string& file, size_t index,
                  const RecordOptions& options, RecordProblems& problems, Record& record,
                  int64_t& other_language) {
  if (!item.is_object()) {
    problems.report(file, index, "", "(record)", "is not a JSON object");
    return false;
  }
  std::string qid_text;
  const bool qid_scalar = !item.contains("qid") || json_scalar_text(item["qid"], qid_text);
  auto bad = [&](const std::string& field, const std::string& message) {
    problems.report(file, index, qid_text, field, message);
    return false;
  };
  if (item.contains("q_lang")) {
    std::string language;
    if (!json_scalar_text(item["q_lang"], language)) {
      return bad("q_lang",
                 std::string("is an ") + item["q_lang"].type_name() + ", expected a string");
    }
    if (language != options.language) {
      ++other_language;
      return false;
    }
  }
  record.file = file;
  record.index = index;
  if (!item.contains("qid")) return bad("qid", "is missing");
  if (!qid_scalar)
    return bad("qid", std::string("is an ") + item["qid"].type_name() + ", not an integer");
  const auto& qid = item["qid"];
  if (qid.is_number_integer()) {
    record.qid = qid.get<int64_t>();
  } else if (qid.is_string() && !qid_text.empty() && qid_text.size() < 19 &&
             std::all_of(qid_text.begin(), qid_text.end(), is_digit)) {
    record.qid = std::stoll(qid_text);
  } else {
    return bad("qid", "'" + qid_text + "' is not an integer");
  }
  const char* image_field = item.contains("image_name") ? "image_name" : "img_name";
  if (!item.contains(image_field) || !item[image_field].is_string()) {
    return bad("image_name", "is missing or not a string (VQA-RAD: image_name, SLAKE: img_name)");
  }
  record.image_name = item[image_field].get<std::string>();
  std::string error;
  if (!options.features) {
    record.image_path = image_resolve_path(options.image_dir, record.image_name, error);
  } else {
    // Features are looked up by name, but a name that escapes is bad input all the same.
    image_resolve_path(".", record.image_name, error);
  }
  if (!error.empty()) return bad(image_field, error);
  if (!item.contains("question") || !item["question"].is_string() ||
      text_collapse_whitespace(item["question"].get<std::string>()).empty()) {
    return bad("question", "is missing or empty");
  }
  record.raw_question = item["question"].get<std::string>();
  record.question = text_collapse_whitespace(record.raw_question);
  if (!item.contains("answer") || item["answer"].is_null()) return bad("answer", "is missing");
  if (!json_scalar_text(item["answer"], record.answer)) {
    return bad("answer", std::string("is an ") + item["answer"].type_name() +
                             ", expected a string or number");
  }
  record.answer = text_collapse_whitespace(record.answer);
  record.normalized_answer = answer_normalize(record.answer);
  if (record.normalized_answer.empty()) {
    return bad("answer", "'" + record.answer + "' is empty after normalisation");
  }
  std::string type;
  if (item.contains("answer_type") && !json_scalar_text(item["answer_type"], type)) {
    return bad("answer_type", std::string("is an ") + item["answer_type"].type_name() +
                                  ", expected CLOSED or OPEN");
  }
  type = upper_trimmed(type);
  if (type == "CLOSED") {
    record.answer_type = data::kAnswerTypeClosed;
  } else if (type == "OPEN") {
    record.answer_type = data::kAnswerTypeOpen;
  } else {
    return bad("answer_type", "unknown value '" + type + "' (expected CLOSED or OPEN)");
  }
  for (const char* field : {"question_type", "content_type"}) {
    if (item.contains(field)) {
      if (!json_scalar_text(item[field], record.question_type)) {
        return bad(field, std::string("is an ") + item[field].type_name() + ", expected a string");
      }
      record.question_type = upper_trimmed(record.question_type);
      break;
    }
  }
  return true;
}

}  // namespace

void records_parse_json(const std::string& text, const std::string& file,
                        const RecordOptions& options, RecordProblems& problems,
                        RecordSplit& split) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw data::DataFormatError(file + ": malformed JSON: " + e.what());
  }
  if (!document.is_array()) {
    throw data::DataFormatError(file +
                                ": malformed JSON: the top level must be an array of records");
  }
  for (size_t index = 0; index < document.size(); ++index) {
    Record record;
    if (!parse_record(document[index], file, index, options, problems, record,
                      split.other_language)) {
      continue;
    }
    const std::string where = file + " record " + std::to_string(index);
    auto [it, inserted] = split.first_seen.emplace(record.qid, where);
    if (!inserted) {
      problems.report(
          file, index, std::to_string(record.qid), "qid",
          "duplicate qid " + std::to_string(record.qid) + " (first at " + it->second + ")");
      continue;
    }
    split.records.push_back(std::move(record));
  }
}

RecordSplit records_read_split(const std::vector<std::string>& files, const RecordOptions& options,
                               RecordProblems& problems) {
  RecordSplit split;
  for (const std::string& file : files) {
    std::ifstream stream(file, std::ios::binary);
    if (!stream) throw data::DataFormatError(file + ": cannot open the JSON file");
    std::ostringstream text;
    text << stream.rdbuf();
    if (!stream.good() && !stream.eof())
      throw data::DataFormatError(file + ": cannot read the JSON file");
    records_parse_json(text.str(), file, options, problems, split);
  }
  return split;
}

// Label set: answers by frequency, then alphabetically (deterministic ids).
std::vector<std::string> records_build_labels(
    const std::vector<const std::vector<Record>*>& sources) {
  std::map<std::string, int64_t> counts;
  for (const auto* records : sources) {
    for (const Record& r : *records) ++counts[r.normalized_answer];
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::string> labels;
  for (const auto& entry : sorted) labels.push_back(entry.first);
  return labels;
}

std::string image_resolve_path(const std::string& image_dir, const std::string& image_name,
                               std::string& error) {
  error.clear();
  const fs::path name(image_name);
  if (image_name.empty()) {
    error = "is empty";
    return "";
  }
  if (name.is_absolute() || name.has_root_directory() || name.has_root_name()) {
    error = "'" + image_name + "' is an absolute path; it must be relative to the image folder";
    return "";
  }
  for (const auto& component : name) {
    if (component == "..") {
      error = "'" + image_name + "' contains '..' and would escape the image folder";
      return "";
    }
  }
  const fs::path full = fs::path(image_dir) / name;
  // A symlink inside the folder may still point out of it.
  std::error_code code;
  const fs::path folder = fs::weakly_canonical(image_dir, code);
  const fs::path resolved = fs::weakly_canonical(full, code);
  if (!code) {
    const auto mismatch =
        std::mismatch(folder.begin(), folder.end(), resolved.begin(), resolved.end());
    if (mismatch.first != folder.end()) {
      error =
          "'" + image_name + "' resolves to " + resolved.string() + ", outside the image folder";
      return "";
    }
  }
  return full.string();
}

}  // namespace vqa::prep
