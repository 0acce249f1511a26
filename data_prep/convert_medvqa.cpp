#include "convert_medvqa.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "answer_text.h"          // answer_normalize, text_collapse_whitespace
#include "data/dataset_format.h"  // DataFormatError, kAnswerTypeOpen

namespace vqa::prep {

namespace fs = std::filesystem;

namespace {

std::string read_whole(const std::string& file) {
  std::ifstream stream(file, std::ios::binary);
  if (!stream) throw data::DataFormatError(file + ": cannot open the VQA-Med question file");
  std::ostringstream text;
  text << stream.rdbuf();
  if (!stream.good() && !stream.eof()) {
    throw data::DataFormatError(file + ": cannot read the VQA-Med question file");
  }
  return text.str();
}

std::vector<std::string> split_on(const std::string& text, char separator) {
  std::vector<std::string> pieces;
  size_t begin = 0;
  for (;;) {
    const size_t end = text.find(separator, begin);
    pieces.push_back(
        text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return pieces;
    begin = end + 1;
  }
}

std::string upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

RecordSplit records_read_medvqa2019(const std::string& root, const std::string& split,
                                    int64_t& next_qid, RecordProblems& problems) {
  RecordSplit result;
  const fs::path split_dir = fs::path(root) / split;
  const std::string image_dir = (split_dir / "images").string();
  for (const char* category : kMedVqa2019Categories) {
    const std::string file = (split_dir / "QA" / (std::string(category) + ".csv")).string();
    std::string text = read_whole(file);
    // As M3AE: the file's surrounding whitespace stripped, then one question per line.
    const size_t first = text.find_first_not_of(" \t\r\n\f\v");
    if (first == std::string::npos) {
      throw data::DataFormatError(file + ": empty: expected lines image_id|question|answer");
    }
    text = text.substr(first, text.find_last_not_of(" \t\r\n\f\v") - first + 1);
    std::unordered_map<std::string, size_t> first_line;  // image_id -> line
    const std::vector<std::string> lines = split_on(text, '\n');
    for (size_t i = 0; i < lines.size(); ++i) {
      const int64_t qid = next_qid++;
      const size_t line = i + 1;
      auto bad = [&](const std::string& field, const std::string& message) {
        problems.report_at(file, "line " + std::to_string(line), "", field, message);
      };
      std::string content = lines[i];
      if (!content.empty() && content.back() == '\r') content.pop_back();  // CRLF files
      const std::vector<std::string> fields = split_on(content, '|');
      static const char* kNames[] = {"image_id", "question", "answer"};
      if (fields.size() != 3) {
        bad(fields.size() < 3 ? kNames[fields.size()] : "(line)",
            fields.size() < 3 ? "is missing (expected image_id|question|answer)"
                              : "has " + std::to_string(fields.size()) +
                                    " fields, expected 3 (image_id|question|answer)");
        continue;
      }
      const std::string image_id = text_collapse_whitespace(fields[0]);
      if (image_id.empty()) {
        bad("image_id", "is empty");
        continue;
      }
      if (text_collapse_whitespace(fields[1]).empty()) {
        bad("question", "is empty");
        continue;
      }
      Record record;
      record.file = file;
      record.index = i;
      record.qid = qid;
      record.image_name = image_id + ".jpg";
      std::string error;
      record.image_path = image_resolve_path(image_dir, record.image_name, error);
      if (!error.empty()) {
        bad("image_id", "'" + image_id + "': " + error);
        continue;
      }
      if (!fs::is_regular_file(record.image_path)) {
        bad("image_id", "'" + image_id + "': no image " + record.image_path);
        continue;
      }
      auto [seen, inserted] = first_line.emplace(image_id, line);
      if (!inserted) {
        bad("image_id", "duplicate image_id '" + image_id + "' (first at line " +
                            std::to_string(seen->second) + ")");
        continue;
      }
      record.raw_question = fields[1];
      record.question = text_collapse_whitespace(fields[1]);
      record.answer = text_collapse_whitespace(fields[2]);
      record.normalized_answer = answer_normalize(record.answer);
      if (record.normalized_answer.empty()) {
        bad("answer", "'" + fields[2] + "' is empty after normalisation");
        continue;
      }
      record.answer_type = data::kAnswerTypeOpen;
      record.question_type = upper(category);
      result.first_seen.emplace(qid, file + " line " + std::to_string(line));
      result.records.push_back(std::move(record));
    }
  }
  return result;
}

}  // namespace vqa::prep
