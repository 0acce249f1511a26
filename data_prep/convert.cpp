#include "convert.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>

#include "answer_text.h"      // answer_normalize, answer_normalize_m3ae, text_collapse_whitespace
#include "convert_images.h"   // image_load_all, FeatureSource
#include "convert_medvqa.h"   // records_read_medvqa2019
#include "convert_records.h"  // Record, records_read_split, records_build_labels
#include "data/dataset_format.h"  // DataFormatError, kAnswerType*, kTokenizer*, kNormalization*
#include "roberta_tokenizer.h"    // RobertaTokenizer
#include "tokenizer.h"            // WordTokenizer
#include "writer.h"               // DatasetWriter

namespace vqa::prep {

namespace {

constexpr size_t kImageChunk = 256;       // images decoded at a time: bounds memory
constexpr size_t kSourceImageChunk = 32;  // the same, keeping the decoded sources

struct ImageStats {
  std::array<double, 3> sum{}, square{};
  double pixels = 0;
};

// Writes a split's images (each distinct image once) and drops the records
// whose image cannot be read. Returns image row per kept record.
std::vector<int32_t> write_images(const std::string& split, std::vector<Record>& records,
                                  const ConvertOptions& options, FeatureSource* features,
                                  DatasetWriter& writer, RecordProblems& problems,
                                  ImageStats* stats) {
  std::vector<std::string> names;
  std::map<std::string, std::string> paths;
  for (const Record& r : records) {
    if (paths.emplace(r.image_name, r.image_path).second) names.push_back(r.image_name);
  }
  if (features) {
    writer.begin_split(split, 0, features->tokens(), features->dim(),
                       features->half_precision() || options.features_float16);
  } else {
    writer.begin_split(split, options.image_size);
  }
  std::map<std::string, int32_t> rows;
  std::map<std::string, std::string> failures;
  std::vector<std::string> stored_names;
  const bool keep_sources = options.keep_source_images && split == "train";
  const size_t chunk = keep_sources ? kSourceImageChunk : kImageChunk;
  for (size_t first = 0; first < names.size(); first += chunk) {
    const size_t last = std::min(names.size(), first + chunk);
    if (features) {
      for (size_t i = first; i < last; ++i) {
        const int64_t row = features->find(names[i]);
        if (row < 0) {
          failures[names[i]] = "no row for this image in " + options.features;
          continue;
        }
        rows[names[i]] = static_cast<int32_t>(writer.append_features(features->read(row).data()));
        stored_names.push_back(names[i]);
      }
      continue;
    }
    std::vector<std::string> files;
    for (size_t i = first; i < last; ++i) files.push_back(paths[names[i]]);
    std::vector<std::vector<uint8_t>> images;
    std::vector<std::string> errors;
    std::vector<data::SourceImage> sources;
    image_load_all(files, options.image_size, options.threads, images, errors,
                   keep_sources ? &sources : nullptr);
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string& name = names[first + i];
      if (!errors[i].empty()) {
        failures[name] = errors[i];
        continue;
      }
      rows[name] = static_cast<int32_t>(writer.append_image(images[i].data()));
      if (keep_sources) writer.append_source_image(sources[i]);
      stored_names.push_back(name);
      if (stats) {
        const size_t plane = images[i].size() / 3;
        for (size_t p = 0; p < images[i].size(); ++p) {
          const double value = images[i][p] / 255.0;
          stats->sum[p / plane] += value;
          stats->square[p / plane] += value * value;
        }
        stats->pixels += static_cast<double>(plane);
      }
    }
  }
  writer.end_images(stored_names);
  std::vector<Record> kept;
  std::vector<int32_t> image_rows;
  for (Record& r : records) {
    auto failure = failures.find(r.image_name);
    if (failure != failures.end()) {
      problems.report(r.file, r.index, std::to_string(r.qid), "image_name", failure->second);
      continue;
    }
    image_rows.push_back(rows.at(r.image_name));
    kept.push_back(std::move(r));
  }
  records = std::move(kept);
  return image_rows;
}

}  // namespace

