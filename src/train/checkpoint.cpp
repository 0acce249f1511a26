#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "runtime/check.h"        // fatal_user_error
#include "runtime/distributed.h"  // distributed_rank_info: only rank 0 warns

namespace fs = std::filesystem;

namespace vqa::train {

namespace {

void write_state(torch::serialize::OutputArchive& archive, const TrainState& state) {
  archive.write("state.next_epoch", torch::tensor(state.next_epoch));
  archive.write("state.global_step", torch::tensor(state.global_step));
  archive.write("state.best_overall", torch::tensor(state.best_overall, torch::kFloat64));
  archive.write("state.best_epoch", torch::tensor(state.best_epoch));
  archive.write("state.step_in_epoch", torch::tensor(state.step_in_epoch));
  archive.write("state.partial_loss_sums",
                torch::tensor(state.partial_loss_sums, torch::kFloat64).reshape({-1}));
  archive.write("state.partial_samples",
                torch::tensor(state.partial_samples, torch::kInt64).reshape({-1}));
}

void read_state(torch::serialize::InputArchive& archive, TrainState& state) {
  // A fresh tensor per key: InputArchive::read into a defined tensor calls
  // set_() on it, which keeps the old dtype over the new bytes (an int64
  // tensor then reads a float64 value as garbage).
  const auto read = [&archive](const char* key) {
    torch::Tensor value;
    archive.read(key, value);
    return value;
  };
  const auto try_read = [&archive](const char* key) {
    torch::Tensor value;
    archive.try_read(key, value);
    return value;
  };
  state.next_epoch = read("state.next_epoch").item<int64_t>();
  state.global_step = read("state.global_step").item<int64_t>();
  state.best_overall = read("state.best_overall").item<double>();
  state.best_epoch = read("state.best_epoch").item<int64_t>();
  // Absent from checkpoints written before mid-epoch stops existed: an epoch boundary.
  const auto step_in_epoch = try_read("state.step_in_epoch");
  state.step_in_epoch = step_in_epoch.defined() ? step_in_epoch.item<int64_t>() : 0;
  state.partial_loss_sums.clear();
  state.partial_samples.clear();
  if (const auto sums = try_read("state.partial_loss_sums"); sums.defined()) {
    const auto values = sums.to(torch::kFloat64).contiguous();
    state.partial_loss_sums.assign(values.data_ptr<double>(),
                                   values.data_ptr<double>() + values.numel());
  }
  if (const auto counts = try_read("state.partial_samples"); counts.defined()) {
    const auto values = counts.to(torch::kInt64).contiguous();
    state.partial_samples.assign(values.data_ptr<int64_t>(),
                                 values.data_ptr<int64_t>() + values.numel());
  }
  if (state.partial_samples.size() != state.partial_loss_sums.size()) {
    throw std::runtime_error("state.partial_samples and state.partial_loss_sums differ in length");
  }
}

// ---- files written durably, with a CRC-32 ------------------------------------

// "No space left on device (ENOSPC)": the text users search for and the name
// administrators know.
std::string system_error_text(int error) {
  static const std::pair<int, const char*> kNames[] = {
      {ENOSPC, "ENOSPC"}, {EDQUOT, "EDQUOT"}, {EFBIG, "EFBIG"},   {EIO, "EIO"},
      {EROFS, "EROFS"},   {EACCES, "EACCES"}, {ENOENT, "ENOENT"}, {EISDIR, "EISDIR"}};
  std::string name = "errno " + std::to_string(error);
  for (const auto& [code, text] : kNames) {
    if (code == error) name = text;
  }
  return std::string(std::strerror(error)) + " (" + name + ")";
}

// zlib's crc32 takes a uInt length; crc32_z takes size_t, for files over 4 GiB.
// A null pointer would make it return its initial value (LibTorch's zip
// writer does pass empty buffers), so empty pieces are skipped.
uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  if (size == 0) return crc;
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), size));
}

