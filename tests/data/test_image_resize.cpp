// vqa_prep's image transform (src/data/image_resample.h) against Pillow's:
// JPEG photos and scans of 300x200 .. 2048x1536 with structure, noise and
// edges (colour and greyscale), written here with OpenCV, resized to the
// side S (384 as M3AE fine-tunes, 224 as CLIP evaluates) by
// image_load_square, the function convert uses, and by
// pil_reference_resize.py (Pillow, as torchvision calls it). Also the size
// and crop rules of torchvision, case by case; and RandomResizedCrop's
// crop + resize for given boxes against Pillow (pil_reference_crop.py) and
// its box sampling over many draws.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "convert_images.h"       // image_load_square
#include "data/image_resample.h"  // image_plan_square
#include "process.h"              // run_process, make_temp_dir
#include "util/splitmix64.h"      // SplitMix64

namespace {

namespace fs = std::filesystem;
using vqa::testing::run_process;

const std::string kReference = std::string(VQA_TEST_DATA_DIR) + "/pil_reference_resize.py";

// The first interpreter that imports PIL: Debian's python3-pil is for
// /usr/bin/python3, which need not be the python3 first on PATH.
std::string python_with_pil() {
  std::vector<std::string> candidates;
  if (const char* chosen = std::getenv("PYTHON")) candidates.emplace_back(chosen);
  candidates.insert(candidates.end(), {"/usr/bin/python3", "python3"});
  for (const auto& candidate : candidates) {
    if (run_process(candidate + " -c 'import PIL' 2>/dev/null", 60).exit_code == 0) {
      return candidate;
    }
  }
  return "";
}

// A photo- or scan-like image: a gradient, shapes with hard edges, thin
// lines, text, then Gaussian noise (as sensor noise), in colour or grey.
cv::Mat synthetic_photo(int width, int height, bool grey, uint64_t seed) {
  vqa::util::SplitMix64 random(seed);
  auto uniform = [&](int n) { return static_cast<int>(random.below(static_cast<uint64_t>(n))); };
  cv::Mat image(height, width, CV_8UC3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      image.at<cv::Vec3b>(y, x) =
          cv::Vec3b(static_cast<uint8_t>(255 * x / width), static_cast<uint8_t>(255 * y / height),
                    static_cast<uint8_t>(128 + 100 * std::sin(x * 0.05)));
    }
  }
  auto colour = [&] { return cv::Scalar(uniform(256), uniform(256), uniform(256)); };
  for (int i = 0; i < 12; ++i) {
    cv::circle(image, {uniform(width), uniform(height)}, 5 + uniform(width / 6), colour(),
               uniform(3) == 0 ? -1 : 1 + uniform(6), cv::LINE_AA);
    cv::rectangle(
        image,
        cv::Rect(uniform(width), uniform(height), 5 + uniform(width / 4), 5 + uniform(height / 4)),
        colour(), uniform(2) ? -1 : 2);
    cv::line(image, {uniform(width), uniform(height)}, {uniform(width), uniform(height)}, colour(),
             1, cv::LINE_8);
  }
  for (int i = 0; i < 4; ++i) {
    cv::putText(image, "L4-L5 T2 3.5cm", {uniform(width), uniform(height)},
                cv::FONT_HERSHEY_SIMPLEX, 0.4 + uniform(20) / 10.0, colour(), 1 + uniform(2));
  }
  cv::Mat noise(height, width, CV_16SC3);
  cv::RNG rng(seed);
  rng.fill(noise, cv::RNG::NORMAL, cv::Scalar::all(0), cv::Scalar::all(8));
  cv::Mat noisy;
  image.convertTo(noisy, CV_16SC3);
  noisy += noise;
  noisy.convertTo(image, CV_8UC3);  // saturating
  if (grey) cv::cvtColor(image, image, cv::COLOR_BGR2GRAY);
  return image;
}