void convert_check_options(const ConvertOptions& options) {
  const bool roberta = options.tokenizer == data::kTokenizerRoberta;
  if (!roberta && options.tokenizer != data::kTokenizerWord) {
    throw std::invalid_argument("--tokenizer '" + options.tokenizer +
                                "': expected 'word' or 'roberta'");
  }
  if (roberta && (options.vocab_json.empty() || options.merges_txt.empty())) {
    throw std::invalid_argument(
        "--tokenizer roberta needs --vocab-json FILE and --merges-txt FILE (the vocab.json and "
        "merges.txt of a Hugging Face RoBERTa tokenizer, e.g. roberta-base)");
  }
  if (!roberta && (!options.vocab_json.empty() || !options.merges_txt.empty())) {
    throw std::invalid_argument(
        "--vocab-json and --merges-txt are read by --tokenizer roberta only; the word tokenizer "
        "builds its vocabulary from the training questions");
  }
  if (options.normalize != data::kNormalizationDataset &&
      options.normalize != data::kNormalizationClip) {
    throw std::invalid_argument("--normalize '" + options.normalize +
                                "': expected 'dataset' (the training images' mean and std) or "
                                "'clip' (CLIP's, as M3AE uses)");
  }
  if (!options.medvqa2019_root.empty() &&
      (!options.train_json.empty() || !options.test_json.empty() || !options.val_json.empty() ||
       !options.image_dir.empty() || !options.features.empty())) {
    throw std::invalid_argument("--medvqa2019 " + options.medvqa2019_root +
                                " reads the release's own folders: give no --train-json, "
                                "--val-json, --test-json, --images or --features with it");
  }
  if (options.answer_normalization != "vqa" && options.answer_normalization != "m3ae") {
    throw std::invalid_argument("--answer-normalization '" + options.answer_normalization +
                                "': expected 'vqa' (the VQA evaluation's) or 'm3ae' (M3AE's "
                                "normalize_word, which its label sets use)");
  }
  if (!options.val_json.empty() && !options.include_test_answers) {
    throw std::invalid_argument(
        "--val-json adds answers to the label set only, which --include-test-answers builds "
        "from train + val + test (as M3AE does); without it the labels come from train alone");
  }
  if (!options.features.empty() && options.keep_source_images) {
    throw std::invalid_argument("--keep-source-images stores the decoded images; --features " +
                                options.features + " stores features instead of images");
  }
  if (!options.features.empty() && options.normalize == data::kNormalizationClip) {
    throw std::invalid_argument("--normalize clip applies to images; --features " +
                                options.features + " stores features");
  }
}

