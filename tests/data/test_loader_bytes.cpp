// LoaderOptions::images_as_bytes (the job's mode on a CUDA device), forced
// here on the CPU, on a real file through the real loader: the uint8 batch
// after batch_to_device equals the float32 batch bit for bit, for the stored
// images and the random resized crop; and the float32 batch is still
// (pixel / 255 - mean) / std computed one value at a time, as the loader
// computed it before the bytes mode (the crop did exactly that).
#include <gtest/gtest.h>

#include <cstdio>

#include "data/loader.h"    // ShardedLoader, LoaderOptions, batch_normalise_images
#include "process.h"        // make_temp_dir
#include "synth.h"          // synth_generate
#include "train/batches.h"  // batch_to_device
#include "writer.h"         // prep_write_dataset

namespace {

using vqa::data::Batch;
using vqa::data::LoaderOptions;
using vqa::data::ShardedLoader;

constexpr int64_t kSize = 24;

// Train images drawn at 40 px and stored resized to kSize, with their
// sources kept for the crop.
const std::string& synth_path() {
  static const std::string path = [] {
    vqa::prep::SynthOptions options;
    options.train_questions = 29;  // 29 = 3 x 8 + 5: a short last batch too
    options.test_questions = 5;
    options.image_size = kSize;
    options.source_size = 40;
    options.seed = 5;
    const auto dataset = vqa::prep::synth_generate(options);
    const std::string file = vqa::testing::make_temp_dir("loader_bytes") + "/synth.h5";
    vqa::prep::prep_write_dataset(file, dataset.header, dataset.splits);
    return file;
  }();
  return path;
}

LoaderOptions options_for(bool bytes, bool crop) {
  LoaderOptions options;
  options.batch_per_rank = 8;
  options.seed = 7;
  options.images_as_bytes = bytes;
  options.random_resized_crop = crop;
  options.crop_ranges = {0.5, 1.0, 0.6, 1.6};
  options.augment_threads = 2;
  return options;
}

// (pixel / 255 - mean) / std, one float at a time: the loader's arithmetic
// before the bytes mode.
torch::Tensor normalise_one_by_one(const torch::Tensor& pixels, const std::vector<double>& mean,
                                   const std::vector<double>& std) {
  auto out = torch::empty(pixels.sizes(), torch::kFloat32);
  const auto in = pixels.contiguous();
  const uint8_t* from = in.data_ptr<uint8_t>();
  float* to = out.data_ptr<float>();
  const int64_t plane = pixels.size(2) * pixels.size(3);
  for (int64_t i = 0; i < in.numel(); ++i) {
    const auto c = static_cast<size_t>((i / plane) % 3);
    to[i] = (static_cast<float>(from[i]) / 255.0f - static_cast<float>(mean[c])) /
            static_cast<float>(std[c]);
  }
  return out;
}

// Two epochs of both modes side by side.
void expect_bytes_equal_floats(bool crop) {
  ShardedLoader floats(synth_path(), "train", options_for(false, crop));
  ShardedLoader bytes(synth_path(), "train", options_for(true, crop));
  const auto& info = floats.info();
  int64_t samples = 0;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    floats.start_epoch(epoch);
    bytes.start_epoch(epoch);
    Batch want, got;
    while (floats.next(want)) {
      ASSERT_TRUE(bytes.next(got));
      ASSERT_EQ(want.images.scalar_type(), torch::kFloat32);
      EXPECT_FALSE(want.image_mean.defined());
      ASSERT_EQ(got.images.scalar_type(), torch::kUInt8);
      ASSERT_EQ(got.images.sizes(), (std::vector<int64_t>{got.size(), 3, kSize, kSize}));
      ASSERT_TRUE(torch::equal(want.images,
                               normalise_one_by_one(got.images, info.image_mean, info.image_std)))
          << "the float32 batch is not the loader's arithmetic, epoch " << epoch;
      const Batch moved = vqa::train::batch_to_device(got, torch::kCPU);
      ASSERT_EQ(moved.images.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(moved.images, want.images))
          << "bytes normalised by batch_to_device differ from the float32 batch, epoch " << epoch
          << ", max difference " << (moved.images - want.images).abs().max().item<float>();
      EXPECT_FALSE(moved.image_mean.defined());
      EXPECT_TRUE(torch::equal(moved.token_ids, want.token_ids));
      EXPECT_TRUE(torch::equal(moved.question_ids, want.question_ids));
      EXPECT_TRUE(torch::equal(moved.targets, want.targets));
      samples += got.size();
    }
    EXPECT_FALSE(bytes.next(got));
  }
  EXPECT_EQ(samples, 2 * info.num_questions);
  const auto per_sample = 3 * kSize * kSize;
  std::printf("host image bytes per sample at %lld px: uint8 %lld, float32 %lld\n",
              static_cast<long long>(kSize), static_cast<long long>(per_sample),
              static_cast<long long>(per_sample * 4));
}

TEST(LoaderBytes, StoredImagesEqualTheFloatBatch) { expect_bytes_equal_floats(/*crop=*/false); }

TEST(LoaderBytes, CroppedImagesEqualTheFloatBatch) { expect_bytes_equal_floats(/*crop=*/true); }

// A batch without bytes (features, or float32 images) passes through unchanged.
TEST(LoaderBytes, FloatImagesAreLeftAsTheyAre) {
  Batch batch;
  batch.images = torch::randn({2, 3, 4, 4});
  const auto before = batch.images;
  vqa::data::batch_normalise_images(batch);
  EXPECT_TRUE(batch.images.is_same(before));
}

}  // namespace
