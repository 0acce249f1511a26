// Every malformed-input case of the data path, run through the training job
// as users run it (mpirun -np 2 vqa_train): the job must end on every rank,
// non-zero, within 30 s, with one clear message that names the file, the
// attribute or dataset and the offending value. The cases follow the checks
// of DatasetReader (src/data/dataset_reader.cpp) and the job's own checks of
// the data against the configuration (src/train). Each case damages a copy of
// a good synthetic file with the HDF5 C API, as corruption or a foreign
// writer would.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "bad_data_damage.h"      // with_file and the other edits of a good file
#include "data/dataset_format.h"  // dataset and attribute names
#include "data/hdf5_util.h"       // Hdf5Id, hdf5_write_*_attribute
#include "process.h"              // run_process, mpirun_prefix, make_temp_dir

namespace {

namespace fs = std::filesystem;
using vqa::data::Hdf5Id;

constexpr double kDeadlineSeconds = 30.0;  // the bound for every case
constexpr int kUserErrorExit = 2;          // runtime::fatal_user_error's exit status

// HDF5's own words differ between 1.10 (Debian 12) and 1.14 (Debian 13):
// 1.14 names its API calls' failures "... synchronously ..." (the
// asynchronous API of 1.13), reports the damaged global heap of
// segv-in-global-heap-load.h5 where 1.10 crashes, and puts no frame of the
// Fletcher32 filter on the stack (H5Z_pipeline's is the innermost).
#if H5_VERSION_GE(1, 14, 0)
constexpr bool kHdf5CrashesOnHeap = false;
constexpr const char* kH5FopenFailed = "H5Fopen: unable to synchronously open file";
constexpr const char* kH5DreadFailed = "H5Dread: can't synchronously read data";
constexpr const char* kChecksumFailed = "H5Z_pipeline: filter returned failure during read";
#else
constexpr bool kHdf5CrashesOnHeap = true;
constexpr const char* kH5FopenFailed = "H5Fopen: unable to open file";
constexpr const char* kH5DreadFailed = "H5Dread: can't read data";
constexpr const char* kChecksumFailed =
    "H5Z__filter_fletcher32: data error detected by Fletcher32 checksum";
#endif

// The good file: 64 train / 16 test questions, 16x16 pixels, L = 8.
struct GoodFile {
  std::string dir, path;
  int64_t train_questions = 64, num_answers = 0, vocab_size = 0, num_images = 0;
};

const GoodFile& good_file();

// Removes the good file's folder (and every damaged copy) at the end.
class RemoveFiles : public ::testing::Environment {
 public:
  void TearDown() override {
    if (created()) fs::remove_all(good_file().dir);
  }
  static bool& created() {
    static bool value = false;
    return value;
  }
};
const auto* const kRemoveFiles = ::testing::AddGlobalTestEnvironment(new RemoveFiles);

const GoodFile& good_file() {
  static const GoodFile good = [] {
    GoodFile file;
    file.dir = vqa::testing::make_temp_dir("baddata");
    RemoveFiles::created() = true;
    file.path = file.dir + "/good.h5";
    const auto result = vqa::testing::run_process(
        std::string(VQA_PREP) + " synth --train-questions 64 --test-questions 16 --image-size 16" +
            " --max-len 8 -o " + file.path,
        60);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    vqa::data::hdf5_silence_errors();
    Hdf5Id h5(H5Fopen(file.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    EXPECT_TRUE(h5.valid());
    file.num_answers = vqa::data::hdf5_read_int_attribute(h5.get(), "num_answers", file.path);
    Hdf5Id tokens = vqa::data::hdf5_open_dataset(h5.get(), "/vocab/tokens", file.path);
    file.vocab_size = vqa::data::hdf5_shape(tokens.get(), "/vocab/tokens", file.path)[0];
    Hdf5Id images = vqa::data::hdf5_open_dataset(h5.get(), "/train/images", file.path);
    file.num_images = vqa::data::hdf5_shape(images.get(), "/train/images", file.path)[0];
    return file;
  }();
  return good;
}

// --- the cases -----------------------------------------------------------------

struct BadDataCase {
  BadDataCase(std::string name, std::function<void(const std::string&)> make,
              std::function<std::string()> message, bool copy = true, bool as_test_data = false,
              std::string flags = "", bool message_names_file = true,
              std::vector<std::string> more = {})
      : name(std::move(name)),
        make(std::move(make)),
        message(std::move(message)),
        copy(copy),
        as_test_data(as_test_data),
        flags(std::move(flags)),
        message_names_file(message_names_file),
        more(std::move(more)) {}

  std::string name;
  // Makes the bad input at `path` (a copy of the good file unless `copy` is false).
  std::function<void(const std::string& path)> make;
  // The message after "<path>: "; with message_names_file false, the whole
  // message (which then names the file elsewhere).
  std::function<std::string()> message;
  bool copy = true;
  bool as_test_data = false;  // the bad file is --test-data (the good one is --train-data)
  std::string flags;          // vqa_train batch flags instead of the default ones
  bool message_names_file = true;
  std::vector<std::string> more;  // more parts of the message, when its middle varies (a row)
};

std::ostream& operator<<(std::ostream& out, const BadDataCase& c) { return out << c.name; }

std::string train_prefix(const std::string& name) { return "/train/" + name; }

std::vector<BadDataCase> file_cases() {
  return {
      {"missing_file", [](const std::string&) {},
       [] { return std::string("no such dataset file"); }, false},
      {"directory", [](const std::string& path) { fs::create_directories(path); },
       [] { return std::string("is a directory, not a dataset file"); }, false},
      {"empty_file", [](const std::string& path) { std::ofstream{path}; },
       [] { return std::string("not an HDF5 file"); }, false},
      {"text_file", [](const std::string& path) { std::ofstream(path) << "qid,question\n1,a\n"; },
       [] { return std::string("not an HDF5 file"); }, false},
      {"hdf5_never_returns",  // found by fuzz_hdf5_bytes: HDF5 loops forever reading it
       [](const std::string& path) {
         fs::copy_file(
             std::string(VQA_FUZZ_HANGS) + "/hdf5_bytes/hdf5-loops-on-corrupt-global-heap.h5",
             path);
       },
       [] {
         return std::string(
             "attribute 'format': HDF5 has not returned for 15 s; the file is most "
             "likely damaged");
       },
       false},
      {"hdf5_crashes",  // found by fuzz_hdf5_bytes: HDF5 1.10 segfaults reading its global heap
       [](const std::string& path) {
         fs::copy_file(std::string(VQA_FUZZ_CRASHES) + "/hdf5_bytes/segv-in-global-heap-load.h5",
                       path);
       },
       [] {
         return std::string(kHdf5CrashesOnHeap
                                ? "attribute 'format': HDF5 crashed (SIGSEGV); the file is most "
                                  "likely damaged"
                                : "attribute 'format': cannot be read (the file is most likely "
                                  "damaged): H5Aread: can't synchronously read data");
       },
       false},
      {"truncated", [](const std::string& path) { fs::resize_file(path, fs::file_size(path) / 2); },
       [] {
         return std::string(
                    "the file is truncated, shorter than its header says (a copy or a write that "
                    "did not finish?): ") +
                kH5FopenFailed;
       }},
  };
}

std::vector<BadDataCase> header_cases() {
  return {
      {"wrong_format_name",
       [](const std::string& path) {
         with_file(path, [&](hid_t f) {
           ASSERT_GE(H5Adelete(f, vqa::data::kAttrFormat), 0);
           vqa::data::hdf5_write_string_attribute(f, vqa::data::kAttrFormat, "h5py-vqa", path);
         });
       },
       [] { return std::string("attribute 'format': is 'h5py-vqa', expected 'vqa-hpc'"); }},
      {"wrong_format_version",
       [](const std::string& path) {
         with_file(path, [](hid_t f) { set_int_attribute(f, vqa::data::kAttrFormatVersion, 99); });
       },
       [] {
         return std::string("attribute 'format_version': is 99, this build reads versions 1..3");
       }},
      {"special_token_outside_vocabulary",
       [](const std::string& path) {
         with_file(path, [](hid_t f) {
           set_int_attribute(f, vqa::data::kAttrPadTokenId, good_file().vocab_size);
         });
       },
       [] {
         const auto v = std::to_string(good_file().vocab_size);
         return "attribute 'pad_token_id': is " + v + ", outside [0, " + v +
                ") (the size of /vocab/tokens)";
       }},
      {"unknown_image_normalization",
       [](const std::string& path) {
         with_file(path, [&](hid_t f) {
           ASSERT_GE(H5Adelete(f, vqa::data::kAttrImageNormalization), 0);
           vqa::data::hdf5_write_string_attribute(f, vqa::data::kAttrImageNormalization, "imagenet",
                                                  path);
         });
       },
       [] {
         return std::string(
             "attribute 'image_normalization': is 'imagenet', expected 'dataset', 'clip' or "
             "'none'");
       }},
      {"missing_attribute",
       [](const std::string& path) {
         with_file(path, [](hid_t f) { ASSERT_GE(H5Adelete(f, vqa::data::kAttrNumAnswers), 0); });
       },
       [] { return std::string("attribute 'num_answers' is missing"); }},
      {"attribute_of_wrong_type",
       [](const std::string& path) {
         with_file(path, [&](hid_t f) {
           ASSERT_GE(H5Adelete(f, vqa::data::kAttrImageSize), 0);
           vqa::data::hdf5_write_string_attribute(f, vqa::data::kAttrImageSize, "16", path);
         });
       },
       [] { return std::string("attribute 'image_size' must be one integer, found 1 x string"); }},
      {"zero_question_length",
       [](const std::string& path) {
         with_file(path,
                   [](hid_t f) { set_int_attribute(f, vqa::data::kAttrMaxQuestionLength, 0); });
       },
       [] { return std::string("attribute 'max_question_length': is 0, expected 1..4096"); }},
      {"zero_image_std",
       [](const std::string& path) {
         with_file(path, [&](hid_t f) {
           ASSERT_GE(H5Adelete(f, vqa::data::kAttrImageStd), 0);
           vqa::data::hdf5_write_double_attribute(f, vqa::data::kAttrImageStd, {0.2, 0.0, 0.2},
                                                  path);
         });
       },
       [] { return std::string("attribute 'image_std': channel 1 is 0, expected a number > 0"); }},
      {"image_mean_not_a_number",
       [](const std::string& path) {
         with_file(path, [&](hid_t f) {
           ASSERT_GE(H5Adelete(f, vqa::data::kAttrImageMean), 0);
           vqa::data::hdf5_write_double_attribute(
               f, vqa::data::kAttrImageMean, {0.5, 0.5, std::numeric_limits<double>::quiet_NaN()},
               path);
         });
       },
       [] {
         return std::string("attribute 'image_mean': channel 2 is nan, expected a finite number");
       }},
      {"answer_vocabulary_too_short",
       [](const std::string& path) {
         with_file(path, [](hid_t f) {
           set_int_attribute(f, vqa::data::kAttrNumAnswers, good_file().num_answers + 1);
         });
       },
       [] {
         const auto k = std::to_string(good_file().num_answers);
         return "dataset '/vocab/answers': shape is [" + k + "], expected [" +
                std::to_string(good_file().num_answers + 1) + "] (-1: any)";
       }},
  };
}

std::vector<BadDataCase> split_cases() {
  namespace d = vqa::data;
  const int64_t n = 64, length = 8;
  return {
      {"missing_split",
       [](const std::string& path) { with_file(path, [](hid_t f) { delete_object(f, "/test"); }); },
       [] {
         return std::string("split 'test': no such group in the file (expected /train or /test)");
       },
       true, /*as_test_data=*/true},
      {"missing_dataset",
       [](const std::string& path) {
         with_file(path, [](hid_t f) { delete_object(f, train_prefix(d::kImageRow)); });
       },
       [] { return "dataset '" + train_prefix(d::kImageRow) + "' is missing"; }},
      {"wrong_dtype",
       [=](const std::string& path) {
         with_file(path, [=](hid_t f) {
           replace_dataset(f, train_prefix(d::kTokenIds), H5T_IEEE_F32LE,
                           {static_cast<hsize_t>(n), static_cast<hsize_t>(length)});
         });
       },
       [] {
         return "dataset '" + train_prefix(d::kTokenIds) + "': dtype is float32, expected int32";
       }},
      {"wrong_shape",
       [=](const std::string& path) {
         with_file(path, [=](hid_t f) {
           replace_dataset(f, train_prefix(d::kAttentionMask), H5T_STD_U8LE,
                           {static_cast<hsize_t>(n - 1), static_cast<hsize_t>(length)});
         });
       },
       [=] {
         return "dataset '" + train_prefix(d::kAttentionMask) +
                "': shape is [63, 8], expected [64, 8]";
       }},
      {"token_out_of_range",
       [](const std::string& path) {
         with_file(path, [](hid_t f) {
           set_element<int32_t>(f, train_prefix(d::kTokenIds), 5, 1,
                                static_cast<int32_t>(good_file().vocab_size), H5T_NATIVE_INT32);
         });
       },
       [] {
         const auto v = std::to_string(good_file().vocab_size);
         return "dataset '" + train_prefix(d::kTokenIds) + "' row 5: value " + v +
                " is outside [0, " + v + ")";
       }},
      {"image_row_out_of_range",
       [](const std::string& path) {
         with_file(path, [](hid_t f) {
           set_element<int32_t>(f, train_prefix(d::kImageRow), 7, 0, -3, H5T_NATIVE_INT32);
         });
       },
       [] {
         return "dataset '" + train_prefix(d::kImageRow) + "' row 7: value -3 is outside [0, " +
                std::to_string(good_file().num_images) + ")";
       }},
      {"label_out_of_range",
       [](const std::string& path) {
         with_file(path, [](hid_t f) {
           set_element<int32_t>(f, train_prefix(d::kTargetLabels), 9, 0,
                                static_cast<int32_t>(good_file().num_answers), H5T_NATIVE_INT32);
         });
       },
       [] {
         const auto k = std::to_string(good_file().num_answers);
         return "dataset '" + train_prefix(d::kTargetLabels) + "' row 9: value " + k +
                " is outside [-1, " + k + ")";
       }},
      {"score_not_a_number",
       [](const std::string& path) {
         with_file(path, [](hid_t f) {
           set_element<float>(f, train_prefix(d::kTargetScores), 11, 0,
                              std::numeric_limits<float>::quiet_NaN(), H5T_NATIVE_FLOAT);
         });
       },
       [] {
         return "dataset '" + train_prefix(d::kTargetScores) +
                "' row 11: score nan is outside [0, 1]";
       }},
      {"answer_type_out_of_range",
       [](const std::string& path) {
         with_file(path, [](hid_t f) {
           set_element<uint8_t>(f, train_prefix(d::kAnswerType), 13, 0, 2, H5T_NATIVE_UINT8);
         });
       },
       [] {
         return "dataset '" + train_prefix(d::kAnswerType) + "' row 13: value 2 is outside [0, 2)";
       }},
      {"fewer_questions_than_a_global_batch", [](const std::string&) {},
       [] {
         return "the train split of " + good_file().dir +
                "/fewer_questions_than_a_global_batch.h5 has 64 questions, fewer than one "
                "--global-batch of 128";
       },
       true, false, "--global-batch 128 --batch-per-rank 64 --drop-last true",
       /*message_names_file=*/false},
      {"damaged_image_chunk",  // images are not read on open: found by the first batch
       [](const std::string& path) {
         const auto repack = vqa::testing::run_process(
             "h5repack -f /train/images:FLET " + good_file().path + " " + path, 60);
         ASSERT_EQ(repack.exit_code, 0) << repack.output;
         damage_every_chunk(path, train_prefix(d::kImages));
       },
       [] { return "dataset '" + train_prefix(d::kImages) + "' row "; },
       false,
       false,
       "",
       true,
       {std::string(": cannot be read (a damaged chunk?): ") + kH5DreadFailed, kChecksumFailed}},
  };
}

class BadDataAcrossRanks : public ::testing::TestWithParam<BadDataCase> {};

TEST(BadDataAcrossRanksBaseline, TheGoodFileTrains) {
  // The same command line on the undamaged file succeeds: the cases below
  // fail because of their damage, not because of the command.
  const GoodFile& good = good_file();
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + VQA_TRAIN + " --train-data " + good.path + " --out " +
          good.dir + "/run-good --preset tiny --epochs 1 --global-batch 8 --batch-per-rank 4" +
          " --max-steps-per-epoch 1 --eval-every 0 --save-every 0 --threads 1 --progress off",
      120);
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

TEST_P(BadDataAcrossRanks, EveryRankEndsWithTheMessage) {
  const BadDataCase& bad = GetParam();
  const GoodFile& good = good_file();
  const std::string path = good.dir + "/" + bad.name + ".h5";
  if (bad.copy) fs::copy_file(good.path, path, fs::copy_options::overwrite_existing);
  bad.make(path);
  const std::string data = bad.as_test_data ? " --train-data " + good.path + " --test-data " + path
                                            : " --train-data " + path;
  const std::string out = good.dir + "/run-" + bad.name;
  const std::string flags = bad.flags.empty() ? "--global-batch 8 --batch-per-rank 4" : bad.flags;
  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + VQA_TRAIN + data + " --out " + out +
          " --preset tiny --epochs 1 --max-steps-per-epoch 1 --eval-every 0 --save-every 0" +
          " --threads 1 --progress off " + flags,
      2 * kDeadlineSeconds);
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_LT(result.seconds, kDeadlineSeconds) << result.output;
  // mpirun returns once every rank has ended, with the status of the rank
  // that ended the job (runtime::fatal_user_error: 2, through MPI_Abort).
  EXPECT_EQ(result.exit_code, kUserErrorExit) << result.output;
  const std::string expected = bad.message_names_file ? path + ": " + bad.message() : bad.message();
  EXPECT_NE(result.output.find("[vqa] error on rank "), std::string::npos) << result.output;
  for (const std::string& part : bad.more) {
    EXPECT_NE(result.output.find(part), std::string::npos) << part << "\n" << result.output;
  }
  EXPECT_NE(result.output.find(expected), std::string::npos)
      << "expected: " << expected << "\noutput:\n"
      << result.output;
  // Each rank prints the message when it finds the damage, but the first rank
  // to abort ends the others (MPI_Abort), so a rank that is behind may be
  // ended before it prints: recorded, not asserted. Its exit is what counts.
  int ranks_reporting = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line = "[vqa] error on rank " + std::to_string(rank) + "/2 (";
    const size_t at = result.output.find(line);
    if (at != std::string::npos && result.output.find(expected, at) != std::string::npos) {
      ++ranks_reporting;
    }
  }
  RecordProperty("ranks_reporting", ranks_reporting);
  std::printf("%s: %d of 2 ranks printed the message; ended in %.1f s\n", bad.name.c_str(),
              ranks_reporting, result.seconds);
  // Nothing was trained: no run log line of a finished epoch.
  EXPECT_EQ(result.output.find("best overall accuracy"), std::string::npos) << result.output;
}

INSTANTIATE_TEST_SUITE_P(File, BadDataAcrossRanks, ::testing::ValuesIn(file_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Header, BadDataAcrossRanks, ::testing::ValuesIn(header_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Split, BadDataAcrossRanks, ::testing::ValuesIn(split_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