// A new file written through a POSIX descriptor, every call checked. The first
// failure is kept, and later writes are accepted and dropped: LibTorch's zip
// writer, which calls write() back, may throw from its destructor while an
// exception unwinds, so the failure is reported after it returns instead.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("open");
  }
  ~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  size_t write(const void* data, size_t size) {
    if (error_.empty()) {
      const char* bytes = static_cast<const char*>(data);
      size_t done = 0;
      while (done < size) {
        const ssize_t written = ::write(fd_, bytes + done, size - done);
        if (written < 0 && errno == EINTR) continue;
        if (written < 0) {
          bytes_ += done;
          fail("write");
          return size;
        }
        done += static_cast<size_t>(written);
      }
      crc_ = crc32_update(crc_, data, size);
      bytes_ += size;
    }
    return size;
  }

  // fsync and close; false (see error()) when anything failed on the way.
  bool finish() {
    if (error_.empty() && ::fsync(fd_) != 0) fail("fsync");
    if (fd_ >= 0 && ::close(fd_) != 0 && error_.empty()) fail("close");
    fd_ = -1;
    return error_.empty();
  }
  void fail_with(const std::string& error) {
    if (error_.empty()) error_ = error;
  }

  const std::string& error() const { return error_; }
  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void fail(const char* call) {
    const int error = errno;
    fail_with(std::string(call) + " failed after " + std::to_string(bytes_) +
              " bytes: " + system_error_text(error));
  }

  int fd_ = -1;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  std::string error_;
};

// Makes a rename inside `directory` durable. Some network file systems
// refuse fsync on a directory (EINVAL); their renames are synchronous.
void fsync_directory(const fs::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error("cannot open " + directory.string() + ": " + system_error_text(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) {
    throw std::runtime_error("fsync of " + directory.string() +
                             " failed: " + system_error_text(error));
  }
}

void rename_durably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int error = errno;
    ::unlink(from.c_str());
    throw std::runtime_error("cannot rename " + from + " to " + to + ": " +
                             system_error_text(error));
  }
  fsync_directory(fs::path(to).parent_path().empty() ? fs::path(".") : fs::path(to).parent_path());
}

struct Sidecar {
  uint32_t crc = 0;
  uint64_t size = 0;
};

std::string sidecar_text(uint32_t crc, uint64_t size) {
  char text[64];
  std::snprintf(text, sizeof(text), "crc32 %08" PRIx32 " size %" PRIu64 "\n", crc, size);
  return text;
}

// Reads path's sidecar; on failure `problem` completes "checkpoint PATH ...".
bool sidecar_read(const std::string& path, Sidecar& sidecar, std::string& problem) {
  const std::string sidecar_path = checkpoint_sidecar_path(path);
  std::ifstream file(sidecar_path);
  if (!file) {
    problem = "has no checksum file " + sidecar_path;
    return false;
  }
  std::string line;
  std::getline(file, line);
  unsigned int crc = 0;
  unsigned long long size = 0;
  int consumed = 0;
  if (std::sscanf(line.c_str(), "crc32 %8x size %llu%n", &crc, &size, &consumed) != 2 ||
      consumed != static_cast<int>(line.size())) {
    problem = "has an unreadable checksum file " + sidecar_path + " ('" + line.substr(0, 80) + "')";
    return false;
  }
  sidecar.crc = crc;
  sidecar.size = size;
  return true;
}

// "" when size and CRC match the sidecar; otherwise what is wrong.
std::string sidecar_compare(const Sidecar& sidecar, uint64_t size, uint32_t crc) {
  char text[160];
  if (size < sidecar.size) {
    std::snprintf(text, sizeof(text),
                  "is truncated: %" PRIu64 " bytes, its checksum file says %" PRIu64, size,
                  sidecar.size);
  } else if (size > sidecar.size) {
    std::snprintf(text, sizeof(text),
                  "has %" PRIu64 " bytes, its checksum file says %" PRIu64
                  " (bytes appended, or another file under its name)",
                  size, sidecar.size);
  } else if (crc != sidecar.crc) {
    std::snprintf(text, sizeof(text),
                  "is corrupt: the CRC-32 of its bytes is %08" PRIx32
                  ", its checksum file says %08" PRIx32,
                  crc, sidecar.crc);
  } else {
    return "";
  }
  return text;
}

