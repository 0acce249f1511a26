// The VQA-RAD style fixture of the vqa_prep tests (test_prep.cpp,
// test_prep_m3ae.cpp): JSON records and solid-colour PNG and JPEG images in a
// fresh folder, and the convert command line over them.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <string>

#include "data/loader.h"  // ShardedLoader, Batch
#include "process.h"      // make_temp_dir

namespace vqa::testing {

using nlohmann::json;

inline const std::string kPrep = VQA_PREP;

inline json record(int64_t qid, const std::string& image, const std::string& question, json answer,
                   const std::string& type) {
  return {{"qid", qid},
          {"image_name", image},
          {"question", question},
          {"answer", answer},
          {"answer_type", type},
          {"question_type", "PRES"},
          {"phrase_type", "freeform"},
          {"image_organ", "CHEST"}};
}

inline void write_json(const std::string& path, const json& value) {
  std::ofstream(path) << value.dump(1);
}

inline void write_image(const std::string& path, int width, int height, cv::Scalar bgr) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  ASSERT_TRUE(cv::imwrite(path, cv::Mat(height, width, CV_8UC3, bgr))) << path;
}

// A VQA-RAD style fixture: 3 training images (PNG, JPEG, PNG in a
// subfolder, none square), 6 training and 3 test questions.
struct Fixture {
  std::string dir, images, train_json, test_json, output;
  json train, test;

  explicit Fixture(const std::string& tag) {
    dir = make_temp_dir(tag);
    images = dir + "/images";
    train_json = dir + "/train.json";
    test_json = dir + "/test.json";
    output = dir + "/out/rad.h5";
    std::filesystem::create_directories(dir + "/out");
    write_image(images + "/a.png", 40, 30, cv::Scalar(50, 10, 200));  // RGB (200, 10, 50)
    write_image(images + "/b.jpg", 30, 50, cv::Scalar(0, 255, 0));
    write_image(images + "/sub/c.png", 64, 48, cv::Scalar(255, 0, 0));
    train = json::array({record(1, "a.png", "Is there a mass?", "Yes", "CLOSED"),
                         record(2, "b.jpg", "Is the heart enlarged?", "no", "closed"),
                         record(3, "sub/c.png", "Which side is the lesion on?", "Left.", "OPEN"),
                         record(4, "a.png", "What modality is this?", "the X-ray", "OPEN"),
                         record(5, "b.jpg", "How many masses?", 2, "OPEN"),
                         record(6, "sub/c.png", "Is there a mass?", "yes ", "CLOSED")});
    test = json::array({record(101, "b.jpg", "Is there a mass?", "YES", "CLOSED"),
                        record(102, "a.png", "Which side?", "Right", "OPEN"),
                        record(103, "sub/c.png", "How many lesions?", "two", "OPEN")});
  }
  std::string command(const std::string& extra = "") {
    write_json(train_json, train);
    write_json(test_json, test);
    return kPrep + " convert --train-json " + train_json + " --test-json " + test_json +
           " --images " + images + " --image-size 24 -o " + output + " " + extra + " 2>&1";
  }
  // The first `count` training samples in file order, read as training
  // reads them (no MPI: HDF5's default driver). False when there is none.
  bool first_train_batch(vqa::data::Batch& batch, int64_t count = 6) const {
    vqa::data::LoaderOptions options;
    options.batch_per_rank = count;
    options.shuffle = false;
    vqa::data::ShardedLoader loader(output, "train", options);
    loader.start_epoch(0);
    return loader.next(batch);
  }
  bool output_left() const {
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/out")) {
      (void)entry;
      return true;
    }
    return false;
  }
};

}  // namespace vqa::testing
