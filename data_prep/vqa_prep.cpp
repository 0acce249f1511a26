// vqa_prep: packs a VQA dataset once into the HDF5 format the training job
// reads (FORMAT.md). Subcommands:
//   synth    a synthetic, learnable dataset (the quickstart's data)
//   convert  VQA-RAD / SLAKE style JSON + images (or features) to the format
//   inspect  summary and full validation of a dataset file
// Exit status: 0 done, 1 bad input or failure, 2 bad command line.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "convert.h"          // convert_run
#include "data/format.h"      // DataFormatError
#include "data/hdf5_crash.h"  // hdf5_crash_report_install
#include "inspect.h"          // inspect_run
#include "synth.h"            // synth_generate
#include "writer.h"           // prep_write_dataset

namespace po = boost::program_options;

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses `arguments` against `options`; returns false after printing --help.
bool parse(const std::string& command, const std::vector<std::string>& arguments,
           const po::options_description& options,
           const po::positional_options_description* positional, po::variables_map& values) {
  po::command_line_parser parser(arguments);
  parser.options(options);
  if (positional) parser.positional(*positional);
  try {
    po::store(parser.run(), values);
    if (values.count("help")) {
      std::cout << "usage: vqa_prep " << command << " [options]\n" << options;
      return false;
    }
    po::notify(values);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + " (see vqa_prep " + command + " --help)");
  }
  return true;
}

int run_synth(const std::vector<std::string>& arguments, const std::string& command_line) {
  vqa::prep::SynthOptions options;
  std::string output;
  po::options_description description("synth options");
  description.add_options()("help,h", "show this help")("output,o", po::value(&output)->required(),
                                                        "dataset file to write")(
      "train-questions",
      po::value(&options.train_questions)->default_value(options.train_questions),
      "questions in /train")(
      "test-questions", po::value(&options.test_questions)->default_value(options.test_questions),
      "questions in /test")(
      "questions-per-image",
      po::value(&options.questions_per_image)->default_value(options.questions_per_image),
      "questions asked of each image")(
      "image-size", po::value(&options.image_size)->default_value(options.image_size),
      "image side in pixels")(
      "max-len",
      po::value(&options.max_question_length)->default_value(options.max_question_length),
      "question length in tokens, <cls> included")(
      "seed", po::value(&options.seed)->default_value(options.seed), "random seed");
  po::variables_map values;
  if (!parse("synth", arguments, description, nullptr, values)) return 0;
  const auto start = std::chrono::steady_clock::now();
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
              output.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

int run_convert(const std::vector<std::string>& arguments, const std::string& command_line) {
  vqa::prep::ConvertOptions options;
  options.created_by = command_line;
  po::options_description description("convert options");
  description.add_options()("help,h", "show this help")(
      "train-json", po::value(&options.train_json)->required()->multitoken(),
      "training split JSON file(s) (VQA-RAD or SLAKE records)")(
      "test-json", po::value(&options.test_json)->required()->multitoken(),
      "test split JSON file(s)")("images", po::value(&options.image_dir),
                                 "image folder; record image names are relative to it")(
      "output,o", po::value(&options.output)->required(), "dataset file to write")(
      "image-size", po::value(&options.image_size)->default_value(options.image_size),
      "stored image side: shorter side resized (bicubic), centre crop")(
      "max-len", po::value(&options.max_length)->default_value(options.max_length),
      "question length in tokens, <cls> included; longer questions are truncated")(
      "min-word-count", po::value(&options.min_word_count)->default_value(options.min_word_count),
      "training questions a word must occur in to get its own token")(
      "language", po::value(&options.language)->default_value(options.language),
      "keep records whose q_lang is this (SLAKE)")(
      "include-test-answers", po::bool_switch(&options.include_test_answers),
      "build the answer label set from train and test answers (as M3AE does)")(
      "strict", po::bool_switch(&options.strict),
      "fail on the first bad record instead of skipping it")(
      "features", po::value(&options.features),
      "HDF5 file of precomputed image features instead of --images")(
      "features-dataset",
      po::value(&options.features_dataset)->default_value(options.features_dataset),
      "its float dataset [images, tokens, dim]")(
      "features-index", po::value(&options.features_index)->default_value(options.features_index),
      "its string dataset naming each row's image")(
      "features-float16", po::bool_switch(&options.features_float16), "store features as float16")(
      "threads", po::value(&options.threads)->default_value(options.threads),
      "image decoding threads (0: all cores)");
  po::variables_map values;
  if (!parse("convert", arguments, description, nullptr, values)) return 0;
  vqa::prep::convert_run(options);
  return 0;
}

int run_inspect(const std::vector<std::string>& arguments) {
  std::string file;
  int64_t records = 3;
  po::options_description description("inspect options");
  description.add_options()("help,h", "show this help")("file", po::value(&file)->required(),
                                                        "dataset file")(
      "records", po::value(&records)->default_value(records), "questions to print per split");
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map values;
  if (!parse("inspect", arguments, description, &positional, values)) return 0;
  vqa::prep::inspect_run(file, records);
  return 0;
}

void print_usage() {
  std::printf(
      "usage: vqa_prep <command> [options]\n"
      "  synth    write a synthetic VQA dataset (coloured shapes)\n"
      "  convert  VQA-RAD / SLAKE JSON + images (or --features) to the dataset format\n"
      "  inspect  summarise and validate a dataset file\n"
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