// Streams the file to consume(data, size); throws std::runtime_error whose
// text completes "checkpoint PATH ...".
template <typename Consume>
void read_file(const std::string& path, Consume consume) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error(errno == ENOENT ? "does not exist"
                                             : "cannot be opened: " + system_error_text(errno));
  }
  std::vector<char> chunk(1 << 20);
  for (;;) {
    const ssize_t got = ::read(fd, chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      ::close(fd);
      throw std::runtime_error("cannot be read: " + system_error_text(error));
    }
    if (got == 0) break;
    consume(chunk.data(), static_cast<size_t>(got));
  }
  ::close(fd);
}

// F.tmp, fsync, sidecar, rename to F, fsync of the directory. On failure the
// temporary files are gone and F, if it existed, is untouched.
void archive_write_verified(torch::serialize::OutputArchive& archive, const std::string& path) {
  const std::string temporary = path + ".tmp";
  FileWriter file(temporary);
  try {
    archive.save_to([&file](const void* data, size_t size) { return file.write(data, size); });
  } catch (const c10::Error& e) {
    file.fail_with(std::string("LibTorch could not serialise it: ") + e.what_without_backtrace());
  }
  if (!file.finish()) {
    ::unlink(temporary.c_str());
    throw std::runtime_error("cannot write " + temporary + ": " + file.error());
  }
  try {
    write_file_atomically(checkpoint_sidecar_path(path), sidecar_text(file.crc(), file.bytes()));
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  rename_durably(temporary, path);
}

// ---- names, rotation and choice --------------------------------------------

// Training order of a checkpoint file: epoch-E-step-S.pt lies inside epoch E,
// epoch-E.pt at its end.
struct CheckpointName {
  int64_t epoch = 0;
  int64_t step = 0;
  bool operator<(const CheckpointName& other) const {
    return epoch != other.epoch ? epoch < other.epoch : step < other.step;
  }
};

std::optional<CheckpointName> checkpoint_name_parse(const std::string& name) {
  long long epoch = 0, step = 0;
  int consumed = 0;
  const int length = static_cast<int>(name.size());
  if (std::sscanf(name.c_str(), "epoch-%lld-step-%lld.pt%n", &epoch, &step, &consumed) == 2 &&
      consumed == length) {
    return CheckpointName{epoch, step};
  }
  consumed = 0;
  if (std::sscanf(name.c_str(), "epoch-%lld.pt%n", &epoch, &consumed) == 1 && consumed == length) {
    return CheckpointName{epoch, std::numeric_limits<int64_t>::max()};
  }
  return std::nullopt;
}

struct CheckpointFile {
  CheckpointName order;
  std::string name;
};

// The checkpoint files in `directory`, newest first.
std::vector<CheckpointFile> checkpoint_files(const fs::path& directory) {
  std::vector<CheckpointFile> files;
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const auto order = checkpoint_name_parse(name);
    if (order && it->is_regular_file(error)) files.push_back({*order, name});
  }
  std::sort(files.begin(), files.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) { return b.order < a.order; });
  return files;
}

// What a killed writer left: temporary files, and a sidecar whose checkpoint
// was never renamed into place. Only rank 0 writes, so when it starts a save
// nothing else is writing here.
void remove_stale_files(const fs::path& directory) {
  std::vector<fs::path> stale;
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const fs::path& path = it->path();
    if (path.extension() == ".tmp" ||
        (path.extension() == ".crc32" && !fs::exists(fs::path(path).replace_extension(), error))) {
      stale.push_back(path);
    }
  }
  for (const auto& path : stale) fs::remove(path, error);
}

void remove_checkpoint(const fs::path& path) {
  std::error_code error;
  // The file first: a sidecar alone is harmless, a file alone unverifiable.
  fs::remove(path, error);
  if (!error) fs::remove(checkpoint_sidecar_path(path.string()), error);
  if (error) {
    std::fprintf(stderr, "[vqa] warning: cannot remove old checkpoint %s: %s\n",
                 path.string().c_str(), error.message().c_str());
  }
}