TEST(ImageResize, SizeAndCropFollowTorchvision) {
  using vqa::data::image_plan_square;
  struct Case {
    int width, height, size, resized_width, resized_height, left, top;
  };
  // int(S * long / short) truncates; round((side - S) / 2) rounds half to even.
  const std::vector<Case> cases = {
      {500, 400, 384, 480, 384, 48, 0},   {640, 480, 384, 512, 384, 64, 0},
      {1000, 563, 384, 682, 384, 149, 0},  // 682.06.. truncated
      {681, 384, 384, 681, 384, 148, 0},   // (681 - 384) / 2 = 148.5 -> 148 (to even)
      {1024, 767, 384, 512, 384, 64, 0},   // 512.66.. truncated
      {401, 1000, 384, 384, 957, 0, 286},  // 957.6.. truncated; 286.5 -> 286
      {384, 771, 384, 384, 771, 0, 194},   // 193.5 -> 194 (to even)
      {300, 200, 384, 576, 384, 96, 0},    // upscaling
      {224, 224, 224, 224, 224, 0, 0},    {3, 1000, 224, 224, 74666, 0, 37221},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.width) + "x" + std::to_string(c.height) + " to " +
                 std::to_string(c.size));
    const auto crop = image_plan_square(c.width, c.height, c.size);
    EXPECT_EQ(crop.width, c.resized_width);
    EXPECT_EQ(crop.height, c.resized_height);
    EXPECT_EQ(crop.left, c.left);
    EXPECT_EQ(crop.top, c.top);
  }
}