namespace {

// The three question sets of the inputs (val only adds answers to the label
// set), answers normalised as --answer-normalization asks.
struct InputSplits {
  RecordSplit train, val, test;
};

InputSplits read_input_splits(const ConvertOptions& options, RecordProblems& problems) {
  InputSplits splits;
  if (!options.medvqa2019_root.empty()) {
    int64_t next_qid = 0;  // M3AE's question ids: lines counted over train, val, test
    splits.train = records_read_medvqa2019(options.medvqa2019_root, "train", next_qid, problems);
    splits.val = records_read_medvqa2019(options.medvqa2019_root, "val", next_qid, problems);
    splits.test = records_read_medvqa2019(options.medvqa2019_root, "test", next_qid, problems);
  } else {
    RecordOptions record_options;
    record_options.image_dir = options.image_dir;
    record_options.features = !options.features.empty();
    record_options.language = options.language;
    record_options.strict = options.strict;
    splits.train = records_read_split(options.train_json, record_options, problems);
    splits.val = records_read_split(options.val_json, record_options, problems);
    splits.test = records_read_split(options.test_json, record_options, problems);
  }
  if (options.answer_normalization == "m3ae") {
    for (RecordSplit* split : {&splits.train, &splits.val, &splits.test}) {
      for (Record& r : split->records) {
        r.normalized_answer = answer_normalize_m3ae(r.answer);
        if (r.normalized_answer.empty()) {
          throw data::DataFormatError(r.file + ": question " + std::to_string(r.qid) +
                                      ": field 'answer': '" + r.answer +
                                      "' is empty after M3AE's normalisation");
        }
      }
    }
  }
  return splits;
}

// The mean and std the loader normalises with: none for features, CLIP's, or
// the training images' own.
void set_image_normalization(const ConvertOptions& options, bool features, const ImageStats& stats,
                             FileHeader& header) {
  if (features) {
    header.image_normalization = data::kNormalizationNone;
    header.image_mean = {0.0, 0.0, 0.0};
    header.image_std = {1.0, 1.0, 1.0};
  } else if (options.normalize == data::kNormalizationClip) {
    header.image_normalization = data::kNormalizationClip;
    header.image_mean.assign(std::begin(data::kClipMean), std::end(data::kClipMean));
    header.image_std.assign(std::begin(data::kClipStd), std::end(data::kClipStd));
  } else {
    header.image_normalization = data::kNormalizationDataset;
    for (size_t c = 0; c < 3; ++c) {
      const double mean = stats.sum[c] / stats.pixels;
      header.image_mean[c] = mean;
      header.image_std[c] =
          std::max(1e-3, std::sqrt(std::max(0.0, stats.square[c] / stats.pixels - mean * mean)));
    }
  }
}

// Answers outside the label set (they count as wrong), with a few examples.
struct OutsideAnswers {
  int64_t count = 0;
  std::vector<std::string> examples;
};

// One split's questions: tokens, image row, labels (`label_ids`: the
// header's answer labels by text), question type.
void write_question_table(const std::string& name, const std::vector<Record>& records,
                          const std::vector<int32_t>& rows, const ConvertOptions& options,
                          const FileHeader& header, const std::map<std::string, int32_t>& label_ids,
                          const Tokenizer& tokenizer, DatasetWriter& writer,
                          OutsideAnswers& outside) {
  const auto& types = header.question_types;
  const bool raw_text = options.tokenizer == data::kTokenizerRoberta;
  QuestionTable table(options.max_length, 1, static_cast<int32_t>(header.special_tokens.pad));
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    const auto type = static_cast<int32_t>(
        std::distance(types.begin(), std::find(types.begin(), types.end(), r.question_type)));
    auto label = label_ids.find(r.normalized_answer);
    std::vector<int32_t> labels;
    std::vector<float> scores;
    if (label != label_ids.end()) {
      labels.push_back(label->second);
      scores.push_back(1.0f);
    } else {
      ++outside.count;
      if (outside.examples.size() < 5) outside.examples.push_back(r.normalized_answer);
    }
    // RoBERTa's BPE reads the question as the JSON has it, as M3AE's does.
    const std::string& text = raw_text ? r.raw_question : r.question;
    table.add(tokenizer.encode(text, options.max_length), rows[i], r.answer_type, r.qid, type,
              r.question, r.answer, labels, scores);
  }
  writer.write_questions(name, table);
}

void print_split_line(const char* name, const std::vector<Record>& records,
                      const std::vector<int32_t>& rows) {
  const auto closed = std::count_if(records.begin(), records.end(), [](const Record& r) {
    return r.answer_type == data::kAnswerTypeClosed;
  });
  std::printf("vqa_prep convert: %s %zu questions (%ld closed, %ld open) over %zu images\n", name,
              records.size(), static_cast<long>(closed), static_cast<long>(records.size() - closed),
              static_cast<size_t>(*std::max_element(rows.begin(), rows.end()) + 1));
}

}  // namespace

