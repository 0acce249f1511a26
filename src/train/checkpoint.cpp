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
}

void read_state(torch::serialize::InputArchive& archive, TrainState& state) {
  torch::Tensor value;
  archive.read("state.next_epoch", value);
  state.next_epoch = value.item<int64_t>();
  archive.read("state.global_step", value);
  state.global_step = value.item<int64_t>();
  archive.read("state.best_overall", value);
  state.best_overall = value.item<double>();
  archive.read("state.best_epoch", value);
  state.best_epoch = value.item<int64_t>();
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
  char name[64];
  std::snprintf(name, sizeof(name), "epoch-%04lld.pt",
                static_cast<long long>(state.next_epoch - 1));
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
