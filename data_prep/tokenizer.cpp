#include "tokenizer.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include "data/dataset_format.h"  // kPadToken, kUnknownToken, kClassToken

namespace vqa::prep {

std::vector<std::string> WordTokenizer::split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (unsigned char c : text) {
    // Bytes >= 0x80 belong to UTF-8 letters: keep them inside words.
    if (std::isalnum(c) || c >= 0x80) {
      word.push_back(static_cast<char>(std::tolower(c)));
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

std::unique_ptr<WordTokenizer> WordTokenizer::build(const std::vector<std::string>& texts,
                                                    int64_t min_count) {
  std::map<std::string, int64_t> counts;
  for (const auto& text : texts) {
    for (auto& word : split_words(text)) ++counts[word];
  }
  std::vector<std::pair<std::string, int64_t>> words(counts.begin(), counts.end());
  std::stable_sort(words.begin(), words.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  auto tokenizer = std::unique_ptr<WordTokenizer>(new WordTokenizer());
  tokenizer->vocabulary_ = {"<pad>", "<unk>", "<cls>"};
  for (const auto& [word, count] : words) {
    if (count >= min_count) tokenizer->vocabulary_.push_back(word);
  }
  for (size_t id = data::kClassToken + 1; id < tokenizer->vocabulary_.size(); ++id) {
    tokenizer->sorted_ids_.emplace_back(tokenizer->vocabulary_[id], static_cast<int32_t>(id));
  }
  std::sort(tokenizer->sorted_ids_.begin(), tokenizer->sorted_ids_.end());
  return tokenizer;
}

std::vector<int32_t> WordTokenizer::encode(const std::string& text, int64_t max_length) const {
  std::vector<int32_t> ids{data::kClassToken};
  for (const auto& word : split_words(text)) {
    if (static_cast<int64_t>(ids.size()) >= max_length) break;
    auto it =
        std::lower_bound(sorted_ids_.begin(), sorted_ids_.end(), std::make_pair(word, int32_t{-1}));
    ids.push_back(it != sorted_ids_.end() && it->first == word ? it->second : data::kUnknownToken);
  }
  if (static_cast<int64_t>(ids.size()) > max_length) ids.resize(static_cast<size_t>(max_length));
  return ids;
}

}  // namespace vqa::prep
