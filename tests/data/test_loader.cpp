// ShardedLoader under mpirun (1, 2, 3 ranks), on files written by the prep
// library: exact round trip, DistributedSampler semantics over 3 epochs,
// resume, prefetch depth, features and the random resized crop. Every
// comparison is exact unless a tolerance is stated next to it.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "data/image_resample.h"  // image_random_crop_box, image_crop_resize_bicubic
#include "data/loader.h"          // ShardedLoader, augment_crop_seed
#include "process.h"              // make_temp_dir
#include "runtime/distributed.h"  // distributed_broadcast_bytes, distributed_gather_strings
#include "synth.h"                // synth_generate
#include "util/splitmix64.h"      // SplitMix64
#include "writer.h"               // prep_write_dataset, DatasetWriter

namespace {

using vqa::data::Batch;
using vqa::data::LoaderOptions;
using vqa::data::ShardedLoader;

vqa::prep::SynthOptions small_synth() {
  vqa::prep::SynthOptions options;
  options.train_questions = 101;  // odd sizes: 2 and 3 ranks need wrap-around padding
  options.test_questions = 37;
  options.image_size = 16;
  options.seed = 3;
  return options;
}

const vqa::prep::SynthDataset& expected() {
  static const vqa::prep::SynthDataset dataset = vqa::prep::synth_generate(small_synth());
  return dataset;
}

// Rank 0 writes the file; every rank gets its path (the temp dir is on a
// file system all ranks of these tests share: one host).
std::string shared_file(const std::string& name,
                        const std::function<void(const std::string&)>& write) {
  const auto& info = vqa::runtime::distributed_rank_info();
  std::string path;
  if (info.rank == 0) {
    path = vqa::testing::make_temp_dir("loader") + "/" + name;
    write(path);
  }
  std::vector<char> bytes(path.begin(), path.end());
  vqa::runtime::distributed_broadcast_bytes(bytes, 0);
  return std::string(bytes.begin(), bytes.end());
}

const std::string& synth_path() {
  static const std::string path = shared_file("synth.h5", [](const std::string& p) {
    vqa::prep::prep_write_dataset(p, expected().header, expected().splits);
  });
  return path;
}

// The header of the hand-written files below: answers yes/no, the word
// tokenizer's three specials and one word, questions of 4 tokens.
vqa::prep::FileHeader two_answer_header() {
  vqa::prep::FileHeader header;
  header.answer_labels = {"yes", "no"};
  header.token_vocabulary = {"<pad>", "<unk>", "<cls>", "word"};
  header.question_types = {"t"};
  header.max_question_length = 4;
  return header;
}

LoaderOptions options_for(int64_t batch, bool drop_last, int depth) {
  const auto& info = vqa::runtime::distributed_rank_info();
  LoaderOptions options;
  options.batch_per_rank = batch;
  options.seed = 11;
  options.shuffle = true;
  options.drop_last = drop_last;
  options.prefetch_depth = depth;
  options.rank = info.rank;
  options.world_size = info.world_size;
  return options;
}

// (question id, valid) of every sample this rank sees in one epoch.
std::vector<std::pair<int64_t, int>> epoch_samples(ShardedLoader& loader, int64_t epoch,
                                                   int64_t skip = 0) {
  std::vector<std::pair<int64_t, int>> samples;
  loader.start_epoch(epoch, skip);
  Batch batch;
  while (loader.next(batch)) {
    for (int64_t i = 0; i < batch.size(); ++i) {
      samples.emplace_back(batch.question_ids[i].item<int64_t>(),
                           static_cast<int>(batch.valid[i].item<float>()));
    }
  }
  return samples;
}

TEST(Loader, RoundTripIsExact) {
  ShardedLoader loader(synth_path(), "train", options_for(8, false, 2));
  const auto& info = loader.info();
  const auto& header = expected().header;
  const auto& split = expected().splits[0];
  EXPECT_EQ(info.num_questions, 101);
  EXPECT_EQ(info.num_images, static_cast<int64_t>(split.image_names.size()));
  EXPECT_EQ(info.answer_labels, header.answer_labels);
  EXPECT_EQ(info.vocab_size, static_cast<int64_t>(header.token_vocabulary.size()));
  EXPECT_EQ(info.image_size, 16);
  const int64_t length = info.max_question_length, size = info.image_size;
  loader.start_epoch(0);
  Batch batch;
  int64_t seen = 0;
  while (loader.next(batch)) {
    ASSERT_EQ(batch.images.sizes(), (std::vector<int64_t>{batch.size(), 3, size, size}));
    ASSERT_EQ(batch.targets.sizes(), (std::vector<int64_t>{batch.size(), info.num_answers}));
    for (int64_t i = 0; i < batch.size(); ++i, ++seen) {
      const int64_t row = batch.question_ids[i].item<int64_t>() - 1;  // synth train ids start at 1
      const auto& q = split.questions;
      for (int64_t t = 0; t < length; ++t) {
        ASSERT_EQ(batch.token_ids[i][t].item<int64_t>(), q.token_ids[row * length + t]);
        ASSERT_EQ(batch.attention_mask[i][t].item<int64_t>(), q.attention_mask[row * length + t]);
      }
      ASSERT_EQ(batch.answer_type[i].item<int64_t>(), q.answer_type[row]);
      auto target = torch::zeros({info.num_answers});
      target[q.target_labels[row]] = q.target_scores[row];
      ASSERT_TRUE(torch::equal(batch.targets[i], target));
      // Pixels: undo the normalisation and round; the stored uint8 comes back
      // exactly (the float error, ~1e-5, is far below half a grey level).
      const auto mean = torch::tensor(header.image_mean).to(torch::kFloat32).view({3, 1, 1});
      const auto std = torch::tensor(header.image_std).to(torch::kFloat32).view({3, 1, 1});
      const auto pixels = (batch.images[i] * std + mean).mul(255.0f).round().to(torch::kUInt8);
      const auto* stored = split.pixels.data() + q.image_row[row] * 3 * size * size;
      const auto reference =
          torch::from_blob(const_cast<uint8_t*>(stored), {3, size, size}, torch::kUInt8);
      ASSERT_TRUE(torch::equal(pixels, reference)) << "question row " << row;
    }
  }
  const int world = vqa::runtime::distributed_rank_info().world_size;
  EXPECT_EQ(seen, (101 + world - 1) / world) << "one padded shard per rank";
}

TEST(Loader, ShardsAreDisjointCoverReshuffledAndEqualInSteps) {
  const int world = vqa::runtime::distributed_rank_info().world_size;
  for (const std::string split : {"train", "test"}) {
    for (bool drop_last : {false, true}) {
      SCOPED_TRACE(split + (drop_last ? " drop_last" : " padded"));
      ShardedLoader loader(synth_path(), split, options_for(8, drop_last, 2));
      const int64_t n = loader.info().num_questions;
      std::vector<std::vector<int64_t>> orders;  // rank 0's order per epoch
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        std::ostringstream mine;
        const auto samples = epoch_samples(loader, epoch);
        mine << loader.steps_per_epoch();
        for (const auto& [id, valid] : samples) mine << ' ' << id << ':' << valid;
        std::multiset<int64_t> real;
        std::set<int64_t> steps;
        std::vector<int64_t> rank0;
        const auto all = vqa::runtime::distributed_gather_strings(mine.str());
        for (int r = 0; r < world; ++r) {
          std::istringstream in(all[r]);
          int64_t step_count = 0;
          in >> step_count;
          steps.insert(step_count);
          std::string item;
          while (in >> item) {
            const int64_t id = std::stoll(item.substr(0, item.find(':')));
            if (r == 0) rank0.push_back(id);
            if (item.back() == '1') real.insert(id);
          }
        }
        EXPECT_EQ(steps.size(), 1u) << "ranks disagree on steps per epoch";
        EXPECT_EQ(std::set<int64_t>(real.begin(), real.end()).size(), real.size()) << "overlap";
        EXPECT_EQ(static_cast<int64_t>(real.size()), drop_last ? (n / world) / 8 * 8 * world : n);
        orders.push_back(rank0);
      }
      EXPECT_NE(orders[0], orders[1]);
      EXPECT_NE(orders[1], orders[2]);
    }
  }
}

