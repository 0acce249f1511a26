// vqa_prep convert --medvqa2019: VQA-Med 2019's release layout as M3AE reads
// it (per split QA/{Modality,Organ,Plane}.csv, `image_id|question|answer`,
// images/<image_id>.jpg), M3AE's question ids and label set, and its bad
// input: a missing field, an unknown image, an empty file and a duplicate
// image id each end the conversion naming the file and the line, with no
// output left behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "answer_text.h"          // answer_normalize_m3ae
#include "data/dataset_reader.h"  // DatasetReader
#include "prep_fixture.h"         // write_image, kPrep
#include "process.h"              // run_process, make_temp_dir

namespace {

namespace fs = std::filesystem;
using vqa::testing::kPrep;
using vqa::testing::run_process;

// Three splits; every split has the three category files. The questions
// keep their spaces as the files have them.
struct MedVqaFixture {
  std::string root, output;
  std::map<std::string, std::map<std::string, std::string>> files;  // split -> category -> text

  MedVqaFixture() {
    const std::string dir = vqa::testing::make_temp_dir("medvqa");
    root = dir + "/VQAMed2019";
    output = dir + "/out/medvqa.h5";
    fs::create_directories(dir + "/out");
    const std::map<std::string, std::vector<std::string>> images = {
        {"train", {"synpic100", "synpic101", "synpic102"}},
        {"val", {"synpic200"}},
        {"test", {"synpic300", "synpic301"}}};
    for (const auto& [split, ids] : images) {
      for (const std::string& id : ids) {
        vqa::testing::write_image(root + "/" + split + "/images/" + id + ".jpg", 32, 24,
                                  cv::Scalar(40, 80, 160));
      }
    }
    files["train"]["Modality"] =
        "synpic100|what modality is shown?|ct\nsynpic101|which imaging modality is this? |mr - "
        "flair\nsynpic102|what was this image taken with?|xr - plain film\n";
    files["train"]["Organ"] =
        "synpic100|what organ system is shown?|skull and contents\nsynpic101|what part of the "
        "body is this?|lung, mediastinum, pleura\n";
    files["train"]["Plane"] = "synpic100|which plane is this image in?|axial\n";
    files["val"]["Modality"] = "synpic200|what modality is shown?|us\n";
    files["val"]["Organ"] = "synpic200|what organ is shown?|gastrointestinal\n";
    files["val"]["Plane"] = "synpic200|in what plane was this taken?|longitudinal\n";
    files["test"]["Modality"] = "synpic300|what modality is shown?|ct\n";
    files["test"]["Organ"] = "synpic300|what organ system is shown?|skull and contents\n";
    files["test"]["Plane"] = "synpic301|which plane?|sagittal\r\nsynpic300|what plane?|axial\r\n";
  }
  std::string path(const std::string& split, const std::string& category) const {
    return root + "/" + split + "/QA/" + category + ".csv";
  }
  std::string command(const std::string& extra = "") {
    for (const auto& [split, categories] : files) {
      for (const auto& [category, text] : categories) {
        fs::create_directories(root + "/" + split + "/QA");
        std::ofstream(path(split, category), std::ios::binary) << text;
      }
    }
    return kPrep + " convert --medvqa2019 " + root + " --image-size 16 -o " + output + " " + extra +
           " 2>&1";
  }
  bool output_left() const { return !fs::is_empty(fs::path(output).parent_path()); }
};

TEST(PrepMedVqa, ConvertsTheReleaseAsM3aeReadsIt) {
  MedVqaFixture fixture;
  const auto result = run_process(fixture.command("--include-test-answers"), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  vqa::data::DatasetReader train(fixture.output, "train");
  EXPECT_EQ(train.info().num_questions, 6);
  EXPECT_EQ(train.info().num_images, 3);
  EXPECT_EQ(train.info().question_types, (std::vector<std::string>{"MODALITY", "ORGAN", "PLANE"}));
  const auto records = train.read_records(0, 6);
  // M3AE's ids: lines counted over train (Modality, Organ, Plane), val, test.
  std::vector<int64_t> qids;
  for (const auto& r : records) qids.push_back(r.question_id);
  EXPECT_EQ(qids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(records[1].question_text, "which imaging modality is this?");
  EXPECT_EQ(records[1].answer_text, "mr - flair");
  EXPECT_EQ(records[3].question_type, "ORGAN");
  EXPECT_EQ(records[5].question_type, "PLANE");
  for (const auto& r : records) EXPECT_EQ(r.answer_type, 1) << "every question is open";

  vqa::data::DatasetReader test(fixture.output, "test");
  const auto test_records = test.read_records(0, test.info().num_questions);
  ASSERT_EQ(test_records.size(), 4u);
  EXPECT_EQ(test_records.front().question_id, 9) << "after 6 train and 3 val lines";
  EXPECT_EQ(test_records.back().answer_text, "axial") << "CRLF line ends dropped";
  // Labels from train + val + test: 10 distinct answers, val's among them.
  EXPECT_EQ(train.info().num_answers, 10);
  const auto& labels = train.info().answer_labels;
  EXPECT_NE(std::find(labels.begin(), labels.end(), "longitudinal"), labels.end());
  EXPECT_NE(std::find(labels.begin(), labels.end(), "sagittal"), labels.end());
}

// Each case: a change to one file, --strict or not, and what the message names.
TEST(PrepMedVqa, BadInputNamesFileAndLineAndLeavesNothing) {
  struct Case {
    std::string name, split, category, text, extra, expected;
  };
  const std::vector<Case> cases = {
      {"missing field", "train", "Organ",
       "synpic100|what organ system is shown?|skull and contents\nsynpic101|what part?\n",
       "--strict", "Organ.csv: line 2: field 'answer': is missing"},
      {"unknown image", "train", "Plane", "synpic999|which plane is this image in?|axial\n",
       "--strict", "Plane.csv: line 1: field 'image_id': 'synpic999': no image"},
      {"empty file", "val", "Organ", "\n  \n", "", "Organ.csv: empty"},
      {"duplicate id", "test", "Plane", "synpic301|which plane?|sagittal\nsynpic301|again?|axial\n",
       "--strict",
       "Plane.csv: line 2: field 'image_id': duplicate image_id 'synpic301' (first at "
       "line 1)"},
      {"missing file", "test", "Modality", "", "", "Modality.csv: cannot open"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    MedVqaFixture fixture;
    fixture.files[c.split][c.category] = c.text;
    std::string command = fixture.command(c.extra);
    if (c.name == "missing file") fs::remove(fixture.path(c.split, c.category));
    const auto result = run_process(command, 60);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find(fixture.path(c.split, c.category)), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << result.output;
    EXPECT_FALSE(fixture.output_left());
  }
  // Without --strict a bad line is skipped, named, and the rest converts.
  MedVqaFixture fixture;
  fixture.files["train"]["Plane"] = "synpic999|which plane?|axial\nsynpic100|plane?|axial\n";
  const auto result = run_process(fixture.command(), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Plane.csv: line 1: field 'image_id'"), std::string::npos)
      << result.output;
  EXPECT_EQ(vqa::data::DatasetReader(fixture.output, "train").info().num_questions, 6);
}

// M3AE's normalize_word (its preprocessing's glossary) on the lower-cased
// answer; the expected values are what M3AE's Python gives for each input.
// Exact equality.
TEST(M3aeAnswerNormalization, GivesM3aesLabels) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"mr - flair", "mr flair"},  // "- ": the hyphen is deleted
      {"x-ray", "x ray"},          // elsewhere it becomes a space
      {"T2-weighted?", "t2 weighted"},
      {"lung, mediastinum, pleura", "lung mediastinum pleura"},
      {"1,000 (approx)", "1000 approx"},  // digit,digit: every mark is deleted
      {"left-sided, 2,5 cm", "leftsided 25 cm"},
      {"head/neck", "head neck"},
      {"i.v. contrast", "iv contrast"},  // periods not before a digit go
      {"a.b 2.5", "ab 2.5"},
      {"x" + std::string(33, '.') + "y", "x.y"},  // at most 32 of them
      {"dont know", "don't know"},                // contractions
      {"The two kidneys", "2 kidneys"},           // articles, number words
      {"none", "0"},
      {"what ?", "what"},
      {"CT w/contrast (IV)", "ct w contrast iv"},
      {"Yes!", "yes"}};
  for (const auto& [answer, expected] : cases) {
    EXPECT_EQ(vqa::prep::answer_normalize_m3ae(answer), expected) << answer;
  }
}

// With --answer-normalization m3ae the labels are M3AE's.
TEST(PrepMedVqa, M3aeAnswerNormalizationBuildsM3aesLabels) {
  MedVqaFixture fixture;
  const auto result =
      run_process(fixture.command("--include-test-answers --answer-normalization m3ae"), 120);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto labels = vqa::data::DatasetReader(fixture.output, "train").info().answer_labels;
  EXPECT_NE(std::find(labels.begin(), labels.end(), "mr flair"), labels.end());
  EXPECT_NE(std::find(labels.begin(), labels.end(), "xr plain film"), labels.end());
  EXPECT_EQ(labels.size(), 10u);
}

// --medvqa2019 with JSON options, and --val-json without the label option.
TEST(PrepMedVqa, RefusesContradictoryOptions) {
  MedVqaFixture fixture;
  auto result = run_process(fixture.command("--train-json x.json"), 60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("give no --train-json"), std::string::npos) << result.output;
  result = run_process(kPrep +
                           " convert --train-json a.json --test-json b.json --val-json c.json "
                           "--images . -o " +
                           fixture.output + " 2>&1",
                       60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--val-json adds answers to the label set only"), std::string::npos)
      << result.output;
  EXPECT_FALSE(fixture.output_left());
}

}  // namespace
