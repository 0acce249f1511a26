// vqa_prep: packs a VQA dataset once into the HDF5 format the training job
// reads (FORMAT.md). Subcommands:
//   synth    a synthetic, learnable dataset (the quickstart's data)
//   convert  VQA-RAD / SLAKE style JSON + images (or features) to the format
//   inspect  summary and full validation of a dataset file
//   tokenize the BPE ids of texts (to check the tokenizer against another)
// Exit status: 0 done, 1 bad input or failure, 2 bad command line.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "convert.h"              // convert_run, convert_check_options
#include "data/dataset_format.h"  // DataFormatError
#include "data/hdf5_crash.h"      // hdf5_crash_report_install
#include "inspect.h"              // inspect_run
#include "roberta_tokenizer.h"    // ByteLevelBpe, RobertaTokenizer
#include "synth.h"                // synth_generate
#include "util/clock.h"           // SteadyClock, seconds_since
#include "util/options.h"         // OptionTable
#include "writer.h"               // prep_write_dataset

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses `arguments` with `table`; returns false after printing --help.
bool parse(const std::string& command, const std::vector<std::string>& arguments,
           vqa::util::OptionTable& table) {
  try {
    if (table.parse(arguments)) return true;
  } catch (const vqa::util::OptionError& e) {
    throw UsageError(std::string(e.what()) + " (see vqa_prep " + command + " --help)");
  }
  table.print_help(stdout, "usage: vqa_prep " + command + " [options]");
  return false;
}

int run_synth(const std::vector<std::string>& arguments, const std::string& command_line) {
  vqa::prep::SynthOptions options;
  std::string output;
  vqa::util::OptionTable table("synth options");
  table.add_required("output,o", &output, "dataset file to write")
      .add("train-questions", &options.train_questions, "questions in /train",
           vqa::util::Range{1, 1e8})
      .add("test-questions", &options.test_questions, "questions in /test",
           vqa::util::Range{1, 1e8})
      .add("questions-per-image", &options.questions_per_image, "questions asked of each image",
           vqa::util::Range{1, 1e6})
      .add("image-size", &options.image_size, "image side in pixels", vqa::util::Range{8, 4096})
      .add("source-size", &options.source_size,
           "also store the train images as drawn at this side, as source images (format "
           "version 3) for vqa_train --augment resized-crop; the stored images are then their "
           "resize to --image-size (0: no source images)",
           vqa::util::Range{0, 4096})
      .add("max-len", &options.max_question_length, "question length in tokens, <cls> included",
           vqa::util::Range{8, 4096})
      .add("vocab-size", &options.vocab_size,
           "vocabulary entries (e.g. 50265, RoBERTa's): filler words fill the vocabulary and "
           "end every question, 4-12 of them drawn from a Zipf law, so a batch touches a few "
           "hundred rows of the word embedding as real questions do; use --max-len 32 (0: the "
           "templates' words only)",
           vqa::util::Range{0, 1e7})
      .add("seed", &options.seed, "random seed");
  if (!parse("synth", arguments, table)) return 0;
  const auto start = vqa::util::SteadyClock::now();
  vqa::prep::SynthDataset dataset = vqa::prep::synth_generate(options);
  dataset.header.created_by = command_line;
  vqa::prep::prep_write_dataset(output, dataset.header, dataset.splits);
  for (const auto& split : dataset.splits) {
    std::printf("vqa_prep synth: %s %ld questions over %zu images (%ldx%ld)\n", split.name.c_str(),
                static_cast<long>(split.questions.size()), split.image_names.size(),
                static_cast<long>(split.image_size), static_cast<long>(split.image_size));
  }
  std::printf("vqa_prep synth: %zu answer labels, %zu vocabulary entries; wrote %s in %.2f s\n",
              dataset.header.answer_labels.size(), dataset.header.token_vocabulary.size(),
              output.c_str(), vqa::util::seconds_since(start));
  return 0;
}

