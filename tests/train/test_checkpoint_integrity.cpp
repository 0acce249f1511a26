// Checkpoint integrity: checksums, fallback on resume, refusal of a named bad
// file, a writer killed mid-write, a full disk, rotation (loading across
// devices and dtypes: test_checkpoint_device.cpp). Real vqa_train runs
// under mpirun on a small synthetic set, a real tmpfs for the full disk, and a
// probe process (vqa_checkpoint_probe) that writes checkpoints through the
// job's own code and is killed with SIGKILL.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "process.h"           // run_process, mpirun_prefix, make_temp_dir
#include "run_files.h"         // read_metrics
#include "train/checkpoint.h"  // checkpoint_verify, checkpoint_save, checkpoint_latest
#include "util/clock.h"        // seconds_since

namespace fs = std::filesystem;
using vqa::testing::run_process;

namespace {

using vqa::testing::read_metrics;

using vqa::testing::contains;

// The first line of `text` containing `part` (for the test's own report).
std::string line_with(const std::string& text, const std::string& part) {
  const auto at = text.find(part);
  if (at == std::string::npos) return "";
  const auto start = text.rfind('\n', at);
  const auto begin = start == std::string::npos ? 0 : start + 1;
  return text.substr(begin, text.find('\n', at) - begin);
}

std::string read_text(const fs::path& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

// Inverts `count` bytes at `offset`: a corruption that keeps the size.
void flip_bytes(const fs::path& path, uint64_t offset, int count) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  for (int i = 0; i < count; ++i) {
    file.seekg(static_cast<std::streamoff>(offset + i));
    const char byte = static_cast<char>(file.get() ^ 0xff);
    file.seekp(static_cast<std::streamoff>(offset + i));
    file.put(byte);
  }
  ASSERT_TRUE(file.good()) << path;
}

std::vector<std::string> directory_listing(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += name + " ";
  return text;
}

using vqa::util::seconds_since;

class CheckpointIntegrity : public ::testing::Test {
 protected:
  // One short 2-rank run whose three checkpoints the tests copy and damage.
  static void SetUpTestSuite() {
    directory_ = vqa::testing::make_temp_dir("ckpt");
    dataset_ = directory_ + "/synth.h5";
    const auto prep = run_process(std::string(VQA_PREP) + " synth -o " + dataset_ +
                                      " --train-questions 256 --test-questions 64 --seed 7",
                                  120);
    ASSERT_EQ(prep.exit_code, 0) << prep.output;
    base_ = directory_ + "/base";
    const auto result = train(base_, kShortRun);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    for (const char* name : {"epoch-0000.pt", "epoch-0001.pt", "epoch-0002.pt"}) {
      ASSERT_TRUE(vqa::train::checkpoint_verify(base_ + "/checkpoints/" + name).good) << name;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }

  // vqa_train on 2 ranks with a checkpoint after every epoch, plus `flags`.
  static vqa::testing::ProcessResult train(const std::string& out, const std::string& flags,
                                           double timeout = 180) {
    return run_process(vqa::testing::mpirun_prefix(2) + VQA_TRAIN + " --train-data " + dataset_ +
                           " --out " + out +
                           " --threads 1 --progress off --lr 1e-3 --seed 3 --global-batch 16"
                           " --batch-per-rank 8 --save-every 1 " +
                           flags,
                       timeout);
  }

  // A copy of the base run as a job killed before it finished would leave it.
  static std::string copy_of_base(const std::string& name) {
    const std::string out = directory_ + "/" + name;
    fs::copy(base_, out, fs::copy_options::recursive);
    fs::remove(out + "/DONE");
    return out;
  }

  // The resumed run's epochs must repeat the uninterrupted run's exactly:
  // same ranks, threads and order of operations on CPU (tolerance 0).
  static void expect_same_losses_as_base(const std::string& out, int first_epoch) {
    const auto expected = read_metrics(base_);
    const auto got = read_metrics(out);
    ASSERT_EQ(expected.size(), 3u);
    const size_t resumed = 3 - static_cast<size_t>(first_epoch);
    ASSERT_GE(got.size(), resumed);
    for (size_t i = 0; i < resumed; ++i) {
      const auto& line = got[got.size() - resumed + i];
      const auto& want = expected[static_cast<size_t>(first_epoch) + i];
      EXPECT_EQ(line["epoch"], want["epoch"]);
      EXPECT_EQ(line["train_loss"].get<double>(), want["train_loss"].get<double>())
          << "epoch " << want["epoch"];
    }
  }

  // 3 epochs of 3 optimiser steps: the base run, and what the tests resume.
  static constexpr const char* kShortRun = " --epochs 3 --max-steps-per-epoch 3 --eval-every 0 ";
  static inline std::string directory_, dataset_, base_;
};

// The run died while it wrote epoch 2 and had damaged epoch 1 before: auto
// names both, resumes from epoch 0 and finishes as if nothing had happened.
TEST_F(CheckpointIntegrity, AutoResumeWalksBackPastCorruptAndTruncatedFilesAndCompletes) {
  const std::string out = copy_of_base("fallback");
  const fs::path corrupt = out + "/checkpoints/epoch-0002.pt";
  flip_bytes(corrupt, fs::file_size(corrupt) / 2, 16);
  const fs::path truncated = out + "/checkpoints/epoch-0001.pt";
  const auto size = fs::file_size(truncated);
  fs::resize_file(truncated, size / 2);

  const auto result = train(out, std::string(kShortRun) + "--resume auto");
  std::printf("%s\n%s\n", line_with(result.output, "skipping checkpoint").c_str(),
              line_with(result.output, "resumed from").c_str());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_LT(result.seconds, 120.0);
  EXPECT_TRUE(contains(result.output, "warning: --resume auto: skipping checkpoint " +
                                          corrupt.string() +
                                          ": it is corrupt: the CRC-32 of its bytes is "))
      << result.output;
  EXPECT_TRUE(contains(result.output, "warning: --resume auto: skipping checkpoint " +
                                          truncated.string() +
                                          ": it is truncated: " + std::to_string(size / 2) +
                                          " bytes, its checksum file says " + std::to_string(size)))
      << result.output;
  EXPECT_TRUE(
      contains(result.output, "resumed from " + out + "/checkpoints/epoch-0000.pt at epoch 1"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "training complete: 3 epochs")) << result.output;
  expect_same_losses_as_base(out, 1);
  // Both were rewritten by the resumed run.
  EXPECT_TRUE(vqa::train::checkpoint_verify(corrupt.string()).good);
  EXPECT_TRUE(vqa::train::checkpoint_verify(truncated.string()).good);
  EXPECT_EQ(read_text(out + "/checkpoints/latest"), "epoch-0002.pt\n");
}

TEST_F(CheckpointIntegrity, NamedCorruptOrTruncatedFileIsRefusedOnEveryRank) {
  const std::string out = copy_of_base("named");
  const fs::path corrupt = out + "/checkpoints/epoch-0001.pt";
  flip_bytes(corrupt, 100, 1);
  const fs::path truncated = out + "/checkpoints/epoch-0000.pt";
  fs::resize_file(truncated, fs::file_size(truncated) - 1);
  const auto listing = directory_listing(out + "/checkpoints");

  for (const auto& [file, problem] :
       {std::pair{corrupt, std::string("is corrupt: the CRC-32 of its bytes is")},
        std::pair{truncated, std::string("is truncated: ")}}) {
    const auto result = train(out, kShortRun + ("--resume " + file.string()), 60);
    std::printf("exit %d after %.1f s: %s\n", result.exit_code, result.seconds,
                line_with(result.output, "--resume: checkpoint").c_str());
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_LT(result.seconds, 30.0) << result.output;
    EXPECT_TRUE(contains(result.output, "error on rank ")) << result.output;
    EXPECT_TRUE(contains(result.output, "--resume: checkpoint " + file.string() + " " + problem))
        << result.output;
  }
  EXPECT_EQ(directory_listing(out + "/checkpoints"), listing);  // nothing written
}

TEST_F(CheckpointIntegrity, NoIntactCheckpointIsRefusedRatherThanStartingAfresh) {
  const std::string out = copy_of_base("none-intact");
  for (const char* name : {"epoch-0000.pt", "epoch-0001.pt", "epoch-0002.pt"}) {
    flip_bytes(out + "/checkpoints/" + name, 64, 4);
  }
  const auto result = train(out, std::string(kShortRun) + "--resume auto", 60);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_LT(result.seconds, 30.0) << result.output;
  EXPECT_TRUE(contains(result.output, "--resume auto: no intact checkpoint in " + out +
                                          "/checkpoints: epoch-0002.pt is corrupt"))
      << result.output;
}

// SIGKILL of a process inside checkpoint_save: the probe saves checkpoints of
// a 'small' model (~90 MB each) in a loop and is killed the moment a
// temporary file appears, that is while it writes one.
TEST_F(CheckpointIntegrity, WriterKilledMidWriteLeavesPreviousCheckpointIntact) {
  const fs::path out = directory_ + "/killed";
  const fs::path checkpoints = out / "checkpoints";
  const std::string log = directory_ + "/killed.log";
  // Built before fork: the child only calls exec.
  const std::string command = "exec " + std::string(VQA_CHECKPOINT_PROBE) + " write " +
                              out.string() + " small 0 0 3 > " + log;
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  const auto start = std::chrono::steady_clock::now();
  fs::path temporary;
  while (temporary.empty() && seconds_since(start) < 120) {
    std::error_code error;
    if (fs::exists(checkpoints / "latest", error)) {
      // A checkpoint's temporary file past its first MiB: the write is under way.
      for (const auto& entry : fs::directory_iterator(checkpoints, error)) {
        const fs::path& path = entry.path();
        if (path.extension() == ".tmp" && path.stem().extension() == ".pt" &&
            fs::file_size(path, error) > (1u << 20) && !error) {
          temporary = path;
        }
      }
    }
    if (temporary.empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(pid, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  waitpid(pid, &status, 0);
  const double exit_seconds = seconds_since(killed);
  ASSERT_FALSE(temporary.empty()) << "the probe never started a second checkpoint\n"
                                  << read_text(log);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_LT(exit_seconds, 5.0);
  // The kill landed inside the write: its temporary file is still there.
  std::error_code error;
  const auto partial = fs::file_size(temporary, error);
  ASSERT_FALSE(error) << temporary << " is gone: the kill came after the write";
  const std::string saved = read_text(log);
  const auto last = saved.rfind("saved ");
  ASSERT_NE(last, std::string::npos) << saved;
  const fs::path previous = saved.substr(last + 6, saved.find('\n', last) - last - 6);
  std::printf(
      "killed %.3f s after start, inside %s at %llu of %llu bytes; exit %.3f s after SIGKILL\n",
      seconds_since(start), temporary.filename().c_str(), static_cast<unsigned long long>(partial),
      static_cast<unsigned long long>(fs::file_size(previous)), exit_seconds);
  EXPECT_EQ(read_text(checkpoints / "latest"), previous.filename().string() + "\n");
  const int epoch = std::stoi(previous.filename().string().substr(6, 4));

  const auto verify =
      run_process(std::string(VQA_CHECKPOINT_PROBE) + " verify " + out.string() + " small", 60);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_TRUE(
      contains(verify.output, "verified " + previous.string() + " epoch " + std::to_string(epoch)))
      << verify.output;

  // The next save clears what the killed writer left (a tiny model: only the
  // clean-up matters here).
  const auto next = run_process(std::string(VQA_CHECKPOINT_PROBE) + " write " + out.string() +
                                    " tiny " + std::to_string(epoch + 1) + " 1 3",
                                60);
  EXPECT_EQ(next.exit_code, 0) << next.output;
  for (const auto& name : directory_listing(checkpoints)) {
    EXPECT_FALSE(fs::path(name).extension() == ".tmp") << name;
  }
  char next_name[32];
  std::snprintf(next_name, sizeof(next_name), "epoch-%04d.pt", epoch + 1);
  EXPECT_EQ(read_text(checkpoints / "latest"), std::string(next_name) + "\n");
  EXPECT_TRUE(vqa::train::checkpoint_verify((checkpoints / next_name).string()).good);
}

// A real full disk: a tmpfs (mounting needs root; CI runs as root) that holds
// the first checkpoint of the run but not the second.
TEST_F(CheckpointIntegrity, FullDiskEndsTheJobWithEnospcAndKeepsPreviousCheckpoint) {
  const uint64_t checkpoint_bytes = fs::file_size(base_ + "/checkpoints/epoch-0000.pt");
  const std::string mount_point = directory_ + "/full";
  fs::create_directories(mount_point);
  const std::string options = "size=" + std::to_string(checkpoint_bytes * 3 / 2 + (256 << 10));
  ASSERT_EQ(mount("tmpfs", mount_point.c_str(), "tmpfs", 0, options.c_str()), 0)
      << "mounting a tmpfs needs root (CI runs as root): " << std::strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{mount_point};

  const std::string out = mount_point + "/run";
  const auto result = train(out, kShortRun, 60);
  std::printf("exit %d after %.1f s: %s\n", result.exit_code, result.seconds,
              line_with(result.output, "not saved").c_str());
  EXPECT_EQ(result.exit_code, vqa::train::kExitCheckpointWriteFailed) << result.output;
  EXPECT_LT(result.seconds, 30.0) << result.output;
  EXPECT_TRUE(contains(result.output,
                       "checkpoint " + out + "/checkpoints/epoch-0001.pt not saved: cannot write " +
                           out + "/checkpoints/epoch-0001.pt.tmp: write failed after "))
      << result.output;
  EXPECT_TRUE(contains(result.output, "No space left on device (ENOSPC)")) << result.output;
  EXPECT_TRUE(contains(result.output, out + "/checkpoints/epoch-0000.pt is still the latest good "
                                            "checkpoint"))
      << result.output;
  EXPECT_EQ(directory_listing(out + "/checkpoints"),
            (std::vector<std::string>{"epoch-0000.pt", "epoch-0000.pt.crc32", "latest"}));
  EXPECT_TRUE(vqa::train::checkpoint_verify(out + "/checkpoints/epoch-0000.pt").good);

  // And the run continues from it once there is room.
  const std::string moved = directory_ + "/full-resumed";
  fs::copy(out, moved, fs::copy_options::recursive);
  const auto resumed = train(moved, std::string(kShortRun) + "--resume auto");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + moved + "/checkpoints/epoch-0000.pt"))
      << resumed.output;
  expect_same_losses_as_base(moved, 1);
}

// The same failure path through RLIMIT_FSIZE, which needs no root: the write
// fails with EFBIG instead of ENOSPC.
TEST_F(CheckpointIntegrity, FileSizeLimitFailsCleanlyWithoutTemporaryFiles) {
  const std::string out = directory_ + "/fsize";
  const auto result =
      run_process(std::string(VQA_CHECKPOINT_PROBE) + " write " + out + " tiny 0 3 3 65536", 60);
  EXPECT_EQ(result.exit_code, vqa::train::kExitCheckpointWriteFailed) << result.output;
  EXPECT_LT(result.seconds, 30.0);
  EXPECT_TRUE(contains(result.output, "File too large (EFBIG)")) << result.output;
  EXPECT_TRUE(contains(result.output, out + "/checkpoints/epoch-0000.pt is still the latest good"))
      << result.output;
  EXPECT_EQ(directory_listing(out + "/checkpoints"),
            (std::vector<std::string>{"epoch-0000.pt", "epoch-0000.pt.crc32", "latest"}));
  const auto verify =
      run_process(std::string(VQA_CHECKPOINT_PROBE) + " verify " + out + " tiny", 60);
  EXPECT_TRUE(contains(verify.output, "verified " + out + "/checkpoints/epoch-0000.pt epoch 0"))
      << verify.output;
}

TEST_F(CheckpointIntegrity, RotationKeepsTheLastKAndTheBestModel) {
  const std::string out = directory_ + "/rotation";
  const auto result =
      train(out, "--epochs 4 --max-steps-per-epoch 2 --eval-every 1 --keep-checkpoints 2");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_LT(result.seconds, 120.0);
  EXPECT_TRUE(contains(result.output, "keep-checkpoints = 2")) << result.output;
  EXPECT_EQ(directory_listing(out + "/checkpoints"),
            (std::vector<std::string>{"epoch-0002.pt", "epoch-0002.pt.crc32", "epoch-0003.pt",
                                      "epoch-0003.pt.crc32", "latest"}))
      << joined(directory_listing(out + "/checkpoints"));
  EXPECT_EQ(read_text(out + "/checkpoints/latest"), "epoch-0003.pt\n");
  EXPECT_TRUE(vqa::train::checkpoint_verify(out + "/best_model.pt").good);
}

// Rotation in training order, mid-epoch (stop request) checkpoints included;
// 0 keeps all. In-process, on the tiny model.
TEST(CheckpointRotation, OrdersMidEpochFilesInsideTheirEpochAndZeroKeepsAll) {
  const std::string out = vqa::testing::make_temp_dir("rotation");
  vqa::train::RunLog log(out, /*writer=*/true);
  vqa::model::M3AE model(vqa::model::model_config_preset("tiny"));
  vqa::train::VqaOptimizer optimizer(model, vqa::train::OptimizerSettings{});
  auto save = [&](int64_t next_epoch, int64_t step_in_epoch, int keep) {
    vqa::train::TrainState state;
    state.next_epoch = next_epoch;
    state.step_in_epoch = step_in_epoch;
    return fs::path(vqa::train::checkpoint_save(out, model, optimizer, state, "", keep))
        .filename()
        .string();
  };
  EXPECT_EQ(save(1, 0, 2), "epoch-0000.pt");
  EXPECT_EQ(save(1, 4, 2), "epoch-0001-step-000004.pt");
  EXPECT_EQ(save(2, 0, 2), "epoch-0001.pt");
  EXPECT_EQ(save(2, 1, 2), "epoch-0002-step-000001.pt");
  EXPECT_EQ(
      directory_listing(out + "/checkpoints"),
      (std::vector<std::string>{"epoch-0001.pt", "epoch-0001.pt.crc32", "epoch-0002-step-000001.pt",
                                "epoch-0002-step-000001.pt.crc32", "latest"}));
  save(3, 0, 0);
  save(4, 0, 0);
  EXPECT_EQ(directory_listing(out + "/checkpoints").size(), 9u)
      << joined(directory_listing(out + "/checkpoints"));
  EXPECT_EQ(vqa::train::checkpoint_latest(out, log), out + "/checkpoints/epoch-0003.pt");
  fs::remove_all(out);
}

// --resume auto's choice, in-process: a corrupt newest file is passed over
// and `latest` is pointed at the file chosen.
TEST(CheckpointLatest, PassesOverCorruptFileAndRepointsLatest) {
  const std::string out = vqa::testing::make_temp_dir("latest");
  vqa::train::RunLog log(out, /*writer=*/true);
  EXPECT_EQ(vqa::train::checkpoint_latest(out, log), "");
  vqa::model::M3AE model(vqa::model::model_config_preset("tiny"));
  vqa::train::VqaOptimizer optimizer(model, vqa::train::OptimizerSettings{});
  std::vector<std::string> paths;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    vqa::train::TrainState state;
    state.next_epoch = epoch + 1;
    paths.push_back(
        vqa::train::checkpoint_save(out, model, optimizer, state, "", /*keep_checkpoints=*/0));
  }
  EXPECT_EQ(vqa::train::checkpoint_latest(out, log), paths[2]);
  flip_bytes(paths[2], 1000, 1);
  EXPECT_EQ(vqa::train::checkpoint_latest(out, log), paths[1]);
  EXPECT_EQ(read_text(out + "/checkpoints/latest"), "epoch-0001.pt\n");
  fs::remove_all(out);
}

// Every single-bit flip, appended byte, truncation and damaged sidecar is
// reported, each with its own wording.
TEST(CheckpointVerify, ReportsEachKindOfDamage) {
  const std::string out = vqa::testing::make_temp_dir("verify");
  vqa::model::M3AE model(vqa::model::model_config_preset("tiny"));
  vqa::train::VqaOptimizer optimizer(model, vqa::train::OptimizerSettings{});
  vqa::train::TrainState state;
  state.next_epoch = 1;
  const std::string path =
      vqa::train::checkpoint_save(out, model, optimizer, state, "", /*keep_checkpoints=*/0);
  const std::string sidecar = vqa::train::checkpoint_sidecar_path(path);
  ASSERT_TRUE(vqa::train::checkpoint_verify(path).good);
  const auto size = fs::file_size(path);
  for (uint64_t offset : {uint64_t{0}, size / 3, size - 1}) {
    flip_bytes(path, offset, 1);
    const auto check = vqa::train::checkpoint_verify(path);
    EXPECT_FALSE(check.good) << offset;
    EXPECT_TRUE(contains(check.problem, "is corrupt: the CRC-32 of its bytes is")) << check.problem;
    flip_bytes(path, offset, 1);
    EXPECT_TRUE(vqa::train::checkpoint_verify(path).good) << offset;
  }
  std::ofstream(path, std::ios::app) << 'x';
  EXPECT_TRUE(contains(vqa::train::checkpoint_verify(path).problem,
                       "has " + std::to_string(size + 1) + " bytes, its checksum file says " +
                           std::to_string(size)));
  fs::resize_file(path, 10);
  EXPECT_EQ(vqa::train::checkpoint_verify(path).problem,
            "is truncated: 10 bytes, its checksum file says " + std::to_string(size));
  std::ofstream(sidecar) << "garbage\n";
  EXPECT_TRUE(contains(vqa::train::checkpoint_verify(path).problem,
                       "has an unreadable checksum file " + sidecar + " ('garbage')"));
  fs::remove(sidecar);
  EXPECT_EQ(vqa::train::checkpoint_verify(path).problem, "has no checksum file " + sidecar);
  fs::remove_all(out);
}

}  // namespace
