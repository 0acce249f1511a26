// RoBERTa's tokenizer (GPT-2's byte-level BPE) from the two files of a
// Hugging Face tokenizer folder, vocab.json and merges.txt, encoding as
// RobertaTokenizerFast(text, truncation=True, max_length=L) does: <s>, the
// BPE ids, </s>; no lower-casing.
//
// Pre-tokenisation is GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched with PCRE2 (UTF-8; \p{L} and \p{N} from PCRE2's Unicode tables),
// with \s read as Unicode's White_Space property, as Hugging Face's
// tokenizers (Oniguruma) and Python's `regex` module read it: U+0009..U+000D,
// U+0020, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F,
// U+205F, U+3000. (JavaScript's \s differs in two characters: it adds U+FEFF
// and leaves out U+0085.) Each piece's UTF-8 bytes become GPT-2's printable
// byte characters, merges apply lowest rank first, and the resulting tokens
// are looked up in vocab.json (a token it lacks becomes <unk>).
//
// Thread-safe after construction (encode is const and keeps no state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer.h"  // Tokenizer

namespace vqa::prep {

// The byte-level BPE alone, without special tokens.
class ByteLevelBpe {
 public:
  // Reads vocab.json (a JSON object token -> id, ids 0..V-1 each once) and
  // merges.txt (an optional "#version" line, then one "left right" pair per
  // line, lowest rank first; both parts and their concatenation must be in
  // the vocabulary). Throws DataFormatError naming the file, the line or
  // token and the value.
  ByteLevelBpe(const std::string& vocab_json, const std::string& merges_txt);
  ~ByteLevelBpe();
  ByteLevelBpe(const ByteLevelBpe&) = delete;
  ByteLevelBpe& operator=(const ByteLevelBpe&) = delete;

  // The pattern's pieces of `text`, in order; they concatenate to `text`.
  // Throws DataFormatError when `text` is not valid UTF-8.
  std::vector<std::string> pre_tokenize(const std::string& text) const;
  // The BPE ids of `text`; a token outside the vocabulary becomes
  // `unknown_id`, or throws DataFormatError when that is negative.
  std::vector<int32_t> encode(const std::string& text, int32_t unknown_id = -1) const;

  const std::vector<std::string>& vocabulary() const { return vocabulary_; }
  // The id of `token`, or -1.
  int32_t find(const std::string& token) const;
  // "<sha256 of vocab.json> <sha256 of merges.txt>", as sha256sum prints them.
  const std::string& files_sha256() const { return files_sha256_; }
  // The Unicode version of PCRE2's tables (what \p{L} and \p{N} know), e.g. "14.0.0".
  static std::string unicode_version();

 private:
  // The merged tokens of one piece, already mapped to byte characters.
  std::vector<std::string> merge(std::vector<std::string> symbols) const;

  struct Pattern;  // the compiled PCRE2 pattern
  std::unique_ptr<Pattern> pattern_;
  std::vector<std::string> vocabulary_;                   // id -> token
  std::unordered_map<std::string, int32_t> ids_;          // token -> id
  std::unordered_map<std::string, int32_t> merge_ranks_;  // "left right" -> rank
  std::vector<std::string> byte_characters_;              // byte -> its UTF-8 character
  std::string files_sha256_;
};

class RobertaTokenizer : public Tokenizer {
 public:
  // The vocabulary must hold <s>, <pad>, </s> and <unk> (their ids are read
  // from it, not assumed). Throws DataFormatError.
  RobertaTokenizer(const std::string& vocab_json, const std::string& merges_txt);

  std::string kind() const override;
  const std::vector<std::string>& vocabulary() const override { return bpe_.vocabulary(); }
  data::SpecialTokenIds special_tokens() const override { return special_; }
  std::string source_sha256() const override { return bpe_.files_sha256(); }
  // <s>, the first max_length - 2 BPE ids, </s>.
  std::vector<int32_t> encode(const std::string& text, int64_t max_length) const override;

 private:
  ByteLevelBpe bpe_;
  data::SpecialTokenIds special_;
};

}  // namespace vqa::prep
