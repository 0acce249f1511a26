#include "roberta_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "data/dataset_format.h"  // DataFormatError, kMaxVocabulary, kTokenizerRoberta
#include "sha256.h"               // sha256_hex

namespace vqa::prep {

namespace {

// Unicode's White_Space property as a PCRE2 class body: what \s means to the
// reference implementations (see the header).
#define VQA_WHITE_SPACE                                                                          \
  "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}" \
  "\\x{3000}"
constexpr const char* kPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" VQA_WHITE_SPACE
    "\\p{L}\\p{N}]+"
    "|[" VQA_WHITE_SPACE "]+(?![^" VQA_WHITE_SPACE "])|[" VQA_WHITE_SPACE "]+";
#undef VQA_WHITE_SPACE

std::string pcre2_message(int code) {
  PCRE2_UCHAR text[256];
  if (pcre2_get_error_message(code, text, sizeof(text)) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(text);
}

std::string read_file(const std::string& path, const std::string& option) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw data::DataFormatError(path + ": no such file (" + option + ")");
  }
  std::ifstream file(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << file.rdbuf();
  if (!file && !file.eof()) throw data::DataFormatError(path + ": cannot read it (" + option + ")");
  return bytes.str();
}

std::string utf8_encode(uint32_t code_point) {
  std::string text;
  if (code_point < 0x80) {
    text.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    text.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    text.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    text.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    text.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    text.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return text;
}

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for
// themselves, the other 68 for U+0100.. in byte order, so that every token
// is printable text without spaces.
std::vector<std::string> byte_characters() {
  std::vector<std::string> characters(256);
  uint32_t next = 256;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                           (byte >= 0xAE && byte <= 0xFF);
    characters[byte] = utf8_encode(printable ? byte : next++);
  }
  return characters;
}

std::string json_quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

struct ByteLevelBpe::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }
};

ByteLevelBpe::~ByteLevelBpe() = default;

ByteLevelBpe::ByteLevelBpe(const std::string& vocab_json, const std::string& merges_txt)
    : pattern_(std::make_unique<Pattern>()), byte_characters_(byte_characters()) {
  int code = 0;
  PCRE2_SIZE offset = 0;
  pattern_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF, &code, &offset, nullptr);
  if (!pattern_->code) {
    throw std::logic_error("pcre2_compile of GPT-2's pattern at offset " + std::to_string(offset) +
                           ": " + pcre2_message(code));
  }

  const std::string vocab_text = read_file(vocab_json, "--vocab-json");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::exception& e) {
    throw data::DataFormatError(vocab_json + ": malformed JSON: " + e.what());
  }
  if (!vocab.is_object() || vocab.empty()) {
    throw data::DataFormatError(vocab_json +
                                ": expected a JSON object of token -> id (a tokenizer's "
                                "vocab.json), found " +
                                (vocab.is_object() ? "an empty object" : vocab.type_name()));
  }
  if (vocab.size() > static_cast<size_t>(data::kMaxVocabulary)) {
    throw data::DataFormatError(vocab_json + ": " + std::to_string(vocab.size()) +
                                " tokens, more than " + std::to_string(data::kMaxVocabulary));
  }
  const auto size = static_cast<int64_t>(vocab.size());
  vocabulary_.resize(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, value] : vocab.items()) {
    const int64_t id = value.is_number_integer() ? value.get<int64_t>() : -1;
    if (id < 0 || id >= size) {
      throw data::DataFormatError(vocab_json + ": token " + json_quoted(token) + ": id " +
                                  value.dump() + " is not an integer in [0, " +
                                  std::to_string(size) +
                                  ") (ids must be 0..V-1 for the file's V tokens, each once)");
    }
    if (seen[static_cast<size_t>(id)]) {
      throw data::DataFormatError(vocab_json + ": id " + std::to_string(id) + " is given to both " +
                                  json_quoted(vocabulary_[id]) + " and " + json_quoted(token));
    }
    seen[static_cast<size_t>(id)] = true;
    vocabulary_[static_cast<size_t>(id)] = token;
    ids_.emplace(token, static_cast<int32_t>(id));
  }

  const std::string merges_text = read_file(merges_txt, "--merges-txt");
  std::istringstream lines(merges_text);
  std::string line;
  int64_t line_number = 0, rank = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      throw data::DataFormatError(merges_txt + ": line " + std::to_string(line_number) + ": " +
                                  json_quoted(line) +
                                  " is not a merge (two tokens separated by one space)");
    }
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    for (const std::string& token : {left, right, left + right}) {
      if (!ids_.count(token)) {
        throw data::DataFormatError(merges_txt + ": line " + std::to_string(line_number) +
                                    ": token " + json_quoted(token) + " is not in " + vocab_json +
                                    " (are the two files of the same tokenizer?)");
      }
    }
    if (rank == INT32_MAX) throw data::DataFormatError(merges_txt + ": too many merges");
    // A repeated merge takes its last rank, as GPT-2's and Hugging Face's code do.
    merge_ranks_[line] = static_cast<int32_t>(rank++);
  }
  files_sha256_ = sha256_hex(vocab_text) + " " + sha256_hex(merges_text);
}

