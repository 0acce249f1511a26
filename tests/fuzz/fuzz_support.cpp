#include "fuzz_support.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "data/dataset_reader.h"  // DatasetReader, DataFormatError

namespace vqa::fuzz {

void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string fuzz_scratch_path(const std::string& name) {
  std::error_code error;
  const std::filesystem::path folder = std::filesystem::is_directory("/dev/shm", error)
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
  return (folder / ("vqa-fuzz-" + std::to_string(getpid()) + "-" + name)).string();
}

namespace {

// Reads everything the loader would read of an accepted split and checks the
// reader's promises (loader.h, dataset_reader.h) on the values.
void exercise_split(data::DatasetReader& reader) {
  const data::DatasetInfo& info = reader.info();
  const std::string where = info.path + " [" + info.split + "]: ";
  fuzz_require(info.num_questions >= 1 && info.num_questions <= INT32_MAX,
               where + "num_questions " + std::to_string(info.num_questions));
  fuzz_require(info.num_images >= 1, where + "num_images " + std::to_string(info.num_images));
  fuzz_require(info.num_answers >= 1 && info.num_answers <= data::kMaxAnswers,
               where + "num_answers " + std::to_string(info.num_answers));
  fuzz_require(info.vocab_size > data::kClassToken && info.vocab_size <= data::kMaxVocabulary,
               where + "vocab_size " + std::to_string(info.vocab_size));
  fuzz_require(static_cast<int64_t>(info.answer_labels.size()) == info.num_answers,
               where + "answer_labels size");
  fuzz_require(info.image_mean.size() == 3 && info.image_std.size() == 3, where + "mean/std size");
  for (int c = 0; c < 3; ++c) {
    fuzz_require(std::isfinite(info.image_mean[c]) && std::isfinite(info.image_std[c]) &&
                     info.image_std[c] > 0,
                 where + "mean/std channel " + std::to_string(c));
  }
  const int64_t length = info.max_question_length, targets = reader.max_targets();
  // At most 64 question rows and 4 images: bounds the time per input.
  const int64_t rows_to_read = std::min<int64_t>(info.num_questions, 64);
  std::vector<int64_t> rows(static_cast<size_t>(rows_to_read));
  for (int64_t i = 0; i < rows_to_read; ++i) rows[i] = i;
  const data::QuestionRows questions = reader.read_question_rows(rows);
  fuzz_require(static_cast<int64_t>(questions.token_ids.size()) == rows_to_read * length &&
                   static_cast<int64_t>(questions.labels.size()) == rows_to_read * targets &&
                   questions.image_row.size() == rows.size(),
               where + "question row sizes");
  for (int64_t token : questions.token_ids) {
    fuzz_require(token >= 0 && token < info.vocab_size, where + "token " + std::to_string(token));
  }
  for (int64_t mask : questions.attention_mask) {
    fuzz_require(mask == 0 || mask == 1, where + "mask " + std::to_string(mask));
  }
  for (int64_t image : questions.image_row) {
    fuzz_require(image >= 0 && image < info.num_images, where + "image " + std::to_string(image));
  }
  for (int64_t type : questions.answer_type) {
    fuzz_require(type == 0 || type == 1, where + "answer type " + std::to_string(type));
  }
  for (size_t i = 0; i < questions.labels.size(); ++i) {
    fuzz_require(questions.labels[i] >= -1 && questions.labels[i] < info.num_answers,
                 where + "label " + std::to_string(questions.labels[i]));
    fuzz_require(questions.scores[i] >= 0.0f && questions.scores[i] <= 1.0f,
                 where + "score " + std::to_string(questions.scores[i]));
  }
  const auto records = reader.read_records(0, rows_to_read);
  fuzz_require(static_cast<int64_t>(records.size()) == rows_to_read, where + "records size");
  for (const auto& record : records) {
    for (int32_t token : record.token_ids) {
      fuzz_require(token >= 0 && token < info.vocab_size, where + "record token");
    }
  }
  const int64_t images_to_read = std::min<int64_t>(info.num_images, 4);
  std::vector<int64_t> image_rows(static_cast<size_t>(images_to_read));
  for (int64_t i = 0; i < images_to_read; ++i) image_rows[i] = i;
  if (info.has_features) {
    const auto features = reader.read_features(image_rows);
    fuzz_require(static_cast<int64_t>(features.size()) ==
                     images_to_read * info.feature_tokens * info.feature_dim,
                 where + "features size");
  } else {
    const auto pixels = reader.read_pixels(image_rows);
    fuzz_require(static_cast<int64_t>(pixels.size()) ==
                     images_to_read * 3 * info.image_size * info.image_size,
                 where + "pixels size");
  }
}

}  // namespace

int fuzz_exercise_reader(const std::string& path) {
  // Speed under ASan (2 inputs/s before, ~30 after): every H5Dread that
  // converts types callocs a 1 MB buffer, which HDF5 then hands back to a
  // quarantined allocator, so page faults and memset took ~90% of the time.
  // Keep freed blocks on HDF5's free lists, and convert in 16 KB strips (the
  // values read are the same; only the strip size differs from the loader).
  static const bool unlimited = H5set_free_list_limits(-1, -1, -1, -1, -1, -1) >= 0;
  fuzz_require(unlimited, "H5set_free_list_limits failed");
  static const bool small = H5Pset_buffer(H5P_DATASET_XFER_DEFAULT, 16384, nullptr, nullptr) >= 0;
  fuzz_require(small, "H5Pset_buffer failed");
  int accepted = 0;
  for (const char* split : {"train", "test"}) {
    try {
      data::DatasetReader reader(path, split);
      exercise_split(reader);
      ++accepted;
    } catch (const data::DataFormatError& e) {
      const std::string message = e.what();
      fuzz_require(message.rfind(path + ": ", 0) == 0,
                   "the error does not start with the file name: " + message);
    }
    const ssize_t open_objects = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    fuzz_require(open_objects == 0,
                 std::to_string(open_objects) + " HDF5 object(s) left open after split " + split);
  }
  return accepted;
}

}  // namespace vqa::fuzz
