// vqa_prep as a user runs it: synth, inspect, the hdf5-tools, convert on a
// VQA-RAD / SLAKE style fixture written here (JSON + PNG and JPEG images),
// and one test per bad input. Each bad-input test checks the exit status,
// that the message names file, record and field, and that no output is left.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "data/dataset_reader.h"  // DatasetReader
#include "prep_fixture.h"         // Fixture, record, write_json
#include "process.h"              // run_process, mpirun_prefix, make_temp_dir

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using vqa::testing::Fixture;
using vqa::testing::kPrep;
using vqa::testing::record;
using vqa::testing::run_process;
using vqa::testing::write_json;

const std::string kProbe = VQA_BAD_FILE_PROBE;

TEST(Prep, SynthIsValidAndReadableByTheHdf5Tools) {
  const std::string file = vqa::testing::make_temp_dir("synth") + "/synth.h5";
  auto result =
      run_process(kPrep + " synth --train-questions 300 --test-questions 100 -o " + file, 60);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("train 300 questions"), std::string::npos) << result.output;
  result = run_process(kPrep + " inspect " + file, 60);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("valid: every split checked"), std::string::npos) << result.output;
  result = run_process("h5ls -r " + file, 60);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("/train/images"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("/test/targets/labels"), std::string::npos) << result.output;
  result = run_process("h5dump -H " + file, 60);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("format_version"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("H5T_STD_U8LE"), std::string::npos) << result.output;
}

TEST(Prep, ConvertVqaRadGivesExpectedLabelsTargetsAndImages) {
  Fixture fixture("convert");
  const auto result = run_process(fixture.command(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("1 test answers outside the label set (e.g. 'right')"),
            std::string::npos)
      << result.output;
  vqa::data::DatasetReader train(fixture.output, "train");
  EXPECT_EQ(train.info().format_version, vqa::data::kFormatVersion);
  EXPECT_EQ(train.info().tokenizer, "word");
  EXPECT_EQ(train.info().special_tokens.pad, vqa::data::kPadToken);
  EXPECT_EQ(train.info().special_tokens.cls, vqa::data::kClassToken);
  EXPECT_EQ(train.info().special_tokens.eos, -1);
  EXPECT_EQ(train.info().special_tokens.unk, vqa::data::kUnknownToken);
  EXPECT_EQ(train.info().tokenizer_sha256, "");
  EXPECT_EQ(train.info().image_normalization, "dataset");
  EXPECT_EQ(train.info().question_types, std::vector<std::string>{"PRES"});
  // By frequency ("yes" twice), then alphabetically; normalised as VQA evaluation does.
  EXPECT_EQ(train.info().answer_labels,
            (std::vector<std::string>{"yes", "2", "left", "no", "x ray"}));
  EXPECT_EQ(train.info().num_images, 3);
  const auto records = train.read_records(0, 6);
  const std::vector<std::string> images = {"a.png", "b.jpg", "sub/c.png",
                                           "a.png", "b.jpg", "sub/c.png"};
  const std::vector<int32_t> labels = {0, 3, 2, 4, 1, 0};
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].image_name, images[i]);
    EXPECT_EQ(records[i].image_row, static_cast<int64_t>(i % 3));
    EXPECT_EQ(records[i].labels, std::vector<int32_t>{labels[i]});
    EXPECT_EQ(records[i].scores, std::vector<float>{1.0f});
  }
  EXPECT_EQ(records[0].answer_type, 0);
  EXPECT_EQ(records[2].answer_type, 1);
  vqa::data::DatasetReader test(fixture.output, "test");
  const auto test_records = test.read_records(0, 3);
  EXPECT_EQ(test_records[0].labels, std::vector<int32_t>{0});
  EXPECT_TRUE(test_records[1].labels.empty()) << "'right' is outside the label set";
  EXPECT_EQ(test_records[2].labels, std::vector<int32_t>{1}) << "'two' normalises to '2'";

  // Pixels through the loader (no MPI: default driver). A solid colour stays
  // solid under bicubic resizing: PNG exact to rounding (0.5 grey levels),
  // JPEG within 4 (lossy coding); also checks BGR -> RGB.
  vqa::data::Batch batch;
  ASSERT_TRUE(fixture.first_train_batch(batch));
  EXPECT_TRUE(batch.question_type.equal(torch::zeros({6}, torch::kInt64)))
      << "every fixture question is of type PRES, code 0: " << batch.question_type;
  const auto& info = test.info();
  const auto mean = torch::tensor(info.image_mean).to(torch::kFloat32).view({3, 1, 1});
  const auto std = torch::tensor(info.image_std).to(torch::kFloat32).view({3, 1, 1});
  const auto rgb = [&](int64_t i) { return (batch.images[i] * std + mean) * 255.0f; };
  const std::vector<std::vector<float>> colours = {{200, 10, 50}, {0, 255, 0}, {0, 0, 255}};
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t c = 0; c < 3; ++c) {
      const float tolerance = i == 1 ? 4.0f : 0.5f;
      EXPECT_LE((rgb(i)[c] - colours[i][c]).abs().max().item<float>(), tolerance)
          << "image " << i << " channel " << c;
    }
  }
}

