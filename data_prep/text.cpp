#include "text.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include "data/format.h"  // kPadToken, kUnknownToken, kClassToken

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

std::string text_collapse_whitespace(const std::string& text) {
  std::istringstream words(text);
  std::string word, result;
  while (words >> word) result += (result.empty() ? "" : " ") + word;
  return result;
}

std::string answer_normalize(const std::string& answer) {
  static const std::map<std::string, std::string> kNumberWords = {
      {"none", "0"}, {"zero", "0"}, {"one", "1"},   {"two", "2"},   {"three", "3"}, {"four", "4"},
      {"five", "5"}, {"six", "6"},  {"seven", "7"}, {"eight", "8"}, {"nine", "9"},  {"ten", "10"}};
  std::string lower;
  for (unsigned char c : answer) lower.push_back(static_cast<char>(std::tolower(c)));
  // Punctuation: kept between digits (1,000 and 2.5), otherwise a space; an
  // apostrophe is dropped so that "it's" stays one word.
  std::string cleaned;
  for (size_t i = 0; i < lower.size(); ++i) {
    const unsigned char c = lower[i];
    if (std::isalnum(c) || std::isspace(c) || c >= 0x80) {
      cleaned.push_back(static_cast<char>(c));
      continue;
    }
    const bool between_digits = (c == ',' || c == '.') && i > 0 && i + 1 < lower.size() &&
                                std::isdigit(static_cast<unsigned char>(lower[i - 1])) &&
                                std::isdigit(static_cast<unsigned char>(lower[i + 1]));
    if (between_digits) {
      if (c == '.') cleaned.push_back('.');  // 1,000 -> 1000; 2.5 stays
    } else if (c != '\'') {
      cleaned.push_back(' ');
    }
  }
  std::istringstream words(cleaned);
  std::string word, result;
  while (words >> word) {
    if (word == "a" || word == "an" || word == "the") continue;
    auto number = kNumberWords.find(word);
    result += (result.empty() ? "" : " ") + (number != kNumberWords.end() ? number->second : word);
  }
  return result;
}

}  // namespace vqa::prep
