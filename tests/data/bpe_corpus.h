// The BPE parity test's corpus, generated deterministically (SplitMix64):
// medical questions in VQA-RAD's and SLAKE's styles, contractions,
// punctuation and digit runs, whitespace runs, letters, numbers, marks,
// symbols and emoji of many scripts, control characters, and long inputs.
//
// Every character drawn is assigned, with the same general category, in
// Unicode 14 (PCRE2 10.42's tables) and 15.1 (Node 20's ICU). U+0085 and
// U+FEFF are never drawn: they are the two characters on which
// JavaScript's \s differs from Unicode's White_Space, which vqa_prep follows
// as Hugging Face's tokenizers do (test_tokenizer.cpp checks those two).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/splitmix64.h"  // SplitMix64

namespace vqa::testing {

namespace bpe_corpus_detail {

struct Range {
  uint32_t first, last;
};

inline const std::vector<Range> kLetters = {
    {'a', 'z'},       {'A', 'Z'},       {0xC0, 0xD6},     {0xD8, 0xF6},     {0xF8, 0xFF},
    {0x100, 0x17F},   {0x391, 0x3A1},   {0x3A3, 0x3A9},   {0x3B1, 0x3C9},   {0x410, 0x44F},
    {0x5D0, 0x5EA},   {0x627, 0x64A},   {0x905, 0x939},   {0xE01, 0xE2E},   {0x3041, 0x3096},
    {0x30A1, 0x30FA}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7A3}, {0xFF21, 0xFF3A}, {0x20000, 0x2A6D6}};
inline const std::vector<Range> kNumbers = {{'0', '9'},       {0xB2, 0xB3},     {0xB9, 0xB9},
                                            {0xBC, 0xBE},     {0x660, 0x669},   {0x966, 0x96F},
                                            {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089},
                                            {0x2160, 0x216B}, {0x2460, 0x2473}, {0xFF10, 0xFF19}};
inline const std::vector<Range> kMarks = {
    {0x300, 0x36F}, {0x93E, 0x94C}, {0xE31, 0xE31}, {0xFE0F, 0xFE0F}, {0x200D, 0x200D}};
inline const std::vector<Range> kSymbols = {
    {'!', '/'},        {':', '@'},         {'[', '`'},         {'{', '~'},
    {0xA1, 0xA9},      {0xAB, 0xB1},       {0xB4, 0xB4},       {0xB6, 0xB8},
    {0xBB, 0xBB},      {0xBF, 0xBF},       {0xD7, 0xD7},       {0xF7, 0xF7},
    {0x2010, 0x2027},  {0x2030, 0x205E},   {0x2103, 0x2103},   {0x2190, 0x21FF},
    {0x2200, 0x22FF},  {0x2600, 0x26FF},   {0x3001, 0x3003},   {0x300C, 0x300F},
    {0xFF01, 0xFF0F},  {0x1F1E6, 0x1F1FF}, {0x1F300, 0x1F5FF}, {0x1F3FB, 0x1F3FF},
    {0x1F600, 0x1F64F}};
// Plain spaces three times as often as each other kind.
inline const std::vector<Range> kWhiteSpace = {{' ', ' '},       {' ', ' '},       {' ', ' '},
                                               {'\t', '\r'},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                               {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                               {0x205F, 0x205F}, {0x3000, 0x3000}};
inline const std::vector<Range> kControls = {{0x1, 0x8}, {0xE, 0x1F}, {0x7F, 0x84}, {0x86, 0x9F}};

inline std::string utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

class Generator {
 public:
  explicit Generator(uint64_t seed) : random_(seed) {}
  size_t below(size_t n) { return static_cast<size_t>(random_.below(n)); }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[below(items.size())];
  }
  uint32_t from(const Range& range) {
    return range.first + static_cast<uint32_t>(below(range.last - range.first + 1));
  }
  std::string run(const std::vector<Range>& ranges, size_t length, bool one_range) {
    std::string text;
    const Range* range = &pick(ranges);
    for (size_t i = 0; i < length; ++i) {
      if (!one_range) range = &pick(ranges);
      text += utf8(from(*range));
    }
    return text;
  }
  // One piece of mixed text: a word (maybe with marks), a number, symbols,
  // white space, a contraction or a control character.
  std::string segment() {
    switch (below(9)) {
      case 0:
      case 1: {
        std::string word = run(kLetters, 1 + below(10), /*one_range=*/true);
        if (chance(25)) word += run(kMarks, 1 + below(2), false);
        if (chance(20)) word += run(kLetters, 1 + below(4), true);
        return word;
      }
      case 2:
        return run(kNumbers, 1 + below(6), chance(70));
      case 3:
        return run(kSymbols, 1 + below(4), chance(50));
      case 4:
      case 5:
        return run(kWhiteSpace, 1 + below(chance(80) ? 2 : 6), false);
      case 6:
        return pick(std::vector<std::string>{"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
                                             "'LL", "\xE2\x80\x99s", "'", "''"});
      case 7:
        return chance(50) ? run(kControls, 1, false) : run(kMarks, 1, false);
      default:
        return run(kLetters, 1 + below(3), false) + run(kNumbers, 1 + below(3), false);
    }
  }
  std::string mixed(size_t segments) {
    std::string text;
    for (size_t i = 0; i < segments; ++i) text += segment();
    return text;
  }

 private:
  util::SplitMix64 random_;
};

inline std::string medical_question(Generator& g) {
  static const std::vector<std::string> findings = {"mass",
                                                    "pneumothorax",
                                                    "pleural effusion",
                                                    "cardiomegaly",
                                                    "fracture",
                                                    "nodule",
                                                    "hemorrhage",
                                                    "edema",
                                                    "consolidation",
                                                    "calcification",
                                                    "air-fluid level",
                                                    "free air",
                                                    "atelectasis",
                                                    "hydronephrosis",
                                                    "ring-enhancing lesion",
                                                    "infarct",
                                                    "cyst",
                                                    "abscess"};
  static const std::vector<std::string> places = {"left lung",
                                                  "right upper lobe",
                                                  "liver",
                                                  "spleen",
                                                  "kidneys",
                                                  "brain",
                                                  "left hemisphere",
                                                  "aorta",
                                                  "bowel",
                                                  "gallbladder",
                                                  "C5-C6 disc space",
                                                  "mediastinum",
                                                  "pancreas",
                                                  "L4\xE2\x80\x93L5 level",
                                                  "patient's chest",
                                                  "sella turcica",
                                                  "orbits",
                                                  "thyroid"};
  static const std::vector<std::string> modalities = {
      "CT", "MRI", "x-ray", "X-Ray", "ultrasound", "PET/CT", "T2 FLAIR", "DWI", "CXR", "MR"};
  static const std::vector<std::string> numbers = {
      "3.5", "12", "0.8", "1,200", "95%", "2", "10\xC2\xB0", "4x4", "1/3", "3\xC2\xA0mm"};
  const std::string f = g.pick(findings), p = g.pick(places), p2 = g.pick(places),
                    m = g.pick(modalities), n = g.pick(numbers);
  const std::vector<std::string> templates = {
      "Is there " + f + " in the " + p + "?",
      "What is the modality of this image, " + m + "?",
      "Where is the " + f + " located?",
      "Is the " + f + " on the left or right side?",
      "How many " + f + "s are seen?",
      "Which organ is abnormal, the " + p + " or the " + p2 + "?",
      "What's the size of the " + f + " (" + n + " cm)?",
      "Is this a T" + std::to_string(1 + g.below(2)) + "-weighted " + m + " of the " + p + "?",
      "IS THERE " + f + " IN THE " + p + "?",
      "is there evidence of " + f + "?",
      "What abnormality is seen in the " + p + " on this " + m + "?",
      "Was the contrast given IV or PO?",
      "Is the " + f + " > " + n + "mm?",
      "Isn't the " + p + " enlarged?",
      "Where's the NG tube?  ",
      "The " + f + " is  hyper- or hypo-dense?",
      "Does the " + m + " show " + f + ", " + f + " and " + f + "?",
      "\xE5\x9B\xBE\xE5\x83\x8F\xE4\xB8\xAD\xE6\x9C\x89" + f + "\xE5\x90\x97\xEF\xBC\x9F",
      "Qu'est-ce que la l\xC3\xA9sion du " + p + " ?",
  };
  std::string question = g.pick(templates);
  if (g.chance(10)) question = " " + question;
  if (g.chance(10)) question += "\n";
  return question;
}

}  // namespace bpe_corpus_detail