TEST(Loader, ResumeSkipsStepsAndPrefetchDepthChangesNothing) {
  ShardedLoader eager(synth_path(), "train", options_for(8, false, 0));
  ShardedLoader deep(synth_path(), "train", options_for(8, false, 4));
  const auto full = epoch_samples(eager, 1);
  EXPECT_EQ(full, epoch_samples(deep, 1));
  const auto resumed = epoch_samples(deep, 1, /*skip=*/3);
  using Samples = std::vector<std::pair<int64_t, int>>;
  EXPECT_EQ(resumed, Samples(full.begin() + 3 * 8, full.end()));
  EXPECT_GE(deep.wait_seconds(), 0.0);
}

// With pin_memory every tensor of every batch is page-locked, and the
// batches are the same as unpinned ones. Pinned memory needs a CUDA LibTorch
// and a GPU: SKIP elsewhere.
TEST(Loader, PinnedBatchesAreLockedAndUnchanged) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "pinned host memory needs a CUDA LibTorch and a GPU";
  }
  auto pinned_options = options_for(8, false, 2);
  pinned_options.pin_memory = true;
  ShardedLoader pinned(synth_path(), "train", pinned_options);
  ShardedLoader plain(synth_path(), "train", options_for(8, false, 2));
  pinned.start_epoch(0);
  plain.start_epoch(0);
  vqa::data::Batch a, b;
  int64_t batches = 0;
  while (pinned.next(a)) {
    ASSERT_TRUE(plain.next(b));
    for (const auto* t : {&a.images, &a.token_ids, &a.attention_mask, &a.targets, &a.valid}) {
      EXPECT_TRUE(t->is_pinned());
    }
    EXPECT_TRUE(torch::equal(a.images, b.images));
    EXPECT_TRUE(torch::equal(a.token_ids, b.token_ids));
    ++batches;
  }
  EXPECT_GT(batches, 0);
}

