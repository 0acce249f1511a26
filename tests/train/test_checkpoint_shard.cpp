// Sharded checkpoints (--shard-optimizer, src/train/checkpoint_shards.h)
// under mpirun with the tiny preset: at 3 and 2 ranks each rank writes its
// own part of the AdamW moments (its header names the writing rank) and no
// rank holds the whole state at a save; the checkpoints resume 3 -> 2,
// 2 -> 1 (unsharded) and 1 -> 2 within the tolerance of the sharding tests
// (1e-5 relative, all parameters as one vector: only the order of the sums
// differs); a checkpoint without its manifest, with a part deleted or with a
// corrupt part is skipped by --resume auto, with a warning naming the file,
// for the newest complete one; a part whose checksums hold but whose table
// of runs is malformed ends the resume with an error naming the part.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "checkpoint_files.h"        // load_model, whole_relative_difference
#include "checkpoint_shard_files.h"  // read_part_header, checkpoint_optimizer_parts, ...
#include "process.h"                 // run_process, mpirun_prefix, make_temp_dir, contains

namespace fs = std::filesystem;

namespace {

using vqa::testing::checkpoint_optimizer_parts;
using vqa::testing::checkpoint_part_path;
using vqa::testing::contains;
using vqa::testing::load_model;
using vqa::testing::read_part_header;
using vqa::testing::whole_relative_difference;

// 24 samples a step at 1 (x6 accumulation), 2 (x3) and 3 ranks (x2).
const std::string kCommon =
    "--max-steps-per-epoch 3 --global-batch 24 --batch-per-rank 4 --save-every 1 "
    "--keep-checkpoints 0 --lr 1e-3 --seed 3 --eval-every 0 --threads 1 --progress off ";

class CheckpointShard : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("checkpoint-shard");
    dataset_ = directory_ + "/synth.h5";
    const auto result =
        vqa::testing::run_process(std::string(VQA_PREP) + " synth -o " + dataset_ +
                                      " --train-questions 256 --test-questions 32 --seed 11",
                                  120);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    three_ = train("three", 3, "--epochs 4 --shard-optimizer");
    three_output_ = last_output_;
  }

  static std::string train(const std::string& name, int ranks, const std::string& flags) {
    const std::string out = directory_ + "/" + name;
    const auto result = vqa::testing::run_process(vqa::testing::mpirun_prefix(ranks) + VQA_TRAIN +
                                                      " --train-data " + dataset_ + " --out " +
                                                      out + " " + kCommon + flags,
                                                  300);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    last_output_ = result.output;
    return out;
  }

  static std::string checkpoint(const std::string& out, int epoch) {
    return out + "/checkpoints/epoch-000" + std::to_string(epoch) + ".pt";
  }

  static inline std::string directory_, dataset_, three_, three_output_, last_output_;
};

// Each rank's part of `name` in `output`: the bytes of state it held at the save.
int64_t held_at_save(const std::string& output, int rank, const std::string& part) {
  const std::regex line("rank " + std::to_string(rank) + ": checkpoint part " + part +
                        ": [0-9]+ bytes of AdamW moments; this rank holds ([0-9]+) bytes");
  std::smatch match;
  if (!std::regex_search(output, match, line)) return -1;
  return std::stoll(match[1]);
}

TEST_F(CheckpointShard, EachRankWritesItsPartAndNoRankHoldsTheWholeState) {
  for (const auto& [out, ranks, output] :
       {std::tuple{three_, 3, three_output_},
        std::tuple{train("two", 2, "--epochs 1 --shard-optimizer"), 2, last_output_}}) {
    const std::string from = checkpoint(out, 0);
    ASSERT_EQ(checkpoint_optimizer_parts(from), ranks) << from;
    EXPECT_TRUE(fs::exists(from + ".manifest"));
    int64_t held_sum = 0, held_max = 0, elements = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string part = checkpoint_part_path(from, rank, ranks);
      ASSERT_TRUE(fs::exists(part)) << part;
      EXPECT_TRUE(fs::exists(part + ".crc32")) << part;
      const auto header = read_part_header(part);
      EXPECT_EQ(header.rank, rank) << part << " was written by rank " << header.rank;
      EXPECT_EQ(header.parts, ranks);
      const int64_t held = held_at_save(output, rank, fs::path(part).filename().string());
      ASSERT_GT(held, 0) << "rank " << rank << " did not report its part\n" << output;
      held_sum += held;
      held_max = std::max(held_max, held);
      elements += header.elements;
      std::printf(
          "%d ranks: rank %d wrote %s (%lld moment elements), held %lld bytes of "
          "optimiser state at the save\n",
          ranks, rank, fs::path(part).filename().string().c_str(),
          static_cast<long long>(header.elements), static_cast<long long>(held));
    }
    // The whole state is 2 moments x 4 bytes x every element; each rank holds about 1/N.
    const int64_t whole = 8 * elements;
    std::printf("%d ranks: the whole state is %lld bytes; the largest rank held %.3f of it\n",
                ranks, static_cast<long long>(whole), double(held_max) / double(whole));
    EXPECT_EQ(held_sum, whole);
    EXPECT_LT(held_max, whole / ranks + whole / 20) << "a rank held more than its share";
  }
}

