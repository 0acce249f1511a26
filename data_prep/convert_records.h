// The JSON side of `vqa_prep convert`: VQA-RAD and SLAKE style records, parsed
// and checked field by field, and the answer label set built from them.
// Needs nlohmann-json and the C++ library only (no OpenCV, HDF5 or LibTorch),
// so the fuzz target links it alone.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace vqa::prep {

// One question as convert keeps it.
struct Record {
  std::string file;  // the JSON file it came from
  size_t index = 0;  // its position in that file's top-level array
  int64_t qid = 0;
  std::string image_name, image_path, question, answer, normalized_answer, question_type;
  // The question exactly as the JSON has it: what the RoBERTa BPE reads (M3AE
  // hands the raw string to RobertaTokenizerFast). `question` is trimmed
  // with inner whitespace collapsed: the word tokenizer's input and the
  // text stored for reports.
  std::string raw_question;
  int answer_type = 0;  // data::kAnswerTypeClosed or kAnswerTypeOpen
};

struct RecordOptions {
  std::string image_dir;        // image_path = image_dir / image_name (checked to stay inside)
  bool features = false;        // names are looked up in a features file: no image_path
  std::string language = "en";  // SLAKE's q_lang; records of other languages are left out
  bool strict = false;          // throw on the first bad record instead of skipping it
};

// Bad records: reported on stderr with file, record and field, skipped and
// counted; with `strict` the first one throws DataFormatError.
class RecordProblems {
 public:
  explicit RecordProblems(bool strict) : strict_(strict) {}
  void report(const std::string& file, size_t index, const std::string& qid,
              const std::string& field, const std::string& message);
  // The same with the place as text ("line 12").
  void report_at(const std::string& file, const std::string& where, const std::string& qid,
                 const std::string& field, const std::string& message);
  int64_t count() const { return count_; }

 private:
  bool strict_;
  int64_t count_ = 0;
};

// The records of one split, gathered over its JSON files.
struct RecordSplit {
  std::vector<Record> records;
  std::unordered_map<int64_t, std::string> first_seen;  // qid -> "file record i"
  int64_t other_language = 0;
};

// Parses `text`, the contents of the JSON file `file` (a top-level array of
// record objects), and appends its usable records to `split`; a qid seen
// before in the split is a bad record. Throws DataFormatError naming `file`
// when the text is not such an array.
void records_parse_json(const std::string& text, const std::string& file,
                        const RecordOptions& options, RecordProblems& problems, RecordSplit& split);

// Reads and parses every file of a split, in order.
RecordSplit records_read_split(const std::vector<std::string>& files, const RecordOptions& options,
                               RecordProblems& problems);

// The answer label set: normalised answers by frequency, then alphabetically
// (deterministic ids).
std::vector<std::string> records_build_labels(
    const std::vector<const std::vector<Record>*>& sources);

// The file for `image_name` inside `image_dir`, or an error text (empty on
// success) when the name is empty, absolute or leaves the folder ("..", a
// symlink pointing out).
std::string image_resolve_path(const std::string& image_dir, const std::string& image_name,
                               std::string& error);

}  // namespace vqa::prep