// trim_text_padding: the batch's text is cut after the last real token of
// any row, the real tokens unchanged, and the loader's batches are the
// untrimmed ones' first columns.
TEST(Loader, TrimmedTextKeepsEveryRealToken) {
  vqa::data::Batch batch;
  batch.attention_mask = torch::tensor({1, 1, 0, 0, 0, 1, 1, 1, 0, 0}, torch::kInt64).view({2, 5});
  batch.token_ids = torch::arange(10, torch::kInt64).view({2, 5});
  vqa::data::batch_trim_text_padding(batch);
  EXPECT_TRUE(torch::equal(batch.token_ids, torch::tensor({0, 1, 2, 5, 6, 7}).view({2, 3})));
  EXPECT_TRUE(torch::equal(batch.attention_mask, torch::tensor({1, 1, 0, 1, 1, 1}).view({2, 3})));

  auto trim_options = options_for(8, false, 1);
  trim_options.trim_text_padding = true;
  ShardedLoader trimmed(synth_path(), "train", trim_options);
  ShardedLoader full(synth_path(), "train", options_for(8, false, 1));
  trimmed.start_epoch(0);
  full.start_epoch(0);
  vqa::data::Batch a, b;
  while (trimmed.next(a)) {
    ASSERT_TRUE(full.next(b));
    const int64_t width = a.token_ids.size(1);
    ASSERT_LE(width, b.token_ids.size(1));
    EXPECT_TRUE(torch::equal(a.token_ids, b.token_ids.narrow(1, 0, width)));
    EXPECT_EQ(
        b.attention_mask.narrow(1, width, b.attention_mask.size(1) - width).sum().item<int64_t>(),
        0);
  }
}