// Keeps the newest `keep` checkpoints and `just_written`; 0 keeps all.
void rotate_checkpoints(const fs::path& directory, int64_t keep, const std::string& just_written) {
  if (keep <= 0) return;
  const auto files = checkpoint_files(directory);
  for (size_t i = static_cast<size_t>(keep); i < files.size(); ++i) {
    if (files[i].name != just_written) remove_checkpoint(directory / files[i].name);
  }
}

// "keep-checkpoints = K" in the resolved configuration; 0 (all) without it.
int64_t keep_checkpoints_from_config(const std::string& config_ini) {
  std::istringstream lines(config_ini);
  std::string line;
  while (std::getline(lines, line)) {
    long long keep = 0;
    if (std::sscanf(line.c_str(), "keep-checkpoints = %lld", &keep) == 1) return keep;
  }
  return 0;
}

std::string latest_name(const fs::path& directory) {
  std::ifstream latest(directory / "latest");
  std::string name;
  latest >> name;
  return name;
}

bool rank_zero() { return runtime::distributed_rank_info().rank == 0; }

// Ends the job after a failed write; every earlier file is as it was.
[[noreturn]] void fail_write(const std::string& what, const std::string& error,
                             const fs::path& directory) {
  const std::string previous = latest_name(directory);
  runtime::fatal_user_error(
      what + " not saved: " + error + "; its temporary files were removed; " +
          (previous.empty() ? std::string("there is no earlier checkpoint")
                            : (directory / previous).string() +
                                  " is still the latest good checkpoint (--resume auto continues "
                                  "from it)"),
      kExitCheckpointWriteFailed);
}

}  // namespace

std::string checkpoint_sidecar_path(const std::string& path) { return path + ".crc32"; }

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  FileWriter file(temporary);
  file.write(text.data(), text.size());
  if (!file.finish()) {
    ::unlink(temporary.c_str());
    throw std::runtime_error("cannot write " + temporary + ": " + file.error());
  }
  rename_durably(temporary, path);
}

CheckpointCheck checkpoint_verify(const std::string& path) {
  Sidecar sidecar;
  std::string problem;
  if (!fs::exists(path)) return {false, "does not exist"};
  if (!sidecar_read(path, sidecar, problem)) return {false, problem};
  uint32_t crc = 0;
  uint64_t size = 0;
  try {
    read_file(path, [&](const char* data, size_t bytes) {
      crc = crc32_update(crc, data, bytes);
      size += bytes;
    });
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
  problem = sidecar_compare(sidecar, size, crc);
  return {problem.empty(), problem};
}

std::string checkpoint_save(const std::string& out_dir, model::M3AE& model, VqaOptimizer& optimizer,
                            const TrainState& state, const std::string& config_ini) {
  const fs::path directory = fs::path(out_dir) / "checkpoints";
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) {
    fail_write("checkpoint", "cannot create " + directory.string() + ": " + error.message(),
               directory);
  }
  // epoch-NNNN.pt after epoch NNNN; epoch-NNNN-step-SSSSSS.pt inside epoch
  // NNNN after SSSSSS of its optimiser steps (a stop request).
  char name[64];
  if (state.step_in_epoch > 0) {
    std::snprintf(name, sizeof(name), "epoch-%04lld-step-%06lld.pt",
                  static_cast<long long>(state.next_epoch),
                  static_cast<long long>(state.step_in_epoch));
  } else {
    std::snprintf(name, sizeof(name), "epoch-%04lld.pt",
                  static_cast<long long>(state.next_epoch - 1));
  }
  const std::string path = (directory / name).string();

  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive;
  model->save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.adamw().save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  write_state(archive, state);
  archive.write("config", c10::IValue(config_ini));
  remove_stale_files(directory);
  try {
    archive_write_verified(archive, path);
    write_file_atomically((directory / "latest").string(), std::string(name) + "\n");
  } catch (const std::exception& e) {
    fail_write("checkpoint " + path, e.what(), directory);
  }
  rotate_checkpoints(directory, keep_checkpoints_from_config(config_ini), name);
  return path;
}

