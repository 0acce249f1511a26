#include "train/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

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

void save_archive_atomically(torch::serialize::OutputArchive& archive, const std::string& path) {
  const std::string temporary = path + ".tmp";
  archive.save_to(temporary);
  fs::rename(temporary, path);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::trunc);
    file << text;
    file.flush();
    if (!file) throw std::runtime_error("cannot write " + temporary);
  }
  fs::rename(temporary, path);
}

std::string checkpoint_save(const std::string& out_dir, model::M3AE& model, VqaOptimizer& optimizer,
                            const TrainState& state, const std::string& config_ini) {
  const fs::path directory = fs::path(out_dir) / "checkpoints";
  fs::create_directories(directory);
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
  save_archive_atomically(archive, path);
  write_file_atomically((directory / "latest").string(), std::string(name) + "\n");
  return path;
}

void checkpoint_save_best(const std::string& out_dir, model::M3AE& model, const TrainState& state) {
  fs::create_directories(out_dir);
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive;
  model->save(model_archive);
  archive.write("model", model_archive);
  write_state(archive, state);
  save_archive_atomically(archive, (fs::path(out_dir) / "best_model.pt").string());
}

std::string checkpoint_latest(const std::string& out_dir) {
  const fs::path directory = fs::path(out_dir) / "checkpoints";
  std::ifstream latest(directory / "latest");
  std::string name;
  if (!(latest >> name)) return "";
  const fs::path path = directory / name;
  return fs::exists(path) ? path.string() : "";
}

void checkpoint_load(const std::string& path, model::M3AE& model, VqaOptimizer& optimizer,
                     TrainState& state) {
  if (!fs::exists(path)) throw std::runtime_error("checkpoint " + path + " does not exist");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
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
  }
}

}  // namespace vqa::train