TEST(ImageResize, MatchesPillowsBicubicAndCentreCropOnRealSizeJpegs) {
  const std::string python = python_with_pil();
  ASSERT_FALSE(python.empty()) << "no python3 that imports PIL: install python3-pil "
                                  "(env/setup.sh), or set PYTHON";
  const std::string dir = vqa::testing::make_temp_dir("pil_resize");
  struct Shape {
    int width, height;
    bool grey;
  };
  const std::vector<Shape> shapes = {
      {500, 400, false},  {640, 480, false},   {800, 600, true},  {1024, 768, false},
      {768, 1024, false}, {1000, 563, true},   {901, 677, false}, {1023, 767, false},
      {512, 512, true},   {401, 1000, false},  {640, 427, false}, {384, 771, false},
      {300, 200, false},  {2048, 1536, false}, {566, 1004, true}, {720, 540, false}};
  std::vector<std::string> files;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    const std::string file = dir + "/image" + std::to_string(i) + ".jpg";
    ASSERT_TRUE(cv::imwrite(file, synthetic_photo(s.width, s.height, s.grey, 100 + i),
                            {cv::IMWRITE_JPEG_QUALITY, 90}));
    files.push_back(file);
  }
  std::string list;
  for (const auto& file : files) list += " " + file;

  int64_t images = 0, values = 0, differing = 0, decode_differing = 0;
  double total = 0.0, worst = 0.0;
  double opencv_total = 0.0, opencv_worst = 0.0;  // OpenCV's INTER_CUBIC, for comparison
  for (const int size : {384, 224}) {
    const std::string out = dir + "/pil" + std::to_string(size);
    fs::create_directories(out);
    const auto reference =
        run_process(python + " " + kReference + " " + std::to_string(size) + " " + out + list, 300);
    ASSERT_EQ(reference.exit_code, 0) << reference.output;
    for (const auto& file : files) {
      SCOPED_TRACE(file + " to " + std::to_string(size));
      const std::string name = out + "/" + fs::path(file).filename().string();
      // The decoders first: both are libjpeg(-turbo), so a difference here is not the resize's.
      const cv::Mat pil_decoded = cv::imread(name + ".decoded.png", cv::IMREAD_COLOR);
      const cv::Mat ours_decoded =
          cv::imread(file, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
      ASSERT_EQ(pil_decoded.size(), ours_decoded.size());
      decode_differing +=
          cv::countNonZero(cv::Mat(cv::abs(pil_decoded - ours_decoded)).reshape(1) != 0);

      const cv::Mat pil = cv::imread(name + ".png", cv::IMREAD_COLOR);  // BGR
      ASSERT_EQ(pil.rows, size);
      ASSERT_EQ(pil.cols, size);
      std::vector<uint8_t> chw;
      ASSERT_EQ(vqa::prep::image_load_square(file, size, chw), "");
      // What convert did before: OpenCV's bicubic, which does not widen the
      // filter when it shrinks (no antialiasing); same size and crop.
      const auto plan = vqa::data::image_plan_square(ours_decoded.cols, ours_decoded.rows, size);
      cv::Mat opencv;
      cv::resize(ours_decoded, opencv, cv::Size(plan.width, plan.height), 0, 0, cv::INTER_CUBIC);
      const cv::Mat opencv_square = opencv(cv::Rect(plan.left, plan.top, size, size));
      const int64_t plane = int64_t{size} * size;
      for (int y = 0; y < size; ++y) {
        for (int x = 0; x < size; ++x) {
          const cv::Vec3b bgr = pil.at<cv::Vec3b>(y, x);
          for (int c = 0; c < 3; ++c) {
            const double diff = std::abs(static_cast<double>(chw[c * plane + y * size + x]) -
                                         static_cast<double>(bgr[2 - c]));
            total += diff;
            worst = std::max(worst, diff);
            const double opencv_diff =
                std::abs(static_cast<double>(opencv_square.at<cv::Vec3b>(y, x)[c]) -
                         static_cast<double>(bgr[c]));
            opencv_total += opencv_diff;
            opencv_worst = std::max(opencv_worst, opencv_diff);
            differing += diff > 0 ? 1 : 0;
            ++values;
          }
        }
      }
      ++images;
    }
  }
  const double mean = total / static_cast<double>(values);
  std::printf(
      "PIL resize parity: %ld results (%zu JPEGs of 300x200 .. 2048x1536, S = 384 and 224): mean "
      "|difference| %.4f, max %.0f grey levels, %ld of %ld values differ; decoded pixels that "
      "differ between OpenCV and Pillow: %ld (OpenCV's INTER_CUBIC instead: mean %.2f, max %.0f)\n",
      static_cast<long>(images), files.size(), mean, worst, static_cast<long>(differing),
      static_cast<long>(values), static_cast<long>(decode_differing),
      opencv_total / static_cast<double>(values), opencv_worst);
  // Tolerance: a mean of 1.5 grey levels is the target; the port is exact
  // when both decoders agree, so one grey level of rounding at most.
  EXPECT_LE(mean, 1.5);
  EXPECT_LE(worst, decode_differing == 0 ? 1.0 : 255.0);
}

}  // namespace

