// The check of a LibTorch archive's TorchScript source before LibTorch
// parses it (train/checkpoint_archive.h): a real checkpoint and best model
// pass; a class file that vqa-hpc would not write, classes in a cycle or a
// stray record in code/ are refused with the file and the line, through
// checkpoint_load as a user meets it; so is a damaged compressed record,
// which LibTorch's zip reader would hand over as whatever memory held.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <caffe2/serialize/inline_container.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "model/m3ae.h"                // M3AE
#include "model/model_config.h"        // model_config_preset
#include "process.h"                   // make_temp_dir
#include "train/checkpoint.h"          // checkpoint_save, checkpoint_load
#include "train/checkpoint_archive.h"  // torch_archive_problem
#include "train/optimizer.h"           // VqaOptimizer, OptimizerSettings
#include "train/train_log.h"           // RunLog
#include "train/train_state.h"         // TrainState
#include "util/zip_records.h"          // zip_records, zip_record_bytes

namespace fs = std::filesystem;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class CheckpointArchive : public ::testing::Test {
 protected:
  void SetUp() override {
    out_ = vqa::testing::make_temp_dir("archive");
    torch::manual_seed(1);
    vqa::train::TrainState state;
    state.next_epoch = 1;
    path_ = vqa::train::checkpoint_save(out_, model_, optimizer_, state, "", 0, &log_);
    bytes_ = read_bytes(path_);
  }

  // The archive rewritten by LibTorch's own zip writer with `from` replaced
  // by `to` in the record `record` (names inside the archive's folder), as a
  // hand edit or a tool would make it: every zip checksum matches.
  std::string edited(const std::string& record, const std::string& from, const std::string& to) {
    std::string out;
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      out.append(static_cast<const char*>(data), size);
      return size;
    });
    bool found = false;
    for (const vqa::util::ZipRecord& entry : vqa::util::zip_records(bytes_)) {
      const std::string name = entry.name.substr(entry.name.find('/') + 1);
      // The writer adds these itself.
      if (name == "version" || name == "byteorder" || name.rfind(".data/", 0) == 0) continue;
      std::string contents = vqa::util::zip_record_bytes(bytes_, entry);
      if (name == record) {
        const size_t at = contents.find(from);
        if (at == std::string::npos) {
          ADD_FAILURE() << record << " does not hold \"" << from << "\":\n" << contents;
        } else {
          contents.replace(at, from.size(), to);
          found = true;
        }
      }
      writer.writeRecord(name, contents.data(), contents.size(), entry.method == 8);
    }
    writer.writeEndOfFile();
    EXPECT_TRUE(found) << record;
    return out;
  }

  // What checkpoint_load says of `bytes` written as the checkpoint (the
  // sidecar removed: a file handed over without one loads unverified).
  std::string load_error(const std::string& bytes) {
    write_bytes(path_, bytes);
    fs::remove(vqa::train::checkpoint_sidecar_path(path_));
    vqa::train::TrainState state;
    try {
      vqa::train::checkpoint_load(path_, model_, optimizer_, state, log_);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }

  std::string out_;
  vqa::train::RunLog log_{"", /*writer=*/false};
  vqa::model::M3AE model_{vqa::model::model_config_preset("tiny")};
  vqa::train::VqaOptimizer optimizer_{model_, vqa::train::OptimizerSettings{}};
  std::string path_;
  std::string bytes_;
};

TEST_F(CheckpointArchive, RealCheckpointAndBestModelPass) {
  EXPECT_EQ(vqa::train::torch_archive_problem(bytes_), "");
  vqa::train::TrainState state;
  vqa::train::checkpoint_save_best(out_, model_, state);
  EXPECT_EQ(vqa::train::torch_archive_problem(read_bytes(out_ + "/best_model.pt")), "");
  EXPECT_EQ(load_error(bytes_), "");  // and it loads
}

// The input that made LibTorch 1.13's class parser segfault
// (tests/fuzz/regressions/checkpoint/renamed-parameters-torchscript-parser-segv).
TEST_F(CheckpointArchive, RenamedParameterListIsRefusedBeforeLibTorchParsesIt) {
  const std::string bytes =
      edited("code/__torch__/___torch_mangle_2.py", "__parameters__", "__7arameters__");
  EXPECT_EQ(vqa::train::torch_archive_problem(bytes),
            "has TorchScript source vqa-hpc does not write: code/__torch__/___torch_mangle_2.py "
            "line 2: \"  __7arameters__ = [\"weight\", ]\"");
  EXPECT_EQ(load_error(bytes),
            "checkpoint " + path_ + " " + vqa::train::torch_archive_problem(bytes));
}

TEST_F(CheckpointArchive, ClassesInACycleAreRefused) {
  // The vision encoder (class 1) names the model (class 0), which names it.
  const std::string bytes =
      edited("code/__torch__/___torch_mangle_1.py", "__torch__.___torch_mangle_2.Module",
             "__torch__.___torch_mangle_0.Module");
  EXPECT_EQ(vqa::train::torch_archive_problem(bytes),
            "has TorchScript classes that contain each other in a cycle, from "
            "code/__torch__.py");
}

TEST_F(CheckpointArchive, CodeOutsideTheClassFormsIsRefused) {
  // A method where an attribute line stands.
  std::string bytes =
      edited("code/__torch__/___torch_mangle_2.py", "  weight : Tensor", "  def f(x):return");
  EXPECT_NE(vqa::train::torch_archive_problem(bytes).find(
                "code/__torch__/___torch_mangle_2.py line 4: \"  def f(x):return\""),
            std::string::npos)
      << vqa::train::torch_archive_problem(bytes);
  // A type that is not one of the archive's.
  bytes = edited("code/__torch__/___torch_mangle_2.py", "weight : Tensor", "weight : Future");
  EXPECT_NE(vqa::train::torch_archive_problem(bytes).find("line 4: \"  weight : Future"),
            std::string::npos)
      << vqa::train::torch_archive_problem(bytes);
  // A class that the archive does not hold.
  bytes = edited("code/__torch__/___torch_mangle_1.py", "__torch__.___torch_mangle_2.Module",
                 "__torch__.___torch_mangle_999.Module");
  EXPECT_EQ(vqa::train::torch_archive_problem(bytes),
            "has TorchScript source that names a class it does not hold: "
            "code/__torch__/___torch_mangle_1.py names code/__torch__/___torch_mangle_999.py");
}

TEST_F(CheckpointArchive, DamagedCompressedRecordIsRefused) {
  for (const vqa::util::ZipRecord& entry : vqa::util::zip_records(bytes_)) {
    if (entry.name.find("/code/__torch__/___torch_mangle_1.py") == std::string::npos) continue;
    ASSERT_EQ(entry.method, 8) << "class files are deflated";
    std::string bytes = bytes_;
    bytes[entry.data_offset + entry.compressed / 2] ^= 0x5a;
    const std::string problem = vqa::train::torch_archive_problem(bytes);
    EXPECT_EQ(problem.rfind("is corrupt: record " + entry.name, 0), 0u) << problem;
    return;
  }
  FAIL() << "no class file 1 in the archive";
}

TEST_F(CheckpointArchive, NotAZipIsRefusedNamingTheFile) {
  const std::string problem = load_error("not a zip at all");
  EXPECT_EQ(problem.rfind("checkpoint " + path_ + " is not a LibTorch archive: ", 0), 0u)
      << problem;
}

}  // namespace
