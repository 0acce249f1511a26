#include "train/checkpoint.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "runtime/check.h"             // fatal_user_error
#include "train/checkpoint_archive.h"  // torch_archive_load
#include "train/checkpoint_shards.h"   // manifests and parts of sharded checkpoints
#include "train/checkpoint_sidecar.h"  // archive_write_verified, read_verified
#include "train/checkpoint_weights.h"  // load_module_weights
#include "util/durable_file.h"         // DurableFileWriter, write_file_atomically, crc32_update

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
  archive.write("state.loss_scale", torch::tensor(state.loss_scale, torch::kFloat64));
  archive.write("state.loss_scale_growth", torch::tensor(state.loss_scale_growth));
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
  // Absent from checkpoints written before --precision fp16: no scaler state.
  const auto loss_scale = try_read("state.loss_scale");
  state.loss_scale = loss_scale.defined() ? loss_scale.item<double>() : 0.0;
  const auto loss_scale_growth = try_read("state.loss_scale_growth");
  state.loss_scale_growth = loss_scale_growth.defined() ? loss_scale_growth.item<int64_t>() : 0;
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

void remove_checkpoint(const fs::path& path, RunLog* log) {
  std::error_code error;
  // A sharded one's manifest first: without it the rest is incomplete.
  const std::string name = path.filename().string();
  const bool sharded = checkpoint_is_sharded(path.parent_path(), name);
  if (sharded) fs::remove(path.parent_path() / checkpoint_manifest_name(name), error);
  // The file first: a sidecar alone is harmless, a file alone unverifiable.
  if (!error) fs::remove(path, error);
  if (!error) fs::remove(checkpoint_sidecar_path(path.string()), error);
  if (!error && sharded) checkpoint_shards_remove(path.parent_path(), name, error);
  if (!error) return;
  const std::string warning =
      "cannot remove old checkpoint " + path.string() + ": " + error.message();
  if (log) {
    log->warn(warning);
  } else {
    std::fprintf(stderr, "[vqa] warning: %s\n", warning.c_str());
  }
}

// Keeps the newest `keep` checkpoints and `just_written`; 0 keeps all.
void rotate_checkpoints(const fs::path& directory, int64_t keep, const std::string& just_written,
                        RunLog* log) {
  if (keep <= 0) return;
  const auto files = checkpoint_files(directory);
  for (size_t i = static_cast<size_t>(keep); i < files.size(); ++i) {
    if (files[i].name != just_written) remove_checkpoint(directory / files[i].name, log);
  }
}

std::string latest_name(const fs::path& directory) {
  std::ifstream latest(directory / "latest");
  std::string name;
  latest >> name;
  return name;
}

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