std::string ByteLevelBpe::unicode_version() {
  PCRE2_UCHAR text[64] = {};
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, text) < 0) return "unknown";
  return reinterpret_cast<const char*>(text);
}

int32_t ByteLevelBpe::find(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<std::string> ByteLevelBpe::pre_tokenize(const std::string& text) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(pattern_->code, nullptr), &pcre2_match_data_free);
  if (!match) throw std::bad_alloc();
  std::vector<std::string> pieces;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int result =
        pcre2_match(pattern_->code, subject, text.size(), offset, 0, match.get(), nullptr);
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match.get());
    if (result <= PCRE2_ERROR_UTF8_ERR1 && result >= PCRE2_ERROR_UTF8_ERR21) {
      throw data::DataFormatError("text " + json_quoted(text) + " is not valid UTF-8 at byte " +
                                  std::to_string(pcre2_get_startchar(match.get())) + ": " +
                                  pcre2_message(result));
    }
    // Every character matches one alternative, so the pieces tile the text.
    if (result < 0 || range[0] != offset || range[1] <= offset) {
      throw std::logic_error("GPT-2's pattern left a gap at byte " + std::to_string(offset) +
                             " of " + json_quoted(text) + ": " + pcre2_message(result));
    }
    pieces.push_back(text.substr(offset, range[1] - offset));
    offset = range[1];
  }
  return pieces;
}

std::vector<std::string> ByteLevelBpe::merge(std::vector<std::string> symbols) const {
  // GPT-2's loop: merge every occurrence of the lowest-ranked adjacent pair,
  // left to right, until no adjacent pair is a merge.
  std::string key;
  while (symbols.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      key.assign(symbols[i]).append(" ").append(symbols[i + 1]);
      auto it = merge_ranks_.find(key);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    const std::string left = symbols[best], right = symbols[best + 1];
    std::vector<std::string> merged;
    merged.reserve(symbols.size());
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
        merged.push_back(left + right);
        ++i;
      } else {
        merged.push_back(std::move(symbols[i]));
      }
    }
    symbols = std::move(merged);
  }
  return symbols;
}

std::vector<int32_t> ByteLevelBpe::encode(const std::string& text, int32_t unknown_id) const {
  std::vector<int32_t> ids;
  for (const std::string& piece : pre_tokenize(text)) {
    std::vector<std::string> symbols;
    symbols.reserve(piece.size());
    for (unsigned char byte : piece) symbols.push_back(byte_characters_[byte]);
    for (const std::string& token : merge(std::move(symbols))) {
      const int32_t id = find(token);
      if (id < 0 && unknown_id < 0) {
        throw data::DataFormatError("token " + json_quoted(token) + " of " + json_quoted(text) +
                                    " is not in the vocabulary, which has no <unk>");
      }
      ids.push_back(id >= 0 ? id : unknown_id);
    }
  }
  return ids;
}

RobertaTokenizer::RobertaTokenizer(const std::string& vocab_json, const std::string& merges_txt)
    : bpe_(vocab_json, merges_txt) {
  for (auto [token, id] : {std::pair{"<pad>", &special_.pad}, std::pair{"<s>", &special_.cls},
                           std::pair{"</s>", &special_.eos}, std::pair{"<unk>", &special_.unk}}) {
    *id = bpe_.find(token);
    if (*id < 0) {
      throw data::DataFormatError(
          vocab_json + ": has no " + token +
          " token; --tokenizer roberta needs <s>, <pad>, </s> and <unk> in vocab.json (a "
          "RoBERTa tokenizer's has them at 0, 1, 2, 3; GPT-2's encoder.json has none)");
    }
  }
}

std::string RobertaTokenizer::kind() const { return data::kTokenizerRoberta; }

std::vector<int32_t> RobertaTokenizer::encode(const std::string& text, int64_t max_length) const {
  std::vector<int32_t> bpe = bpe_.encode(text, static_cast<int32_t>(special_.unk));
  const auto room = static_cast<size_t>(std::max<int64_t>(0, max_length - 2));
  if (bpe.size() > room) bpe.resize(room);
  std::vector<int32_t> ids;
  ids.reserve(bpe.size() + 2);
  ids.push_back(static_cast<int32_t>(special_.cls));
  ids.insert(ids.end(), bpe.begin(), bpe.end());
  ids.push_back(static_cast<int32_t>(special_.eos));
  return ids;
}

}  // namespace vqa::prep
