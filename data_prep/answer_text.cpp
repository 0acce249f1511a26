#include "answer_text.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

namespace vqa::prep {

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

std::string answer_normalize_m3ae(const std::string& answer) {
  // The table as M3AE's preprocessing has it.
  // clang-format off
  static const std::map<std::string, std::string> kContractions = {
      {"'ow'sat", "'ow's'at"}, {"'ows'at", "'ow's'at"}, {"I'dve", "I'd've"}, {"Id've", "I'd've"},
      {"Im", "I'm"}, {"Ive", "I've"}, {"aint", "ain't"}, {"arent", "aren't"}, {"cant", "can't"},
      {"couldn'tve", "couldn't've"}, {"couldnt", "couldn't"}, {"couldnt've", "couldn't've"},
      {"couldve", "could've"}, {"didnt", "didn't"}, {"doesnt", "doesn't"}, {"dont", "don't"},
      {"hadn'tve", "hadn't've"}, {"hadnt", "hadn't"}, {"hadnt've", "hadn't've"}, {"hasnt", "hasn't"},
      {"havent", "haven't"}, {"he'dve", "he'd've"}, {"hed", "he'd"}, {"hed've", "he'd've"},
      {"hes", "he's"}, {"howd", "how'd"}, {"howll", "how'll"}, {"hows", "how's"}, {"isnt", "isn't"},
      {"it'dve", "it'd've"}, {"itd", "it'd"}, {"itd've", "it'd've"}, {"itll", "it'll"},
      {"let's", "let's"}, {"maam", "ma'am"}, {"mightn'tve", "mightn't've"}, {"mightnt", "mightn't"},
      {"mightnt've", "mightn't've"}, {"mightve", "might've"}, {"mustnt", "mustn't"},
      {"mustve", "must've"}, {"neednt", "needn't"}, {"notve", "not've"}, {"oclock", "o'clock"},
      {"oughtnt", "oughtn't"}, {"ow's'at", "'ow's'at"}, {"shant", "shan't"}, {"she'dve", "she'd've"},
      {"she's", "she's"}, {"shed've", "she'd've"}, {"shouldn'tve", "shouldn't've"},
      {"shouldnt", "shouldn't"}, {"shouldnt've", "shouldn't've"}, {"shouldve", "should've"},
      {"somebody'd", "somebodyd"}, {"somebody'dve", "somebody'd've"},
      {"somebodyd've", "somebody'd've"}, {"somebodyll", "somebody'll"}, {"somebodys", "somebody's"},
      {"someone'dve", "someone'd've"}, {"someoned", "someone'd"}, {"someoned've", "someone'd've"},
      {"someonell", "someone'll"}, {"someones", "someone's"}, {"something'dve", "something'd've"},
      {"somethingd", "something'd"}, {"somethingd've", "something'd've"},
      {"somethingll", "something'll"}, {"thats", "that's"}, {"there'dve", "there'd've"},
      {"thered", "there'd"}, {"thered've", "there'd've"}, {"therere", "there're"},
      {"theres", "there's"}, {"they'dve", "they'd've"}, {"theyd", "they'd"},
      {"theyd've", "they'd've"}, {"theyll", "they'll"}, {"theyre", "they're"}, {"theyve", "they've"},
      {"twas", "'twas"}, {"wasnt", "wasn't"}, {"we'dve", "we'd've"}, {"wed've", "we'd've"},
      {"werent", "weren't"}, {"weve", "we've"}, {"whatll", "what'll"}, {"whatre", "what're"},
      {"whats", "what's"}, {"whatve", "what've"}, {"whens", "when's"}, {"whered", "where'd"},
      {"wheres", "where's"}, {"whereve", "where've"}, {"who'dve", "who'd've"}, {"whod", "who'd"},
      {"whod've", "who'd've"}, {"wholl", "who'll"}, {"whos", "who's"}, {"whove", "who've"},
      {"whyll", "why'll"}, {"whyre", "why're"}, {"whys", "why's"}, {"wont", "won't"},
      {"wouldn'tve", "wouldn't've"}, {"wouldnt", "wouldn't"}, {"wouldnt've", "wouldn't've"},
      {"wouldve", "would've"}, {"y'all'dve", "y'all'd've"}, {"y'alld've", "y'all'd've"},
      {"y'allll", "y'all'll"}, {"yall", "y'all"}, {"yall'd've", "y'all'd've"},
      {"yall'll", "y'all'll"}, {"you'dve", "you'd've"}, {"youd", "you'd"}, {"youd've", "you'd've"},
      {"youll", "you'll"}, {"youre", "you're"}, {"youve", "you've"}};
  // clang-format on
  static const std::map<std::string, std::string> kNumberWords = {
      {"none", "0"}, {"zero", "0"}, {"one", "1"},   {"two", "2"},   {"three", "3"}, {"four", "4"},
      {"five", "5"}, {"six", "6"},  {"seven", "7"}, {"eight", "8"}, {"nine", "9"},  {"ten", "10"}};
  static const std::string kPunctuation = ";/[]\"{}()=+\\_-><@`,?!";
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::string token;
  for (unsigned char c : answer) token.push_back(static_cast<char>(std::tolower(c)));
  bool digit_comma_digit = false;
  for (size_t i = 1; i + 1 < token.size(); ++i) {
    digit_comma_digit |= token[i] == ',' && is_digit(token[i - 1]) && is_digit(token[i + 1]);
  }
  // Which marks are deleted and which become spaces is decided on the
  // answer as given; the replacements apply one mark after another.
  std::string replaced = token;
  for (const char mark : kPunctuation) {
    const bool next_to_space = token.find(std::string{mark, ' '}) != std::string::npos ||
                               token.find(std::string{' ', mark}) != std::string::npos;
    std::string next;
    for (const char c : replaced) {
      if (c != mark) {
        next.push_back(c);
      } else if (!next_to_space && !digit_comma_digit) {
        next.push_back(' ');
      }
    }
    replaced = std::move(next);
  }
  std::string stripped;
  int removed = 0;
  for (size_t i = 0; i < replaced.size(); ++i) {
    const bool digit_follows = i + 1 < replaced.size() && is_digit(replaced[i + 1]);
    if (replaced[i] == '.' && !digit_follows && removed < 32) {
      ++removed;
      continue;
    }
    stripped.push_back(replaced[i]);
  }
  std::istringstream words(stripped);
  std::string word, result;
  while (words >> word) {
    if (auto number = kNumberWords.find(word); number != kNumberWords.end()) word = number->second;
    if (word == "a" || word == "an" || word == "the") continue;
    if (auto full = kContractions.find(word); full != kContractions.end()) word = full->second;
    result += (result.empty() ? "" : " ") + word;
  }
  result.erase(std::remove(result.begin(), result.end(), ','), result.end());
  return result;
}

}  // namespace vqa::prep