int run_convert(const std::vector<std::string>& arguments, const std::string& command_line) {
  vqa::prep::ConvertOptions options;
  options.created_by = command_line;
  vqa::util::OptionTable table("convert options");
  table
      .add_list("train-json", &options.train_json,
                "training split JSON file(s) (VQA-RAD or SLAKE records)", /*required=*/false)
      .add_list("test-json", &options.test_json, "test split JSON file(s)", /*required=*/false)
      .add_list("val-json", &options.val_json,
                "validation JSON file(s) (SLAKE's validate.json): their answers join the label "
                "set with --include-test-answers, as M3AE's do; not stored",
                /*required=*/false)
      .add("medvqa2019", &options.medvqa2019_root,
           "VQA-Med 2019 release root instead of JSON: {train,val,test}/QA/{Modality,Organ,Plane}"
           ".csv (image_id|question|answer) and {train,val,test}/images/*.jpg, as M3AE reads it")
      .add("images", &options.image_dir, "image folder; record image names are relative to it")
      .add_required("output,o", &options.output, "dataset file to write")
      .add("image-size", &options.image_size,
           "stored image side: shorter side resized (PIL's antialiased bicubic), centre crop",
           vqa::util::Range{1, 4096})
      .add("max-len", &options.max_length,
           "question length in tokens, special tokens included; longer questions are truncated",
           vqa::util::Range{2, 4096})
      .add_choice("tokenizer", &options.tokenizer,
                  "word (vocabulary from the training questions) or roberta (--vocab-json, "
                  "--merges-txt)",
                  {"word", "roberta"})
      .add("vocab-json", &options.vocab_json,
           "roberta: vocab.json of a Hugging Face RoBERTa tokenizer (token -> id)")
      .add("merges-txt", &options.merges_txt, "roberta: its merges.txt (BPE merges by rank)")
      .add("min-word-count", &options.min_word_count,
           "word: training questions a word must occur in to get its own token",
           vqa::util::Range{1, 1e9})
      .add_choice("normalize", &options.normalize,
                  "image mean/std stored for the loader: dataset (the training images') or clip "
                  "(CLIP's, as M3AE uses)",
                  {"dataset", "clip"})
      .add("language", &options.language, "keep records whose q_lang is this (SLAKE)")
      .add_choice(
          "answer-normalization", &options.answer_normalization,
          "how answers become labels: vqa (the VQA evaluation's normalisation) or m3ae (M3AE's "
          "normalize_word, as its label sets are built)",
          {"vqa", "m3ae"})
      .add("include-test-answers", &options.include_test_answers,
           "build the answer label set from train, val and test answers (as M3AE does)")
      .add("strict", &options.strict, "fail on the first bad record instead of skipping it")
      .add("features", &options.features,
           "HDF5 file of precomputed image features instead of --images")
      .add("features-dataset", &options.features_dataset, "its float dataset [images, tokens, dim]")
      .add("features-index", &options.features_index, "its string dataset naming each row's image")
      .add("features-float16", &options.features_float16, "store features as float16")
      .add("keep-source-images", &options.keep_source_images,
           "also store the train split's decoded images as they are (format version 3), which "
           "vqa_train --augment resized-crop cuts its random crops from (M3AE's "
           "clip_resizedcrop); the file grows by height x width x 3 bytes per train image")
      .add("threads", &options.threads, "image decoding threads (0: all cores)",
           vqa::util::Range{0, 1024});
  if (!parse("convert", arguments, table)) return 0;
  try {
    vqa::prep::convert_check_options(options);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string(e.what()) + " (see vqa_prep convert --help)");
  }
  vqa::prep::convert_run(options);
  return 0;
}