CheckpointCheck checkpoint_verify(const std::string& path) {
  Sidecar sidecar;
  std::string problem;
  if (!fs::exists(path)) return {false, "does not exist"};
  if (!sidecar_read(path, sidecar, problem)) return {false, problem};
  uint32_t crc = 0;
  uint64_t size = 0;
  try {
    util::read_file_chunks(path, [&](const char* data, size_t bytes) {
      crc = util::crc32_update(crc, data, bytes);
      size += bytes;
    });
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
  problem = sidecar_compare(sidecar, size, crc);
  return {problem.empty(), problem};
}

std::string checkpoint_file_name(const TrainState& state) {
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
  return name;
}

void checkpoint_archive_fill(torch::serialize::OutputArchive& archive,
                             torch::serialize::OutputArchive& model_archive,
                             torch::serialize::OutputArchive* optimizer_archive,
                             const TrainState& state, const std::string* config_ini) {
  archive.write("model", model_archive);
  if (optimizer_archive) archive.write("optimizer", *optimizer_archive);
  write_state(archive, state);
  if (config_ini) archive.write("config", c10::IValue(*config_ini));
}

std::string checkpoint_write(const std::string& out_dir, const std::string& name,
                             torch::serialize::OutputArchive& archive, int keep_checkpoints,
                             RunLog* log, const CheckpointProgress& progress,
                             const std::vector<CheckpointPartEntry>* parts) {
  const fs::path directory = fs::path(out_dir) / "checkpoints";
  const std::string path = (directory / name).string();
  try {
    fs::create_directories(directory);
    remove_stale_files(directory);
    const Sidecar sidecar = archive_write_verified(archive, path, progress);
    if (parts)
      checkpoint_manifest_write(directory, name, {name, sidecar.size, sidecar.crc}, *parts);
    util::write_file_atomically((directory / "latest").string(), name + "\n");
  } catch (const std::exception& e) {
    fail_write("checkpoint " + path, e.what(), directory);
  }
  rotate_checkpoints(directory, keep_checkpoints, name, log);
  return path;
}

void checkpoint_write_best(const std::string& out_dir, torch::serialize::OutputArchive& archive) {
  const fs::path path = fs::path(out_dir) / "best_model.pt";
  try {
    fs::create_directories(out_dir);
    archive_write_verified(archive, path.string());
  } catch (const std::exception& e) {
    fail_write("best model " + path.string(), e.what(), fs::path(out_dir) / "checkpoints");
  }
}

std::string checkpoint_latest(const std::string& out_dir, RunLog& log) {
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
    CheckpointCheck check = checkpoint_verify(path);
    if (check.good && checkpoint_is_sharded(directory, name)) {
      check = checkpoint_shards_verify(directory, name);
    }
    if (check.good) {
      if (!skipped.empty() && log.writer()) {
        log.warn("--resume auto: using " + path +
                 ", the newest intact checkpoint; `latest` names it from now on");
        try {  // so that `latest` names a good file while this run trains
          util::write_file_atomically((directory / "latest").string(), name + "\n");
        } catch (const std::exception& e) {
          log.warn(e.what());
        }
      }
      return path;
    }
    log.warn("--resume auto: skipping checkpoint " + path + ": it " + check.problem);
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

namespace {

// Where the loaded tensors go: the device of the model's parameters (map
// location), whatever device saved them: a checkpoint from cuda:0 resumes on
// cuda:1, or on a machine without a GPU.
torch::Device model_device(model::M3AE& model) {
  const auto parameters = model->parameters();
  return parameters.empty() ? torch::Device(torch::kCPU) : parameters.front().device();
}

// Runs `read` on the archive checked and parsed onto `device`
// (checkpoint_archive.h); LibTorch's errors name the file.
template <typename Read>
void read_archive(const std::string& path, const std::string& bytes, const torch::Device& device,
                  Read read) {
  torch::serialize::InputArchive archive;
  torch_archive_load(path, bytes, device, archive);
  try {
    read(archive);
  } catch (const c10::Error& e) {
    throw std::runtime_error("checkpoint " + path +
                             " is unreadable: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint " + path + " is unreadable: " + e.what());
  }
}

// Copies the archive's tensors into the module's own, as Module::load reads
// them (own parameters, own buffers, then each child's archive), but into
// the same tensor objects on their device in their dtype: the gradient
// buckets, their autograd hooks and the optimiser hold those objects, and
// LibTorch's load would replace a tensor's data when the saved device or
// dtype differs. A shape that differs is an error naming the tensor.
// The model's weights; the number of attentions read in the layout before
// packed q/k/v (checkpoint_weights.h).
int64_t load_model_in_place(torch::serialize::InputArchive& archive, model::M3AE& model) {
  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  int64_t legacy_attentions = 0;
  load_module_weights(model_archive, *model, "", legacy_attentions);
  return legacy_attentions;
}

}  // namespace

void checkpoint_load(const std::string& path, model::M3AE& model, VqaOptimizer& optimizer,
                     TrainState& state, RunLog& log) {
  const std::string bytes = read_verified(path, log);
  int64_t optimizer_parts = 0;
  read_archive(path, bytes, model_device(model), [&](torch::serialize::InputArchive& archive) {
    if (load_model_in_place(archive, model) > 0) {
      throw std::runtime_error(
          "it was written before each attention packed its query, key and value weights into "
          "one in_weight: its weights load (--init-from " +
          path +
          " starts a new run from "
          "them), its optimiser state does not, so the run cannot resume from it");
    }
    torch::serialize::InputArchive optimizer_archive;
    archive.read("optimizer", optimizer_archive);
    optimizer.adamw().load(optimizer_archive);
    torch::Tensor parts;
    archive.try_read("optimizer_parts", parts);
    optimizer_parts = parts.defined() ? parts.item<int64_t>() : 0;
    read_state(archive, state);
  });
  // A sharded checkpoint's moments are in its parts.
  if (optimizer_parts > 0) {
    checkpoint_parts_load(path, optimizer_parts, model, optimizer, model_device(model), log);
  }
}

void checkpoint_load_model(const std::string& path, model::M3AE& model, RunLog& log) {
  const std::string bytes = read_verified(path, log);
  int64_t legacy_attentions = 0;
  read_archive(path, bytes, model_device(model), [&](torch::serialize::InputArchive& archive) {
    legacy_attentions = load_model_in_place(archive, model);
  });
  if (legacy_attentions > 0) {
    log.info(path + ": " + std::to_string(legacy_attentions) +
             " attentions read from separate query, key and value weights (the layout "
             "before packed attention)");
  }
}

}  // namespace vqa::train