TEST(Loader, IdentityIsEqualOnEveryRank) {
  ShardedLoader loader(synth_path(), "test", options_for(4, false, 1));
  const auto all = vqa::runtime::distributed_gather_strings(loader.info().identity);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), 1u);
  EXPECT_NE(
      loader.info().identity.find("v" + std::to_string(vqa::data::kFormatVersion) + "/test/q37/"),
      std::string::npos)
      << loader.info().identity;
}

TEST(Loader, FeaturesRoundTripInFloat16) {
  constexpr int64_t kImages = 5, kTokens = 4, kDim = 6, kQuestions = 9;
  // Multiples of 1/4 below 8 are exact in float16: the comparison is exact.
  auto value = [](int64_t image, int64_t element) {
    return 0.25f * ((image * 7 + element) % 31) - 3.0f;
  };
  const std::string path = shared_file("features.h5", [&](const std::string& p) {
    vqa::prep::FileHeader header = two_answer_header();
    header.features = true;
    vqa::prep::DatasetWriter writer(p);
    writer.begin_split("train", 0, kTokens, kDim, /*half_precision=*/true);
    std::vector<std::string> names;
    for (int64_t image = 0; image < kImages; ++image) {
      std::vector<float> row(kTokens * kDim);
      for (int64_t e = 0; e < kTokens * kDim; ++e) row[e] = value(image, e);
      writer.append_features(row.data());
      names.push_back("image" + std::to_string(image));
    }
    writer.end_images(names);
    vqa::prep::QuestionTable table(4, 1);
    for (int64_t q = 0; q < kQuestions; ++q) {
      table.add({2, 3}, static_cast<int32_t>(q % kImages), 0, 100 + q, 0, "q", "a",
                {static_cast<int32_t>(q % 2)}, {1.0f});
    }
    writer.write_questions("train", table);
    writer.commit(header);
  });
  ShardedLoader loader(path, "train", options_for(4, false, 2));
  EXPECT_TRUE(loader.info().has_features);
  EXPECT_EQ(loader.info().feature_tokens, kTokens);
  EXPECT_EQ(loader.info().feature_dim, kDim);
  loader.start_epoch(0);
  Batch batch;
  while (loader.next(batch)) {
    ASSERT_EQ(batch.images.sizes(), (std::vector<int64_t>{batch.size(), kTokens, kDim}));
    for (int64_t i = 0; i < batch.size(); ++i) {
      const int64_t q = batch.question_ids[i].item<int64_t>() - 100;
      for (int64_t e = 0; e < kTokens * kDim; ++e) {
        ASSERT_EQ(batch.images[i].view(-1)[e].item<float>(), value(q % kImages, e));
      }
      ASSERT_EQ(batch.targets[i][q % 2].item<float>(), 1.0f);
    }
  }
}

