// The question tokenizer interface of the prep tool and the word tokenizer
// of the classic medical VQA baselines (the RoBERTa one is in
// roberta_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset_info.h"  // SpecialTokenIds

namespace vqa::prep {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Stored in the file's `tokenizer` attribute (data::kTokenizer*).
  virtual std::string kind() const = 0;
  // Token id -> token.
  virtual const std::vector<std::string>& vocabulary() const = 0;
  // The ids of <pad>, <cls>, the end token (-1: none) and <unk> in vocabulary().
  virtual data::SpecialTokenIds special_tokens() const = 0;
  // What the file records of the tokenizer's source files (FORMAT.md); empty
  // when the vocabulary comes from the questions themselves.
  virtual std::string source_sha256() const { return ""; }
  // The question's ids, at most max_length (>= 2) of them, without padding:
  // <cls>, the question's tokens, and the end token when there is one (kept
  // last when the question is truncated).
  virtual std::vector<int32_t> encode(const std::string& text, int64_t max_length) const = 0;
};

// Word-level tokenizer of the classic medical VQA baselines: lower case,
// words are runs of letters and digits, vocabulary from the training
// questions (words seen fewer than min_count times become <unk>), ordered by
// frequency then alphabetically so that the same questions give the same ids.
class WordTokenizer : public Tokenizer {
 public:
  static std::unique_ptr<WordTokenizer> build(const std::vector<std::string>& training_texts,
                                              int64_t min_count = 1);
  static std::vector<std::string> split_words(const std::string& text);

  std::string kind() const override { return "word"; }
  // ids 0, 1, 2 are <pad>, <unk>, <cls> (data/dataset_format.h); no end token.
  const std::vector<std::string>& vocabulary() const override { return vocabulary_; }
  data::SpecialTokenIds special_tokens() const override { return {}; }
  std::vector<int32_t> encode(const std::string& text, int64_t max_length) const override;

 private:
  std::vector<std::string> vocabulary_;
  std::vector<std::pair<std::string, int32_t>> sorted_ids_;  // for lookup by word
};

}  // namespace vqa::prep