namespace {

// RandomResizedCrop's crop and resize, for given boxes, against Pillow's
// (pil_reference_crop.py, as torchvision calls it) on lossless PNGs, so that
// both start from the same pixels: boxes of M3AE's scale range, the whole
// image, thin and small ones, at the image's edges; up- and downscaling.
// Bit-exact: every value equal.
TEST(RandomResizedCrop, CropAndResizeMatchPillowBitForBit) {
  const std::string python = python_with_pil();
  ASSERT_FALSE(python.empty()) << "no python3 that imports PIL: install python3-pil "
                                  "(env/setup.sh), or set PYTHON";
  const std::string dir = vqa::testing::make_temp_dir("pil_crop");
  struct Case {
    int width, height;
    vqa::data::CropBox box;
  };
  const std::vector<Case> cases = {{500, 400, {0, 0, 500, 400}},   {500, 400, {12, 7, 471, 385}},
                                   {640, 480, {40, 0, 600, 480}},  {384, 384, {3, 9, 370, 360}},
                                   {300, 200, {0, 20, 210, 180}},  {1024, 768, {99, 31, 917, 733}},
                                   {401, 1000, {0, 0, 401, 535}},  {512, 512, {500, 0, 12, 512}},
                                   {300, 200, {250, 150, 50, 50}}, {720, 540, {1, 1, 718, 538}}};
  const int size = 384;
  std::string arguments;
  std::vector<std::string> files;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string file = dir + "/image" + std::to_string(i) + ".png";
    ASSERT_TRUE(cv::imwrite(file, synthetic_photo(c.width, c.height, false, 300 + i)));
    files.push_back(file);
    arguments += " " + file + " " + std::to_string(c.box.left) + " " + std::to_string(c.box.top) +
                 " " + std::to_string(c.box.width) + " " + std::to_string(c.box.height);
  }
  const std::string reference = std::string(VQA_TEST_DATA_DIR) + "/pil_reference_crop.py";
  const auto result = run_process(
      python + " " + reference + " " + std::to_string(size) + " " + dir + arguments, 300);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  int64_t values = 0, differing = 0;
  int worst = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& box = cases[i].box;
    SCOPED_TRACE(files[i]);
    cv::Mat bgr = cv::imread(files[i], cv::IMREAD_COLOR);
    cv::Mat rgb;
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
    const auto ours =
        vqa::data::image_crop_resize_bicubic(rgb.data, rgb.cols, rgb.rows, 3, box, size, size);
    const std::string name = files[i] + "." + std::to_string(box.left) + "_" +
                             std::to_string(box.top) + "_" + std::to_string(box.width) + "_" +
                             std::to_string(box.height) + ".png";
    cv::Mat pil = cv::imread(name, cv::IMREAD_COLOR);
    ASSERT_EQ(pil.rows, size);
    cv::cvtColor(pil, pil, cv::COLOR_BGR2RGB);
    ASSERT_TRUE(pil.isContinuous());
    for (size_t k = 0; k < ours.size(); ++k) {
      const int diff = std::abs(int{ours[k]} - int{pil.data[k]});
      differing += diff != 0;
      worst = std::max(worst, diff);
      ++values;
    }
  }
  std::printf("crop + resize vs Pillow: %zu boxes, %ld values, %ld differ, largest difference %d\n",
              cases.size(), static_cast<long>(values), static_cast<long>(differing), worst);
  EXPECT_EQ(differing, 0);
  EXPECT_THROW(vqa::data::image_crop_resize_bicubic(nullptr, 10, 10, 3, {5, 0, 6, 10}, 4, 4),
               std::invalid_argument);
}