// The random resized crop (M3AE's clip_resizedcrop) on sources of several
// shapes: every sample's image is exactly the crop that (seed, epoch,
// question row) gives, on 1, 2 and 3 ranks (each rank checks against the
// same formula, so any rank count gives a sample the same pixels), with 3
// crop threads, in two epochs that crop differently; the box rules and the
// crop itself are tested against torchvision and Pillow in
// test_image_resize.cpp. A file without sources is refused.
TEST(Loader, RandomResizedCropIsTheSamplesOwnOnAnyRankCount) {
  constexpr int64_t kSize = 16, kQuestions = 23;
  const std::vector<std::pair<int, int>> shapes = {
      {40, 30}, {30, 50}, {64, 64}, {17, 23}, {16, 16}};
  auto source_of = [&](size_t image) {
    vqa::data::SourceImage source;
    source.width = shapes[image].first;
    source.height = shapes[image].second;
    source.rgb.resize(static_cast<size_t>(source.width) * source.height * 3);
    vqa::util::SplitMix64 noise(image + 1);
    for (auto& value : source.rgb) value = static_cast<uint8_t>(noise.below(256));
    return source;
  };
  const std::string path = shared_file("sources.h5", [&](const std::string& p) {
    vqa::prep::FileHeader header = two_answer_header();
    header.image_size = kSize;
    vqa::prep::DatasetWriter writer(p);
    writer.begin_split("train", kSize);
    std::vector<std::string> names;
    const std::vector<uint8_t> stored(3 * kSize * kSize, 128);
    for (size_t image = 0; image < shapes.size(); ++image) {
      writer.append_image(stored.data());
      writer.append_source_image(source_of(image));
      names.push_back("image" + std::to_string(image));
    }
    writer.end_images(names);
    vqa::prep::QuestionTable table(4, 1);
    for (int64_t q = 0; q < kQuestions; ++q) {
      table.add({2, 3}, static_cast<int32_t>(q % 5), 0, 100 + q, 0, "q", "a", {0}, {1.0f});
    }
    writer.write_questions("train", table);
    writer.commit(header);
  });
  LoaderOptions options = options_for(4, false, 2);
  options.random_resized_crop = true;
  options.crop_ranges = {0.5, 1.0, 0.6, 1.6};  // wide ranges: boxes differ visibly
  options.augment_threads = 3;
  ShardedLoader loader(path, "train", options);
  EXPECT_TRUE(loader.info().has_source_images);
  const auto& info = loader.info();
  const auto mean = torch::tensor(info.image_mean).to(torch::kFloat32).view({3, 1, 1});
  const auto std = torch::tensor(info.image_std).to(torch::kFloat32).view({3, 1, 1});
  std::map<int64_t, torch::Tensor> first_epoch;
  int64_t checked = 0, changed = 0;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch(epoch);
    Batch batch;
    while (loader.next(batch)) {
      ASSERT_EQ(batch.images.sizes(), (std::vector<int64_t>{batch.size(), 3, kSize, kSize}));
      for (int64_t i = 0; i < batch.size(); ++i) {
        const int64_t row = batch.question_ids[i].item<int64_t>() - 100;
        const auto source = source_of(static_cast<size_t>(row % 5));
        vqa::util::SplitMix64 rng(vqa::data::augment_crop_seed(options.seed, epoch, row));
        const auto box =
            vqa::data::image_random_crop_box(source.width, source.height, options.crop_ranges, rng);
        auto want = vqa::data::image_crop_resize_bicubic(source.rgb.data(), source.width,
                                                         source.height, 3, box, kSize, kSize);
        const auto reference =
            torch::from_blob(want.data(), {kSize, kSize, 3}, torch::kUInt8).permute({2, 0, 1});
        // Undo the normalisation and round: the uint8 crop comes back exactly.
        const auto pixels = (batch.images[i] * std + mean).mul(255.0f).round().to(torch::kUInt8);
        ASSERT_TRUE(torch::equal(pixels, reference)) << "epoch " << epoch << " row " << row;
        ++checked;
        if (epoch == 0) {
          first_epoch[row] = pixels.clone();
        } else if (first_epoch.count(row) && !torch::equal(first_epoch[row], pixels)) {
          ++changed;
        }
      }
    }
  }
  const int world = vqa::runtime::distributed_rank_info().world_size;
  EXPECT_EQ(checked, 2 * ((kQuestions + world - 1) / world));
  // Another epoch draws other boxes (a sample's shard may move between ranks,
  // so only the samples this rank saw twice count).
  EXPECT_GT(changed, 0);

  LoaderOptions refused = options_for(4, false, 1);
  refused.random_resized_crop = true;
  try {
    ShardedLoader plain(synth_path(), "train", refused);
    ADD_FAILURE() << "a file without source images was accepted";
  } catch (const vqa::data::DataFormatError& e) {
    EXPECT_NE(std::string(e.what()).find(synth_path() + ": split 'train' holds no source images"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--keep-source-images"), std::string::npos) << e.what();
  }
}

}  // namespace
