// A tiny RoBERTa-style tokenizer folder for tests: vocab.json with <s>,
// <pad>, </s>, <unk>, GPT-2's byte characters (computed here, independently
// of data_prep's table) except those of the bytes 0xF0..0xFF (so 4-byte
// UTF-8 characters such as emoji become <unk>), and a few merges that make
// whole words of the fixture's questions.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace vqa::testing {

struct TinyRoberta {
  std::string vocab_json, merges_txt;
  nlohmann::json vocab;  // token -> id
  int id(const std::string& token) const { return vocab.at(token).get<int>(); }
};

// GPT-2's printable character for `byte`, as UTF-8.
inline std::string tiny_roberta_byte_character(int byte) {
  int code_point = byte;
  const auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  if (!printable(byte)) {
    int n = 0;
    for (int b = 0; b < byte; ++b) n += printable(b) ? 0 : 1;
    code_point = 256 + n;
  }
  std::string text;
  if (code_point < 0x80) {
    text.push_back(static_cast<char>(code_point));
  } else {
    text.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    text.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return text;
}

// specials_first: <s>, <pad>, </s>, <unk> at 0, 1, 2, 3 as in roberta-base;
// otherwise after everything else (the ids must be read, not assumed).
inline TinyRoberta tiny_roberta_write(const std::string& dir, bool specials_first = true) {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"I", "s"},           {"\xC4\xA0", "t"},     {"h", "e"},          {"\xC4\xA0t", "he"},
      {"\xC4\xA0the", "r"}, {"\xC4\xA0ther", "e"}, {"\xC4\xA0", "a"},   {"\xC4\xA0", "m"},
      {"a", "s"},           {"\xC4\xA0m", "as"},   {"\xC4\xA0mas", "s"}};
  std::vector<std::string> tokens;
  const std::vector<std::string> specials = {"<s>", "<pad>", "</s>", "<unk>"};
  if (specials_first) tokens = specials;
  for (int byte = 0; byte < 0xF0; ++byte) tokens.push_back(tiny_roberta_byte_character(byte));
  for (const auto& [left, right] : merges) tokens.push_back(left + right);
  if (!specials_first) tokens.insert(tokens.end(), specials.begin(), specials.end());
  TinyRoberta tiny;
  tiny.vocab_json = dir + "/vocab.json";
  tiny.merges_txt = dir + "/merges.txt";
  tiny.vocab = nlohmann::json::object();
  for (size_t i = 0; i < tokens.size(); ++i) tiny.vocab[tokens[i]] = static_cast<int>(i);
  std::ofstream(tiny.vocab_json) << tiny.vocab.dump();
  std::ofstream merges_file(tiny.merges_txt);
  merges_file << "#version: 0.2\n";
  for (const auto& [left, right] : merges) merges_file << left << ' ' << right << '\n';
  return tiny;
}

}  // namespace vqa::testing