// Prints, as one JSON array, the ids of every text of a JSON array of
// strings: raw BPE ids, or with --max-len the ids convert stores.
int run_tokenize(const std::vector<std::string>& arguments) {
  std::string vocab_json, merges_txt, texts_json;
  int64_t max_length = 0;
  vqa::util::OptionTable table("tokenize options");
  table.add_required("vocab-json", &vocab_json, "vocab.json (token -> id)")
      .add_required("merges-txt", &merges_txt, "merges.txt")
      .add_required("texts-json", &texts_json, "a JSON file holding an array of strings")
      .add("max-len", &max_length,
           "0: the raw BPE ids; L >= 2: <s> ... </s> truncated to L, as convert stores them "
           "(before padding)");
  if (!parse("tokenize", arguments, table)) return 0;
  if (max_length == 1 || max_length < 0) throw UsageError("--max-len must be 0 or at least 2");
  std::ifstream file(texts_json, std::ios::binary);
  if (!file) throw vqa::data::DataFormatError(texts_json + ": cannot open it");
  std::stringstream text;
  text << file.rdbuf();
  nlohmann::json texts;
  try {
    texts = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw vqa::data::DataFormatError(texts_json + ": malformed JSON: " + e.what());
  }
  if (!texts.is_array()) throw vqa::data::DataFormatError(texts_json + ": not a JSON array");
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!texts[i].is_string()) {
      throw vqa::data::DataFormatError(texts_json + ": entry " + std::to_string(i) + " is " +
                                       texts[i].type_name() + ", expected a string");
    }
  }
  nlohmann::json result = nlohmann::json::array();
  if (max_length == 0) {
    const vqa::prep::ByteLevelBpe bpe(vocab_json, merges_txt);
    for (const auto& entry : texts) result.push_back(bpe.encode(entry.get<std::string>()));
  } else {
    const vqa::prep::RobertaTokenizer tokenizer(vocab_json, merges_txt);
    for (const auto& entry : texts) {
      result.push_back(tokenizer.encode(entry.get<std::string>(), max_length));
    }
  }
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

int run_inspect(const std::vector<std::string>& arguments) {
  std::string file;
  int64_t records = 3;
  vqa::util::OptionTable table("inspect options");
  table.add_required("file", &file, "dataset file")
      .add("records", &records, "questions to print per split", vqa::util::Range{0, 1e9})
      .positional("file", 1);
  if (!parse("inspect", arguments, table)) return 0;
  vqa::prep::inspect_run(file, records);
  return 0;
}

void print_usage() {
  std::printf(
      "usage: vqa_prep <command> [options]\n"
      "  synth    write a synthetic VQA dataset (coloured shapes)\n"
      "  convert  VQA-RAD / SLAKE JSON + images (or --features) to the dataset format\n"
      "  inspect  summarise and validate a dataset file\n"
      "  tokenize print the RoBERTa/GPT-2 BPE ids of a JSON array of texts\n"
      "vqa_prep <command> --help lists a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_usage();
    return argc < 2 ? kExitUsage : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> arguments(argv + 2, argv + argc);
  std::string command_line = "vqa_prep";
  for (int i = 1; i < argc; ++i) command_line += std::string(" ") + argv[i];
  // A file that crashes HDF5 itself still gets a message naming it.
  vqa::data::hdf5_crash_report_install("vqa_prep " + command + ": error: ", kExitFailure);
  try {
    if (command == "synth") return run_synth(arguments, command_line);
    if (command == "convert") return run_convert(arguments, command_line);
    if (command == "inspect") return run_inspect(arguments);
    if (command == "tokenize") return run_tokenize(arguments);
    std::fprintf(stderr, "vqa_prep: unknown command '%s'\n", command.c_str());
    print_usage();
    return kExitUsage;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "vqa_prep %s: %s\n", command.c_str(), e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    // DataFormatError names file, record/dataset and field; anything else is
    // reported the same way rather than ending in std::terminate.
    std::fprintf(stderr, "vqa_prep %s: error: %s\n", command.c_str(), e.what());
    return kExitFailure;
  }
}
