#include "inspect.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "data/dataset_reader.h"  // DatasetReader
#include "data/hdf5_crash.h"      // Hdf5CrashScope, hdf5_crash_context
#include "data/hdf5_util.h"       // Hdf5Id, hdf5_read_string_attribute

namespace vqa::prep {

namespace {

herr_t collect_group(hid_t group, const char* name, const H5L_info_t*, void* out) {
  H5O_info_t info;
  if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) >= 0 && info.type == H5O_TYPE_GROUP &&
      std::string(name) != "vocab") {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
  }
  return 0;
}

// The file's split groups (every root group but /vocab), and its creator.
std::vector<std::string> list_splits(const std::string& path, std::string& created_by) {
  const data::Hdf5CrashScope crash_scope(path);
  data::hdf5_silence_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw data::DataFormatError(path + ": not an HDF5 file (or missing)");
  data::Hdf5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  data::hdf5_try(file.get(), "H5Fopen", path);
  std::vector<std::string> splits;
  data::hdf5_try(
      H5Literate(file.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_group, &splits),
      "H5Literate(/)", path);
  data::hdf5_crash_context(std::string("attribute '") + data::kAttrCreatedBy + "'");
  created_by = data::hdf5_read_string_attribute(file.get(), data::kAttrCreatedBy, path);
  if (splits.empty())
    throw data::DataFormatError(path + ": no split groups (expected /train and /test)");
  return splits;
}

std::string decode_tokens(const std::vector<int32_t>& ids,
                          const std::vector<std::string>& vocabulary) {
  std::string text;
  for (int32_t id : ids) text += (text.empty() ? "" : " ") + vocabulary.at(static_cast<size_t>(id));
  return text;
}

}  // namespace

void inspect_run(const std::string& path, int64_t records) {
  std::string created_by;
  const std::vector<std::string> splits = list_splits(path, created_by);
  bool header_printed = false;
  for (const std::string& split : splits) {
    data::DatasetReader reader(path, split);  // default (POSIX) driver
    const data::DatasetInfo& info = reader.info();
    if (!header_printed) {
      header_printed = true;
      std::printf("file: %s\nformat: vqa-hpc version %ld, created by: %s\n", path.c_str(),
                  static_cast<long>(data::kFormatVersion), created_by.c_str());
      if (info.has_features) {
        std::printf("images: features [tokens %ld, dim %ld]\n",
                    static_cast<long>(info.feature_tokens), static_cast<long>(info.feature_dim));
      } else {
        std::printf("images: pixels %ldx%ld, mean %.4f %.4f %.4f, std %.4f %.4f %.4f\n",
                    static_cast<long>(info.image_size), static_cast<long>(info.image_size),
                    info.image_mean[0], info.image_mean[1], info.image_mean[2], info.image_std[0],
                    info.image_std[1], info.image_std[2]);
      }
      std::printf("answers: %ld labels; tokenizer: %s, %ld entries; max question length %ld\n",
                  static_cast<long>(info.num_answers), info.tokenizer.c_str(),
                  static_cast<long>(info.vocab_size), static_cast<long>(info.max_question_length));
    }
    const data::SplitStatistics& stats = reader.statistics();
    std::printf("\n[%s] %ld questions over %ld images: %ld closed, %ld open, %ld without a label\n",
                split.c_str(), static_cast<long>(info.num_questions),
                static_cast<long>(info.num_images), static_cast<long>(stats.closed),
                static_cast<long>(stats.open), static_cast<long>(stats.unlabelled));
    std::printf("[%s] identity %s\n", split.c_str(), info.identity.c_str());
    std::vector<size_t> order(stats.top_label_counts.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return stats.top_label_counts[a] > stats.top_label_counts[b];
    });
    std::printf("[%s] most frequent answers:", split.c_str());
    for (size_t i = 0; i < std::min<size_t>(10, order.size()); ++i) {
      const int64_t count = stats.top_label_counts[order[i]];
      if (count == 0) break;
      std::printf(" '%s' %.1f%%", info.answer_labels[order[i]].c_str(),
                  100.0 * count / info.num_questions);
    }
    std::printf("\n");
    for (const auto& record : reader.read_records(0, records)) {
      std::string labels;
      for (size_t i = 0; i < record.labels.size(); ++i) {
        labels += (i ? ", " : "") + info.answer_labels.at(static_cast<size_t>(record.labels[i])) +
                  "=" + std::to_string(record.scores[i]).substr(0, 4);
      }
      std::printf(
          "[%s] qid %ld, image %ld '%s', %s, type '%s'\n    Q: %s\n    tokens: %s\n    A: %s -> "
          "[%s]\n",
          split.c_str(), static_cast<long>(record.question_id), static_cast<long>(record.image_row),
          record.image_name.c_str(),
          record.answer_type == data::kAnswerTypeClosed ? "closed" : "open",
          record.question_type.c_str(), record.question_text.c_str(),
          decode_tokens(record.token_ids, reader.token_vocabulary()).c_str(),
          record.answer_text.c_str(), labels.empty() ? "outside the label set" : labels.c_str());
    }
  }
  std::printf("\nvalid: every split checked (shapes, dtypes, index ranges)\n");
}

}  // namespace vqa::prep
