// Text handling for the prep tool: the question tokenizer (behind an
// interface, so that a RoBERTa BPE tokenizer can be added next to the word
// one) and the answer normalisation of the VQA evaluation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vqa::prep {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Stored in the file's `tokenizer` attribute.
  virtual std::string kind() const = 0;
  // Token id -> token; ids 0, 1, 2 are <pad>, <unk>, <cls> (data/format.h).
  virtual const std::vector<std::string>& vocabulary() const = 0;
  // <cls> followed by the question's tokens, truncated to max_length ids.
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
  const std::vector<std::string>& vocabulary() const override { return vocabulary_; }
  std::vector<int32_t> encode(const std::string& text, int64_t max_length) const override;

 private:
  std::vector<std::string> vocabulary_;
  std::vector<std::pair<std::string, int32_t>> sorted_ids_;  // for lookup by word
};

// The VQA evaluation's answer normalisation: lower case, punctuation
// removed (kept inside numbers such as 1,000 or 2.5), number words to
// digits, articles dropped, whitespace collapsed. "The X-ray." -> "x ray".
std::string answer_normalize(const std::string& answer);

// Trimmed, with inner runs of whitespace collapsed to one space.
std::string text_collapse_whitespace(const std::string& text);

}  // namespace vqa::prep