TEST_F(CheckpointShard, ResumesAtAnotherRankCountWithOrWithoutSharding) {
  const auto want = load_model(checkpoint(three_, 3));
  // 3 -> 2 (sharded), 2 -> 1 (unsharded), 1 -> 2 (sharded), each to the end.
  const auto two =
      train("three-to-two", 2, "--epochs 4 --shard-optimizer --resume " + checkpoint(three_, 0));
  ASSERT_EQ(checkpoint_optimizer_parts(checkpoint(two, 1)), 2);
  const auto one = train("two-to-one", 1, "--epochs 4 --resume " + checkpoint(two, 1));
  EXPECT_EQ(checkpoint_optimizer_parts(checkpoint(one, 2)), 0) << "unsharded runs write one file";
  EXPECT_FALSE(fs::exists(checkpoint(one, 2) + ".manifest"));
  const auto back =
      train("one-to-two", 2, "--epochs 4 --shard-optimizer --resume " + checkpoint(one, 2));
  for (const auto& [what, out] : {std::pair{"3 -> 2", two}, {"2 -> 1", one}, {"1 -> 2", back}}) {
    const double difference = whole_relative_difference(load_model(checkpoint(out, 3)), want);
    std::printf("resumed %s: final weights %.3g relative from the uninterrupted 3-rank run's\n",
                what, difference);
    EXPECT_LT(difference, 1e-5) << what;
  }
}

TEST_F(CheckpointShard, ResumeSkipsIncompleteCheckpoints) {
  const std::string out = directory_ + "/damaged";
  fs::copy(three_, out, fs::copy_options::recursive);
  fs::remove(out + "/DONE");  // the copy goes on training
  const std::string checkpoints = out + "/checkpoints/";
  fs::remove(checkpoints + "epoch-0003.pt.manifest");
  fs::remove(checkpoint_part_path(checkpoints + "epoch-0002.pt", 1, 3));
  {  // one flipped byte in the middle of epoch-0001's part 2
    const std::string part = checkpoint_part_path(checkpoints + "epoch-0001.pt", 2, 3);
    std::fstream file(part, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(fs::file_size(part) / 2));
    const char byte = static_cast<char>(file.peek() ^ 0x5a);
    file.seekp(static_cast<std::streamoff>(fs::file_size(part) / 2));
    file.put(byte);
  }
  train("damaged", 2, "--epochs 4 --shard-optimizer --resume auto");
  const std::string& output = last_output_;
  EXPECT_TRUE(contains(output, "skipping checkpoint " + checkpoints +
                                   "epoch-0003.pt: it has no manifest epoch-0003.pt.manifest"))
      << output;
  EXPECT_TRUE(contains(output, "skipping checkpoint " + checkpoints +
                                   "epoch-0002.pt: it has part epoch-0002.pt.part-0001-of-0003 "
                                   "which does not exist"))
      << output;
  EXPECT_TRUE(contains(output, "skipping checkpoint " + checkpoints +
                                   "epoch-0001.pt: it has part epoch-0001.pt.part-0002-of-0003 "
                                   "which is corrupt"))
      << output;
  EXPECT_TRUE(contains(output, "resumed from " + checkpoints + "epoch-0000.pt")) << output;
  // The run went on from there to the end, as the undamaged one did.
  EXPECT_LT(
      whole_relative_difference(load_model(checkpoint(out, 3)), load_model(checkpoint(three_, 3))),
      1e-5);
}

// A part rewritten with a table of runs of one column instead of five (as
// a file from elsewhere could be), its sidecar and manifest entry made to
// match: the resume refuses it naming the part, on every rank, without
// reading past the table.
TEST_F(CheckpointShard, MalformedPartIsRefusedNamingIt) {
  const std::string out = directory_ + "/malformed";
  fs::copy(three_, out, fs::copy_options::recursive);
  fs::remove(out + "/DONE");
  const std::string checkpoint_path = checkpoint(out, 1);
  const std::string part = checkpoint_part_path(checkpoint_path, 1, 3);
  torch::serialize::InputArchive in;
  in.load_from(part);
  torch::serialize::OutputArchive rewritten;
  for (const auto& key : in.keys()) {
    c10::IValue value;
    in.read(key, value);
    if (key == "part.runs") value = value.toTensor().narrow(1, 0, 1).contiguous();
    rewritten.write(key, value);
  }
  std::string bytes;
  rewritten.save_to([&](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  std::ofstream(part, std::ios::binary | std::ios::trunc) << bytes;
  const auto crc = static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  char crc_hex[16];
  std::snprintf(crc_hex, sizeof(crc_hex), "%08" PRIx32, crc);
  std::ofstream(part + ".crc32", std::ios::trunc)
      << "crc32 " << crc_hex << " size " << bytes.size() << "\n";
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(checkpoint_path + ".manifest"));
  for (auto& entry : manifest.at("parts")) {
    if (fs::path(part).filename() == entry.at("file").get<std::string>()) {
      entry["size"] = bytes.size();
      entry["crc32"] = crc_hex;
    }
  }
  std::ofstream(checkpoint_path + ".manifest", std::ios::trunc) << manifest.dump();

  const auto result = vqa::testing::run_process(
      vqa::testing::mpirun_prefix(2) + VQA_TRAIN + " --train-data " + dataset_ + " --out " + out +
          " " + kCommon + "--epochs 4 --shard-optimizer --resume " + checkpoint_path,
      120);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "checkpoint part " + part + " is unreadable: its part.runs"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "not int64 rows of 5")) << result.output;
}

}  // namespace