// The boxes follow torchvision's rules over many draws: inside the image;
// area within the scale range and aspect within the ratio range, up to the
// rounding of width and height to whole pixels; the area fraction spanning
// the range; offsets over the free range; on a square, the fallback as often
// as 10 independent tries predict and log aspects symmetric; and the
// fallback always when no box can fit: an image wider than 4:3 allows at
// scale >= 0.9 (the whole height, width = round(height x 4/3), centred).
TEST(RandomResizedCrop, BoxesFollowTorchvisionsRules) {
  const vqa::data::RandomCropRanges ranges;  // M3AE's: scale 0.9-1.0, ratio 3/4-4/3
  vqa::util::SplitMix64 rng(2024);
  struct Shape {
    int width, height;
  };
  for (const Shape shape :
       {Shape{500, 400}, Shape{384, 384}, Shape{1024, 768}, Shape{600, 700}, Shape{37, 29}}) {
    SCOPED_TRACE(std::to_string(shape.width) + "x" + std::to_string(shape.height));
    const double area = double{1} * shape.width * shape.height;
    double scale_sum = 0.0, log_ratio_sum = 0.0, scale_min = 2.0, scale_max = 0.0;
    double log_ratio_min = 1.0, log_ratio_max = -1.0;
    int fallbacks = 0, max_left = 0, max_top = 0;
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) {
      bool fell_back = false;
      const auto box =
          vqa::data::image_random_crop_box(shape.width, shape.height, ranges, rng, &fell_back);
      ASSERT_GE(box.left, 0);
      ASSERT_GE(box.top, 0);
      ASSERT_GE(box.width, 1);
      ASSERT_GE(box.height, 1);
      ASSERT_LE(box.left + box.width, shape.width);
      ASSERT_LE(box.top + box.height, shape.height);
      max_left = std::max(max_left, box.left);
      max_top = std::max(max_top, box.top);
      if (fell_back) {
        ++fallbacks;
        continue;
      }
      // Rounding moves each side by at most half a pixel.
      const double low = (box.width - 0.5) * (box.height - 0.5) / area;
      const double high = (box.width + 0.5) * (box.height + 0.5) / area;
      EXPECT_LE(low, ranges.scale_max);
      EXPECT_GE(high, ranges.scale_min);
      EXPECT_LE((box.width - 0.5) / (box.height + 0.5), ranges.ratio_max);
      EXPECT_GE((box.width + 0.5) / (box.height - 0.5), ranges.ratio_min);
      const double scale = double{1} * box.width * box.height / area;
      const double log_ratio = std::log(double{1} * box.width / box.height);
      scale_sum += scale;
      log_ratio_sum += log_ratio;
      scale_min = std::min(scale_min, scale);
      scale_max = std::max(scale_max, scale);
      log_ratio_min = std::min(log_ratio_min, log_ratio);
      log_ratio_max = std::max(log_ratio_max, log_ratio);
    }
    const int taken = draws - fallbacks;
    std::printf(
        "%dx%d: %d fallbacks; area fraction %.4f..%.4f mean %.4f; log aspect %.3f..%.3f "
        "mean %.4f\n",
        shape.width, shape.height, fallbacks, scale_min, scale_max, scale_sum / taken,
        log_ratio_min, log_ratio_max, log_ratio_sum / taken);
    if (shape.width >= 100) {
      EXPECT_LT(scale_min, 0.905) << "areas down to 90%";
      EXPECT_GT(scale_max, 0.995) << "and up to the whole image";
    }
    if (shape.width == 384) {
      // A square fits a box when |log ratio| <= -log(scale) (+ 0.0026 for
      // the rounding to whole pixels): per try p = (E[-log s] + 0.0026) / L
      // = (0.05176 + 0.0026) / 0.28768 = 0.189 (s uniform on [0.9, 1],
      // L = log(4/3)); all 10 tries miss with (1 - p)^10 = 0.123. Four
      // standard deviations of 20,000 draws: 0.0093.
      EXPECT_NEAR(double{1} * fallbacks / draws, 0.123, 0.0093);
      EXPECT_NEAR(log_ratio_sum / taken, 0.0, 0.005) << "symmetric in log aspect";
    }
  }
  // Wider than any box of >= 90% area and ratio <= 4/3 allows: always the fallback.
  for (int i = 0; i < 100; ++i) {
    bool fell_back = false;
    const auto box = vqa::data::image_random_crop_box(1000, 300, ranges, rng, &fell_back);
    ASSERT_TRUE(fell_back);
    EXPECT_EQ(box.height, 300);
    EXPECT_EQ(box.width, 400);  // round(300 x 4/3)
    EXPECT_EQ(box.left, 300);   // (1000 - 400) / 2
    EXPECT_EQ(box.top, 0);
  }
  // Taller than 3:4 allows: the whole width, height = round(width / (3/4)), centred.
  bool fell_back = false;
  const auto tall = vqa::data::image_random_crop_box(300, 1000, ranges, rng, &fell_back);
  EXPECT_TRUE(fell_back);
  EXPECT_EQ(tall.width, 300);
  EXPECT_EQ(tall.height, 400);
  EXPECT_EQ(tall.top, 300);
  vqa::data::RandomCropRanges empty;
  empty.scale_min = 0.0;
  EXPECT_THROW(vqa::data::image_random_crop_box(10, 10, empty, rng), std::invalid_argument);
  EXPECT_THROW(vqa::data::image_random_crop_box(0, 10, ranges, rng), std::invalid_argument);
}

}  // namespace