void convert_run(const ConvertOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  convert_check_options(options);
  const bool medvqa = !options.medvqa2019_root.empty();
  if (!medvqa && (options.train_json.empty() || options.test_json.empty())) {
    throw data::DataFormatError(
        "convert: --train-json and --test-json are both required (or --medvqa2019 ROOT)");
  }
  if (!medvqa && options.features.empty() && options.image_dir.empty()) {
    throw data::DataFormatError("convert: give --images DIR (or --features FILE)");
  }
  if (options.image_size < 1 || options.image_size > data::kMaxImageSize ||
      options.max_length < 2 || options.max_length > data::kMaxQuestionLength) {
    throw data::DataFormatError("convert: --image-size must be 1.." +
                                std::to_string(data::kMaxImageSize) + " and --max-len 2.." +
                                std::to_string(data::kMaxQuestionLength));
  }
  // A tokenizer from files is read first: a bad file fails before any image is decoded.
  std::unique_ptr<Tokenizer> tokenizer;
  if (options.tokenizer == data::kTokenizerRoberta) {
    tokenizer = std::make_unique<RobertaTokenizer>(options.vocab_json, options.merges_txt);
  }
  RecordProblems problems(options.strict);
  InputSplits splits = read_input_splits(options, problems);
  std::vector<Record>& train = splits.train.records;
  std::vector<Record>& test = splits.test.records;
  const int64_t other_language = splits.train.other_language + splits.test.other_language;

  // ---- images (or features), each split's distinct images once ----
  std::unique_ptr<FeatureSource> features;
  if (!options.features.empty()) {
    features = std::make_unique<FeatureSource>(options.features, options.features_dataset,
                                               options.features_index);
  }
  DatasetWriter writer(options.output);
  ImageStats stats;
  const auto train_rows =
      write_images("train", train, options, features.get(), writer, problems, &stats);
  const auto test_rows =
      write_images("test", test, options, features.get(), writer, problems, nullptr);
  for (const auto& [name, records, files] : {std::tuple{"train", &train, &options.train_json},
                                             std::tuple{"test", &test, &options.test_json}}) {
    if (records->empty()) {
      std::string inputs = medvqa ? options.medvqa2019_root + "/" + name + "/QA/*.csv" : "";
      for (const auto& f : *files) inputs += (inputs.empty() ? "" : ", ") + f;
      throw data::DataFormatError(inputs + ": split '" + name + "' has no usable records");
    }
  }

  // ---- the header: tokenizer, labels, question types, normalisation ----
  if (!tokenizer) {
    std::vector<std::string> train_questions;
    for (const Record& r : train) train_questions.push_back(r.question);
    tokenizer = WordTokenizer::build(train_questions, options.min_word_count);
  }
  FileHeader header;
  header.features = features != nullptr;
  header.image_size = features ? 0 : options.image_size;
  header.max_question_length = options.max_length;
  header.tokenizer = tokenizer->kind();
  header.token_vocabulary = tokenizer->vocabulary();
  header.special_tokens = tokenizer->special_tokens();
  header.tokenizer_sha256 = tokenizer->source_sha256();
  header.created_by = options.created_by;
  header.answer_normalization = options.answer_normalization;
  header.answer_label_set = !options.include_test_answers ? "train"
                            : splits.val.records.empty()  ? "train+test"
                                                          : "train+val+test";
  header.answer_labels = options.include_test_answers
                             ? records_build_labels({&train, &splits.val.records, &test})
                             : records_build_labels({&train});
  std::set<std::string> types;
  for (const auto* records : {&train, &test}) {
    for (const Record& r : *records) types.insert(r.question_type);
  }
  header.question_types.assign(types.begin(), types.end());
  set_image_normalization(options, features != nullptr, stats, header);

  // ---- the questions, then the header last (commit) ----
  std::map<std::string, int32_t> label_ids;
  for (size_t i = 0; i < header.answer_labels.size(); ++i)
    label_ids[header.answer_labels[i]] = static_cast<int32_t>(i);
  OutsideAnswers outside;
  write_question_table("train", train, train_rows, options, header, label_ids, *tokenizer, writer,
                       outside);
  write_question_table("test", test, test_rows, options, header, label_ids, *tokenizer, writer,
                       outside);
  writer.commit(header);

  print_split_line("train", train, train_rows);
  print_split_line("test", test, test_rows);
  std::printf(
      "vqa_prep convert: %zu answer labels (from %s), %zu vocabulary entries (tokenizer %s), %zu "
      "question types; images normalised with %s mean/std\n",
      header.answer_labels.size(),
      !options.include_test_answers ? "train"
      : splits.val.records.empty()  ? "train + test"
                                    : "train + val + test",
      header.token_vocabulary.size(), header.tokenizer.c_str(), header.question_types.size(),
      header.image_normalization.c_str());
  std::string examples;
  for (const auto& e : outside.examples) examples += (examples.empty() ? "'" : ", '") + e + "'";
  std::printf(
      "vqa_prep convert: %ld test answers outside the label set%s%s%s (they count as wrong)\n",
      static_cast<long>(outside.count), outside.count ? " (e.g. " : "", examples.c_str(),
      outside.count ? ")" : "");
  std::printf(
      "vqa_prep convert: %ld records skipped for bad input, %ld in another language than '%s'\n",
      static_cast<long>(problems.count()), static_cast<long>(other_language),
      options.language.c_str());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("vqa_prep convert: wrote %s in %.1f s\n", options.output.c_str(), seconds);
}

}  // namespace vqa::prep