// VQA-RAD's questions as its JSON has them, which M3AE tokenises untouched:
// trailing, leading and double spaces, tabs inside words, newlines, CRLF.
// In the corpus, and converted by test_prep_m3ae.cpp.
inline const std::vector<std::string> kWhitespaceQuestions = {
    "Are there two kidneys? ",
    " Is/Are the right hemidiaphragm normal?",
    "Are there abnormalities  near the liver?",
    "Is the liver \tsplee n enlarged?",
    "Is this an\nMRI?\n",
    "\tWhat organ is this?\r\n",
    "Is there a   mass  ?  ",
    "What  is\t\tthe plane?",
    "  Which side?"};

inline std::vector<std::string> bpe_corpus() {
  using namespace bpe_corpus_detail;
  Generator g(20240611);
  std::vector<std::string> corpus = {"",
                                     " ",
                                     "  ",
                                     "\n",
                                     "\t\t",
                                     "\r\n",
                                     "a",
                                     "A",
                                     "'",
                                     "'s",
                                     "''s",
                                     "'s's",
                                     " 's",
                                     "a's",
                                     "I'm",
                                     "don't",
                                     "'ll",
                                     "they're",
                                     "we've",
                                     "you'd",
                                     "It'S",
                                     "rock'n'roll",
                                     "O'Brien's",
                                     "patients' films",
                                     "it\xE2\x80\x99s",
                                     std::string("a\0b", 3),
                                     "\xF0\x9F\x98\x80",
                                     "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
                                     "\xF0\x9F\x91\xA8\xE2\x80\x8D\xE2\x9A\x95\xEF\xB8\x8F",
                                     "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
                                     ",,,,",
                                     ",,,,,,,,,,",
                                     ",\",\",",
                                     "...",
                                     "!!!???",
                                     "--->",
                                     "1,000,000",
                                     "3.14159",
                                     "12345678901234567890",
                                     "v1.2.3",
                                     "e.g.",
                                     "x-ray's"};
  for (int i = 0; i < 450; ++i) corpus.push_back(medical_question(g));
  for (int i = 0; i < 200; ++i) {  // words between runs of white space
    std::string text = g.chance(30) ? g.run(kWhiteSpace, 1 + g.below(4), false) : "";
    const size_t words = 1 + g.below(6);
    for (size_t w = 0; w < words; ++w) {
      text += g.run(kLetters, 1 + g.below(8), true);
      if (w + 1 < words || g.chance(30)) text += g.run(kWhiteSpace, 1 + g.below(5), false);
    }
    corpus.push_back(text);
  }
  for (int i = 0; i < 200; ++i) {  // punctuation and digits, with a few letters
    std::string text;
    const size_t pieces = 1 + g.below(8);
    for (size_t p = 0; p < pieces; ++p) {
      switch (g.below(4)) {
        case 0:
          text += g.run({{'!', '/'}, {':', '@'}, {'[', '`'}, {'{', '~'}}, 1 + g.below(10), true);
          break;
        case 1:
          text += g.run({{'0', '9'}}, 1 + g.below(25), true);
          break;
        case 2:
          text += g.run({{'a', 'z'}, {'A', 'Z'}}, 1 + g.below(3), false);
          break;
        default:
          text += g.chance(50) ? " " : "";
          break;
      }
    }
    corpus.push_back(text);
  }
  for (int i = 0; i < 600; ++i) corpus.push_back(g.mixed(1 + g.below(12)));
  for (int i = 0; i < 40; ++i) corpus.push_back(g.mixed(150 + g.below(600)));  // long inputs
  corpus.push_back(g.run({{'a', 'z'}}, 2000, true));                           // one long word
  corpus.push_back(g.run({{'0', '9'}}, 1000, true));                           // one long number
  corpus.push_back(std::string(500, ' ') + "x" + std::string(300, '\n'));
  corpus.push_back(g.run({{0x4E00, 0x9FA5}}, 800, true));
  corpus.insert(corpus.end(), kWhitespaceQuestions.begin(), kWhitespaceQuestions.end());
  return corpus;
}

}  // namespace vqa::testing