void checkpoint_save_best(const std::string& out_dir, model::M3AE& model, const TrainState& state) {
  const fs::path path = fs::path(out_dir) / "best_model.pt";
  std::error_code error;
  fs::create_directories(out_dir, error);
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive;
  model->save(model_archive);
  archive.write("model", model_archive);
  write_state(archive, state);
  try {
    if (error) throw std::runtime_error("cannot create " + out_dir + ": " + error.message());
    archive_write_verified(archive, path.string());
  } catch (const std::exception& e) {
    fail_write("best model " + path.string(), e.what(), fs::path(out_dir) / "checkpoints");
  }
}

std::string checkpoint_latest(const std::string& out_dir) {
  const fs::path directory = fs::path(out_dir) / "checkpoints";
  const auto files = checkpoint_files(directory);
  // `latest` first: it is the commit point of a save. Then the ones before it
  // (all, newest first, when `latest` is missing or names no file).
  std::vector<std::string> candidates;
  const std::string named = latest_name(directory);
  const auto named_order = checkpoint_name_parse(named);
  const bool named_exists = !named.empty() && fs::exists(directory / named);
  if (named_exists) candidates.push_back(named);
  for (const auto& file : files) {
    if (file.name == named) continue;
    if (named_exists && named_order && !(file.order < *named_order)) continue;
    candidates.push_back(file.name);
  }
  std::string skipped;
  for (const auto& name : candidates) {
    const std::string path = (directory / name).string();
    const CheckpointCheck check = checkpoint_verify(path);
    if (check.good) {
      if (!skipped.empty() && rank_zero()) {
        std::fprintf(stderr,
                     "[vqa] warning: --resume auto: using %s, the newest intact checkpoint; "
                     "`latest` names it from now on\n",
                     path.c_str());
        try {  // so that `latest` names a good file while this run trains
          write_file_atomically((directory / "latest").string(), name + "\n");
        } catch (const std::exception& e) {
          std::fprintf(stderr, "[vqa] warning: %s\n", e.what());
        }
      }
      return path;
    }
    if (rank_zero()) {
      std::fprintf(stderr, "[vqa] warning: --resume auto: skipping checkpoint %s: it %s\n",
                   path.c_str(), check.problem.c_str());
    }
    skipped += (skipped.empty() ? "" : "; ") + name + " " + check.problem;
  }
  if (!skipped.empty()) {
    runtime::fatal_user_error("--resume auto: no intact checkpoint in " + directory.string() +
                              ": " + skipped +
                              ". Resume from another file with --resume FILE, or start afresh in "
                              "another --out");
  }
  return "";
}

void checkpoint_load(const std::string& path, model::M3AE& model, VqaOptimizer& optimizer,
                     TrainState& state) {
  std::string bytes;
  try {
    read_file(path, [&bytes](const char* data, size_t size) { bytes.append(data, size); });
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint " + path + " " + e.what());
  }
  Sidecar sidecar;
  std::string problem;
  if (sidecar_read(path, sidecar, problem)) {
    problem = sidecar_compare(sidecar, bytes.size(), crc32_update(0, bytes.data(), bytes.size()));
    if (!problem.empty()) {
      throw std::runtime_error("checkpoint " + path + " " + problem +
                               " (--resume auto falls back to the newest intact checkpoint)");
    }
  } else if (fs::exists(checkpoint_sidecar_path(path))) {
    throw std::runtime_error("checkpoint " + path + " " + problem);
  } else if (rank_zero()) {
    std::fprintf(stderr, "[vqa] warning: checkpoint %s %s: loading it unverified\n", path.c_str(),
                 problem.c_str());
  }
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size());
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    model->load(model_archive);
    torch::serialize::InputArchive optimizer_archive;
    archive.read("optimizer", optimizer_archive);
    optimizer.adamw().load(optimizer_archive);
    read_state(archive, state);
  } catch (const c10::Error& e) {
    throw std::runtime_error("checkpoint " + path +
                             " is unreadable: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint " + path + " is unreadable: " + e.what());
  }
}

}  // namespace vqa::train
