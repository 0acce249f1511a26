#include "inspect.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>

#include "data/dataset_reader.h"  // DatasetReader
#include "data/hdf5_crash.h"      // Hdf5CrashScope, hdf5_crash_context
#include "data/hdf5_util.h"       // Hdf5Id, hdf5_read_string_attribute

namespace vqa::prep {

namespace {

herr_t collect_group(hid_t group, const char* name, const H5L_info_t*, void* out) {
  // HDF5 1.12 gave H5Oget_info_by_name a `fields` argument and H5O_info2_t
  // (Debian 12 has 1.10, Debian 13 1.14).
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  const herr_t status = H5Oget_info_by_name(group, name, &info, H5O_INFO_BASIC, H5P_DEFAULT);
#else
  H5O_info_t info;
  const herr_t status = H5Oget_info_by_name(group, name, &info, H5P_DEFAULT);
#endif
  if (status >= 0 && info.type == H5O_TYPE_GROUP && std::string(name) != "vocab") {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
  }
  return 0;
}

// As the training job's loader (LoaderOptions::stall_seconds).
constexpr double kStallSeconds = 15.0;

// Ends vqa_prep with exit status 1 and a message naming the file and what was
// being read when HDF5 has not returned for kStallSeconds: a damaged file can
// make HDF5 1.10 loop forever (tests/fuzz/hangs/). `progress` moves with
// every read; the watch lives as long as the inspection.
class StallWatch {
 public:
  StallWatch(std::string path, const data::ReadProgress& progress)
      : path_(std::move(path)), progress_(progress), thread_([this] { watch(); }) {}
  ~StallWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

 private:
  void watch() {
    using Clock = std::chrono::steady_clock;
    int64_t last_count = -1;
    auto last_change = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return done_; })) {
      const auto [count, what] = progress_.snapshot();
      if (count != last_count) {
        last_count = count;
        last_change = Clock::now();
      } else if (std::chrono::duration<double>(Clock::now() - last_change).count() >
                 kStallSeconds) {
        std::fflush(stdout);
        std::fprintf(stderr,
                     "vqa_prep inspect: error: %s: %s: HDF5 has not returned for %g s; the file "
                     "is most likely damaged (HDF5 can loop forever on a corrupt heap or "
                     "index): write it again with vqa_prep\n",
                     path_.c_str(), what.c_str(), kStallSeconds);
        std::fflush(stderr);
        std::_Exit(1);  // the HDF5 call never returns, so nothing can be unwound
      }
    }
  }

  std::string path_;
  const data::ReadProgress& progress_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// The file's split groups (every root group but /vocab), and its creator.
std::vector<std::string> list_splits(const std::string& path, std::string& created_by,
                                     data::ReadProgress& progress) {
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
  const std::string what = std::string("attribute '") + data::kAttrCreatedBy + "'";
  progress.mark(what);
  data::hdf5_crash_context(what);
  created_by = data::hdf5_read_string_attribute(file.get(), data::kAttrCreatedBy, path);
  if (splits.empty())
    throw data::DataFormatError(path + ": no split groups (expected /train and /test)");
  return splits;
}

// "normalisation m3ae, from train+test", or what the file does not record.
std::string answer_provenance(const data::DatasetInfo& info) {
  const std::string normalization = info.answer_normalization.empty()
                                        ? "answer normalisation not recorded"
                                        : "normalisation " + info.answer_normalization;
  return normalization +
         (info.answer_label_set.empty() ? "" : ", label set from " + info.answer_label_set);
}

std::string decode_tokens(const std::vector<int32_t>& ids,
                          const std::vector<std::string>& vocabulary) {
  std::string text;
  for (int32_t id : ids) text += (text.empty() ? "" : " ") + vocabulary.at(static_cast<size_t>(id));
  return text;
}

}  // namespace

void inspect_run(const std::string& path, int64_t records) {
  data::ReadProgress progress;
  const StallWatch stall_watch(path, progress);
  std::string created_by;
  const std::vector<std::string> splits = list_splits(path, created_by, progress);
  bool header_printed = false;
  for (const std::string& split : splits) {
    data::DatasetReader reader(path, split, H5P_DEFAULT, &progress);  // default (POSIX) driver
    const data::DatasetInfo& info = reader.info();
    if (!header_printed) {
      header_printed = true;
      std::printf("file: %s\nformat: vqa-hpc version %ld, created by: %s\n", path.c_str(),
                  static_cast<long>(info.format_version), created_by.c_str());
      if (info.has_features) {
        std::printf("images: features [tokens %ld, dim %ld]\n",
                    static_cast<long>(info.feature_tokens), static_cast<long>(info.feature_dim));
      } else {
        std::printf("images: pixels %ldx%ld, mean %.4f %.4f %.4f, std %.4f %.4f %.4f (%s)\n",
                    static_cast<long>(info.image_size), static_cast<long>(info.image_size),
                    info.image_mean[0], info.image_mean[1], info.image_mean[2], info.image_std[0],
                    info.image_std[1], info.image_std[2], info.image_normalization.c_str());
      }
      std::printf("answers: %ld labels (%s); tokenizer: %s, %ld entries; max question length %ld\n",
                  static_cast<long>(info.num_answers), answer_provenance(info).c_str(),
                  info.tokenizer.c_str(), static_cast<long>(info.vocab_size),
                  static_cast<long>(info.max_question_length));
      const data::SpecialTokenIds& special = info.special_tokens;
      std::printf("special tokens: pad %ld, cls %ld, eos %ld, unk %ld%s%s\n",
                  static_cast<long>(special.pad), static_cast<long>(special.cls),
                  static_cast<long>(special.eos), static_cast<long>(special.unk),
                  info.tokenizer_sha256.empty() ? "" : "; tokenizer files sha256 ",
                  info.tokenizer_sha256.c_str());
    }
    const data::SplitStatistics& stats = reader.statistics();
    std::printf("\n[%s] %ld questions over %ld images: %ld closed, %ld open, %ld without a label\n",
                split.c_str(), static_cast<long>(info.num_questions),
                static_cast<long>(info.num_images), static_cast<long>(stats.closed),
                static_cast<long>(stats.open), static_cast<long>(stats.unlabelled));
    std::printf("[%s] identity %s\n", split.c_str(), info.identity.c_str());
    if (info.has_source_images) {
      const auto& shapes = reader.source_image_shapes();
      int32_t smallest = INT32_MAX, largest = 0;
      double bytes = 0;
      for (size_t i = 0; i + 1 < shapes.size(); i += 2) {
        smallest = std::min({smallest, shapes[i], shapes[i + 1]});
        largest = std::max({largest, shapes[i], shapes[i + 1]});
        bytes += 3.0 * shapes[i] * shapes[i + 1];
      }
      std::printf(
          "[%s] source images: %zu, sides %d..%d px, %.1f MB (for vqa_train --augment "
          "resized-crop)\n",
          split.c_str(), shapes.size() / 2, smallest, largest, bytes / 1e6);
    }
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