TEST(Prep, ConvertSlakeKeepsEnglishAndFolders) {
  Fixture fixture("slake");
  fixture.train = json::array();
  for (int i = 0; i < 4; ++i) {
    fixture.train.push_back({{"qid", i},
                             {"img_name", "sub/c.png"},
                             {"question", "Is this a CT?"},
                             {"answer", i % 2 ? "Yes" : "No"},
                             {"answer_type", "CLOSED"},
                             {"content_type", "Modality"},
                             {"q_lang", i == 3 ? "zh" : "en"}});
  }
  fixture.test = json::array({fixture.train[0]});
  const auto result = run_process(fixture.command(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("train 3 questions"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("1 in another language than 'en'"), std::string::npos)
      << result.output;
}

struct BadCase {
  std::string name, field, value;
  std::function<void(Fixture&)> damage;
  bool skippable;
};

std::vector<BadCase> bad_cases() {
  return {
      {"missing image", "image_name", "no such image file",
       [](Fixture& f) { f.train[1]["image_name"] = "missing.png"; }, true},
      {"unreadable image", "image_name", "cannot decode image",
       [](Fixture& f) {
         std::ofstream(f.images + "/broken.png") << "not a png";
         f.train[1]["image_name"] = "broken.png";
       },
       true},
      {"unknown answer_type", "answer_type", "unknown value 'MAYBE'",
       [](Fixture& f) { f.train[1]["answer_type"] = "maybe"; }, true},
      {"duplicate qid", "qid", "duplicate qid 1", [](Fixture& f) { f.train[1]["qid"] = 1; }, true},
      {"escaping name", "image_name", "'../a.png' contains '..'",
       [](Fixture& f) { f.train[1]["image_name"] = "../a.png"; }, true},
      {"absolute name", "image_name", "'/etc/passwd' is an absolute path",
       [](Fixture& f) { f.train[1]["image_name"] = "/etc/passwd"; }, true},
      {"structured answer", "answer", "is an array, expected a string or number",
       [](Fixture& f) {
         f.train[1]["answer"] = json::array({1, 2});
       },
       true},
      {"structured answer_type", "answer_type", "is an object, expected CLOSED or OPEN",
       [](Fixture& f) {
         f.train[1]["answer_type"] = json::object({{"CLOSED", true}});
       },
       true},
  };
}

TEST(PrepBadInput, StrictFailsNamingFileRecordAndFieldAndLeavesNoOutput) {
  for (const BadCase& bad : bad_cases()) {
    SCOPED_TRACE(bad.name);
    Fixture fixture("bad");
    bad.damage(fixture);
    const auto result = run_process(fixture.command("--strict"), 60);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(fixture.train_json + ": record 1"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("field '" + bad.field + "'"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(bad.value), std::string::npos) << result.output;
    EXPECT_FALSE(fixture.output_left());
  }
}

TEST(PrepBadInput, ByDefaultABadRecordIsSkippedAndCounted) {
  for (const BadCase& bad : bad_cases()) {
    SCOPED_TRACE(bad.name);
    Fixture fixture("skip");
    bad.damage(fixture);
    const auto result = run_process(fixture.command(), 60);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("skipping " + fixture.train_json + ": record 1"),
              std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("1 records skipped"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("train 5 questions"), std::string::npos) << result.output;
  }
}

TEST(PrepBadInput, MalformedJsonFailsAndLeavesNoOutput) {
  Fixture fixture("json");
  fixture.command();  // writes the JSON files
  std::ofstream(fixture.test_json) << "[{\"qid\": 1,";
  const std::string command = kPrep + " convert --train-json " + fixture.train_json +
                              " --test-json " + fixture.test_json + " --images " + fixture.images +
                              " -o " + fixture.output;
  const auto result = run_process(command, 60);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(fixture.test_json + ": malformed JSON"), std::string::npos)
      << result.output;
  EXPECT_FALSE(fixture.output_left());
}

TEST(PrepBadInput, EmptySplitFailsAndLeavesNoOutput) {
  Fixture fixture("empty");
  fixture.test = json::array({record(101, "missing.png", "Is it?", "yes", "CLOSED")});
  const auto result = run_process(fixture.command(), 60);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(fixture.test_json + ": split 'test' has no usable records"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(fixture.output_left());
}

// --keep-source-images: the train split also holds each image as decoded
// (RGB, its own size), byte for byte what OpenCV decodes from the file; the
// stored squares are those of a conversion without it; the test split has
// none. With --features it is refused.
TEST(Prep, ConvertKeepsTheTrainSplitsSourceImages) {
  Fixture plain("sources-plain");
  ASSERT_EQ(run_process(plain.command(), 120).exit_code, 0);
  Fixture fixture("sources");
  const auto result = run_process(fixture.command("--keep-source-images"), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  vqa::data::DatasetReader train(fixture.output, "train");
  vqa::data::DatasetReader test(fixture.output, "test");
  vqa::data::DatasetReader plain_train(plain.output, "train");
  EXPECT_EQ(train.info().format_version, 3);
  ASSERT_TRUE(train.info().has_source_images);
  EXPECT_FALSE(test.info().has_source_images);
  EXPECT_FALSE(plain_train.info().has_source_images);
  EXPECT_EQ(train.read_pixels({0, 1, 2}), plain_train.read_pixels({0, 1, 2}));
  const auto sources = train.read_source_images({0, 1, 2});
  const std::vector<std::string> files = {"a.png", "b.jpg", "sub/c.png"};
  for (size_t i = 0; i < files.size(); ++i) {
    SCOPED_TRACE(files[i]);
    cv::Mat bgr = cv::imread(fixture.images + "/" + files[i], cv::IMREAD_COLOR);
    cv::Mat rgb;
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
    ASSERT_EQ(sources[i].width, rgb.cols);
    ASSERT_EQ(sources[i].height, rgb.rows);
    EXPECT_TRUE(std::equal(sources[i].rgb.begin(), sources[i].rgb.end(), rgb.data));
  }
  EXPECT_EQ(sources[0].width, 40);  // the fixture's sizes: not square, not the stored 24
  EXPECT_EQ(sources[2].height, 48);

  const auto refused =
      run_process(fixture.command("--keep-source-images --features " + fixture.dir + "/f.h5"), 60);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--keep-source-images stores the decoded images; --features"),
            std::string::npos)
      << refused.output;
}

// Rewrites one value of a good file, as corruption or a foreign writer would.
void damage_file(const std::string& path, const std::string& what) {
  vqa::data::hdf5_silence_errors();
  vqa::data::Hdf5Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  ASSERT_TRUE(file.valid());
  // Writes `value` at the element `coordinates` (one per dimension) of a dataset.
  auto write_one = [&](const char* name, const std::vector<hsize_t>& coordinates, hid_t memory_type,
                       const void* value) {
    vqa::data::Hdf5Id dataset(H5Dopen2(file.get(), name, H5P_DEFAULT));
    vqa::data::Hdf5Id space(H5Dget_space(dataset.get()));
    ASSERT_GE(H5Sselect_elements(space.get(), H5S_SELECT_SET, 1, coordinates.data()), 0);
    const hsize_t one = 1;
    vqa::data::Hdf5Id memory(H5Screate_simple(1, &one, nullptr));
    ASSERT_GE(H5Dwrite(dataset.get(), memory_type, memory.get(), space.get(), H5P_DEFAULT, value),
              0);
  };
  if (what == "version") {
    ASSERT_GE(H5Adelete(file.get(), "format_version"), 0);
    vqa::data::hdf5_write_int_attribute(file.get(), "format_version", 99, path);
  } else if (what == "source_offsets") {
    const int64_t value = 5;
    write_one("/train/source_images/offsets", {2}, H5T_NATIVE_INT64, &value);
  } else if (what == "source_shapes") {
    const int32_t value = 0;  // image 1's height
    write_one("/train/source_images/shapes", {1, 0}, H5T_NATIVE_INT32, &value);
  } else {
    vqa::data::Hdf5Id dataset(H5Dopen2(file.get(), "/train/questions/image_row", H5P_DEFAULT));
    vqa::data::Hdf5Id space(H5Dget_space(dataset.get()));
    const hsize_t row = 3, one = 1;
    const int32_t value = 9999;
    ASSERT_GE(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &row, nullptr, &one, nullptr), 0);
    vqa::data::Hdf5Id memory(H5Screate_simple(1, &one, nullptr));
    ASSERT_GE(
        H5Dwrite(dataset.get(), H5T_NATIVE_INT32, memory.get(), space.get(), H5P_DEFAULT, &value),
        0);
  }
}

// A file on which HDF5 1.10 itself segfaults (tests/fuzz/hdf5_crashes/):
// the message names the file and what was being read, exit status 1. HDF5
// 1.14 reports the damage instead (its lookup of the attribute fails), which
// is not to be taken for a missing attribute.
TEST(BadFile, InspectNamesAFileThatCrashesHdf5) {
  const std::string file =
      std::string(VQA_FUZZ_CRASHES) + "/hdf5_bytes/segv-in-global-heap-load.h5";
  const auto result = run_process(kPrep + " inspect " + file, 60);
  EXPECT_EQ(result.exit_code, 1) << result.output;
#if H5_VERSION_GE(1, 14, 0)
  const std::string message =
      ": attribute 'created_by': cannot be read (the file is most likely damaged): H5Aexists: "
      "can't synchronously check if attribute exists";
#else
  const std::string message =
      ": attribute 'created_by': HDF5 crashed (SIGSEGV); the file is most likely damaged";
#endif
  EXPECT_NE(result.output.find("vqa_prep inspect: error: " + file + message), std::string::npos)
      << result.output;
}

// A file on which HDF5 1.10 loops forever (tests/fuzz/hangs/): inspect gives
// up after 15 s without progress, naming the file, with exit status 1.
TEST(BadFile, InspectGivesUpOnAFileOnWhichHdf5NeverReturns) {
  const std::string file =
      std::string(VQA_FUZZ_HANGS) + "/hdf5_bytes/hdf5-loops-on-corrupt-global-heap.h5";
  const auto result = run_process(kPrep + " inspect " + file, 60);
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_LT(result.seconds, 30.0) << result.output;  // 15 s of no progress, then the message
  EXPECT_NE(result.output.find("vqa_prep inspect: error: " + file + ": attribute '"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find(": HDF5 has not returned for 15 s; the file is most likely damaged"),
            std::string::npos)
      << result.output;
}

TEST(BadFile, EveryRankReportsItAndExitsWithinSeconds) {
  const std::string dir = vqa::testing::make_temp_dir("badfile");
  ASSERT_EQ(
      run_process(kPrep + " synth --train-questions 200 --test-questions 50 --source-size 24 -o " +
                      dir + "/good.h5",
                  60)
          .exit_code,
      0);
  // The good file passes: the probe is not failing for another reason.
  const std::string good_probe = vqa::testing::mpirun_prefix(2) + kProbe + " " + dir + "/good.h5";
  auto result = run_process(good_probe, 60);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // A loader destroyed after MPI_Finalize (its collective close can no longer
  // run) says so; in the right order it does not. vqa_train's shutdown order
  // is tested against this message (train_runs).
  EXPECT_EQ(result.output.find("outlived MPI_Finalize"), std::string::npos) << result.output;
  result = run_process(good_probe + " --finalize-first", 60);
  EXPECT_NE(result.output.find("the loader of " + dir + "/good.h5 outlived MPI_Finalize"),
            std::string::npos)
      << result.output;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"version", "attribute 'format_version': is 99, this build reads versions 1..3"},
      {"image_row", "dataset '/train/questions/image_row' row 3: value 9999 is outside [0, 100)"},
      // Format version 3's source images (24 x 24 x 3 = 1728 bytes each).
      {"source_offsets",
       "dataset '/train/source_images/offsets' row 2: value 5 is not 3456, where the previous "
       "image ends"},
      {"source_shapes",
       "dataset '/train/source_images/shapes' row 1: height x width 0x24 is outside 1..16384"}};
  for (const auto& [what, message] : cases) {
    SCOPED_TRACE(what);
    const std::string file = dir + "/" + what + ".h5";
    fs::copy_file(dir + "/good.h5", file);
    damage_file(file, what);
    result = run_process(vqa::testing::mpirun_prefix(2) + kProbe + " " + file, 60);
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_LT(result.seconds, 20.0) << "mpirun ends within seconds of the abort";
    EXPECT_NE(result.output.find(file + ": " + message), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("error on rank"), std::string::npos) << result.output;
    result = run_process(kPrep + " inspect " + file, 60);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << result.output;
  }
}

}  // namespace
