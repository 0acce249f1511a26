#include "train/checkpoint_shards.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "runtime/check.h"             // fatal_user_error
#include "train/checkpoint_archive.h"  // torch_archive_load
#include "train/checkpoint_sidecar.h"  // archive_write_verified, read_verified, sidecar_read
#include "util/durable_file.h"         // write_file_atomically

namespace fs = std::filesystem;

namespace vqa::train {

namespace {

std::string crc_text(uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof(text), "%08" PRIx32, crc);
  return text;
}

nlohmann::json entry_json(const CheckpointPartEntry& entry) {
  return {{"file", entry.file}, {"size", entry.size}, {"crc32", crc_text(entry.crc)}};
}

CheckpointPartEntry entry_from_json(const nlohmann::json& json) {
  CheckpointPartEntry entry;
  entry.file = json.at("file").get<std::string>();
  entry.size = json.at("size").get<uint64_t>();
  entry.crc = static_cast<uint32_t>(std::stoul(json.at("crc32").get<std::string>(), nullptr, 16));
  return entry;
}

// The manifest's main file and parts; throws std::runtime_error saying what is wrong.
struct Manifest {
  CheckpointPartEntry main;
  std::vector<CheckpointPartEntry> parts;
};

Manifest manifest_read(const fs::path& directory, const std::string& name) {
  const fs::path path = directory / checkpoint_manifest_name(name);
  std::ifstream file(path);
  if (!file) {
    throw std::runtime_error(
        "has no manifest " + path.filename().string() +
        " (a sharded checkpoint is complete only once its manifest is written)");
  }
  try {
    const nlohmann::json json = nlohmann::json::parse(file);
    Manifest manifest;
    manifest.main = entry_from_json(json.at("checkpoint"));
    for (const auto& part : json.at("parts")) manifest.parts.push_back(entry_from_json(part));
    return manifest;
  } catch (const std::exception& e) {
    throw std::runtime_error("has an unreadable manifest " + path.filename().string() + ": " +
                             e.what());
  }
}

// "" when `file`'s sidecar says what the manifest does.
std::string manifest_compare(const fs::path& directory, const CheckpointPartEntry& entry) {
  Sidecar sidecar;
  std::string problem;
  if (!sidecar_read((directory / entry.file).string(), sidecar, problem)) {
    return "has part " + entry.file + " which " + problem;
  }
  if (sidecar.size != entry.size || sidecar.crc != entry.crc) {
    return "has part " + entry.file + " whose checksum file (crc32 " + crc_text(sidecar.crc) +
           ", " + std::to_string(sidecar.size) + " bytes) differs from the manifest's (crc32 " +
           crc_text(entry.crc) + ", " + std::to_string(entry.size) + " bytes)";
  }
  return "";
}

}  // namespace

std::string checkpoint_part_name(const std::string& name, int rank, int parts) {
  char suffix[48];
  std::snprintf(suffix, sizeof(suffix), ".part-%04d-of-%04d", rank, parts);
  return name + suffix;
}

std::string checkpoint_manifest_name(const std::string& name) { return name + ".manifest"; }

void checkpoint_part_fill(torch::serialize::OutputArchive& archive, model::M3AE& model,
                          const VqaOptimizer::OwnedMoments& owned, const torch::Tensor& exp_avg,
                          const torch::Tensor& exp_avg_sq, int rank, int parts) {
  std::map<const void*, std::string> names;
  for (const auto& parameter : model->named_parameters()) {
    names[parameter.value().unsafeGetTensorImpl()] = parameter.key();
  }
  std::string run_names;
  // Per run: parameter offset, length, offset in the moments, group, index in the group.
  auto runs = torch::empty({static_cast<int64_t>(owned.runs.size()), 5}, torch::kInt64);
  for (size_t i = 0; i < owned.runs.size(); ++i) {
    const auto& run = owned.runs[i];
    const auto found = names.find(run.parameter.unsafeGetTensorImpl());
    TORCH_CHECK(found != names.end(), "an optimiser run's parameter is not the model's");
    run_names += (i == 0 ? "" : "\n") + found->second;
    runs[static_cast<int64_t>(i)][0] = run.parameter_offset;
    runs[static_cast<int64_t>(i)][1] = run.length;
    runs[static_cast<int64_t>(i)][2] = run.flat_offset;
    runs[static_cast<int64_t>(i)][3] = run.group;
    runs[static_cast<int64_t>(i)][4] = run.index_in_group;
  }
  archive.write("part.rank", torch::tensor(static_cast<int64_t>(rank)));
  archive.write("part.parts", torch::tensor(static_cast<int64_t>(parts)));
  archive.write("part.step", torch::tensor(owned.step));
  archive.write("part.names", c10::IValue(run_names));
  archive.write("part.runs", runs);
  archive.write("part.exp_avg", exp_avg);
  archive.write("part.exp_avg_sq", exp_avg_sq);
}

void checkpoint_part_remove_stale(const std::string& out_dir, const std::string& name, int rank,
                                  int parts) {
  const fs::path path = fs::path(out_dir) / "checkpoints" / checkpoint_part_name(name, rank, parts);
  std::error_code error;
  // The part first: a sidecar alone is no part.
  fs::remove(path, error);
  fs::remove(checkpoint_sidecar_path(path.string()), error);
}

CheckpointPartEntry checkpoint_part_write(const std::string& out_dir, const std::string& part,
                                          torch::serialize::OutputArchive& archive,
                                          const CheckpointProgress& progress) {
  const fs::path directory = fs::path(out_dir) / "checkpoints";
  const fs::path path = directory / part;
  try {
    fs::create_directories(directory);
    const Sidecar sidecar = archive_write_verified(archive, path.string(), progress);
    return {part, sidecar.size, sidecar.crc};
  } catch (const std::exception& e) {
    runtime::fatal_user_error("checkpoint part " + path.string() + " not saved: " + e.what() +
                                  "; its temporary files were removed; the checkpoint stays "
                                  "incomplete (no manifest) and --resume auto skips it",
                              kExitCheckpointWriteFailed);
  }
}

std::vector<CheckpointPartEntry> checkpoint_parts_await(const std::string& out_dir,
                                                        const std::string& name, int parts) {
  const fs::path directory = fs::path(out_dir) / "checkpoints";
  const auto start = std::chrono::steady_clock::now();
  std::vector<CheckpointPartEntry> entries(static_cast<size_t>(parts));
  for (int rank = 0; rank < parts; ++rank) {
    const std::string part = checkpoint_part_name(name, rank, parts);
    const std::string path = (directory / part).string();
    // The sidecar is written before the rename: once the part exists, both do.
    for (std::error_code error; !fs::exists(path, error);) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > kPartsWaitSeconds) {
        runtime::fatal_user_error("checkpoint " + name + ": rank " + std::to_string(rank) +
                                      " did not write its part " + part + " within " +
                                      std::to_string(static_cast<int>(kPartsWaitSeconds)) +
                                      " s; the checkpoint stays incomplete (no manifest)",
                                  kExitCheckpointWriteFailed);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Sidecar sidecar;
    std::string problem;
    if (!sidecar_read(path, sidecar, problem)) {
      runtime::fatal_user_error("checkpoint part " + path + " " + problem,
                                kExitCheckpointWriteFailed);
    }
    entries[static_cast<size_t>(rank)] = {part, sidecar.size, sidecar.crc};
  }
  return entries;
}

void checkpoint_manifest_write(const fs::path& directory, const std::string& name,
                               const CheckpointPartEntry& main,
                               const std::vector<CheckpointPartEntry>& parts) {
  nlohmann::json json;
  json["checkpoint"] = entry_json(main);
  json["parts"] = nlohmann::json::array();
  for (const auto& part : parts) json["parts"].push_back(entry_json(part));
  util::write_file_atomically((directory / checkpoint_manifest_name(name)).string(),
                              json.dump(2) + "\n");
}

bool checkpoint_is_sharded(const fs::path& directory, const std::string& name) {
  const std::string parts_prefix = name + ".part-";
  const std::string manifest = checkpoint_manifest_name(name);
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string file = it->path().filename().string();
    if (file == manifest || file.compare(0, parts_prefix.size(), parts_prefix) == 0) return true;
  }
  return false;
}

CheckpointCheck checkpoint_shards_verify(const fs::path& directory, const std::string& name) {
  Manifest manifest;
  try {
    manifest = manifest_read(directory, name);
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
  if (manifest.main.file != name) {
    return {false, "has a manifest for " + manifest.main.file};
  }
  std::string problem = manifest_compare(directory, manifest.main);
  if (!problem.empty()) return {false, problem};
  for (const auto& part : manifest.parts) {
    const CheckpointCheck check = checkpoint_verify((directory / part.file).string());
    if (!check.good) return {false, "has part " + part.file + " which " + check.problem};
    problem = manifest_compare(directory, part);
    if (!problem.empty()) return {false, problem};
  }
  return {true, ""};
}

void checkpoint_shards_remove(const fs::path& directory, const std::string& name,
                              std::error_code& error) {
  fs::remove(directory / checkpoint_manifest_name(name), error);
  if (error) return;
  const std::string parts_prefix = name + ".part-";
  std::vector<fs::path> parts;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string file = it->path().filename().string();
    if (file.compare(0, parts_prefix.size(), parts_prefix) == 0) parts.push_back(it->path());
  }
  // Parts before sidecars (checkpoint_part_remove_stale's order).
  std::sort(parts.begin(), parts.end(), [](const fs::path& a, const fs::path& b) {
    return (a.extension() == ".crc32") < (b.extension() == ".crc32");
  });
  for (const auto& part : parts) {
    if (!error) fs::remove(part, error);
  }
}

void checkpoint_parts_load(const std::string& path, int64_t parts, model::M3AE& model,
                           VqaOptimizer& optimizer, const torch::Device& device, RunLog& log) {
  const fs::path checkpoint(path);
  const fs::path directory = checkpoint.parent_path();
  const std::string name = checkpoint.filename().string();
  Manifest manifest;
  try {
    manifest = manifest_read(directory, name);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint " + path + " " + e.what());
  }
  if (static_cast<int64_t>(manifest.parts.size()) != parts) {
    throw std::runtime_error("checkpoint " + path + " says its optimiser state is in " +
                             std::to_string(parts) + " parts, its manifest lists " +
                             std::to_string(manifest.parts.size()));
  }
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& parameter : model->named_parameters()) {
    parameters[parameter.key()] = parameter.value();
  }
  for (int64_t rank = 0; rank < parts; ++rank) {
    const CheckpointPartEntry& entry = manifest.parts[static_cast<size_t>(rank)];
    const std::string part_path = (directory / entry.file).string();
    const std::string problem = manifest_compare(directory, entry);
    if (!problem.empty()) throw std::runtime_error("checkpoint " + path + " " + problem);
    const std::string bytes = read_verified(part_path, log);
    const auto read = [&](torch::serialize::InputArchive& archive, const char* key) {
      torch::Tensor value;
      archive.read(key, value);
      return value;
    };
    torch::serialize::InputArchive archive;
    torch_archive_load(part_path, bytes, device, archive);
    try {
      if (read(archive, "part.rank").item<int64_t>() != rank ||
          read(archive, "part.parts").item<int64_t>() != parts) {
        throw std::runtime_error("its header names another rank or rank count");
      }
      const int64_t step = read(archive, "part.step").item<int64_t>();
      c10::IValue names_value;
      archive.read("part.names", names_value);
      const auto runs = read(archive, "part.runs").to(torch::kCPU).contiguous();
      // Each row, as checkpoint_part_fill writes it: the parameter's element
      // offset, the run's length, its offset into exp_avg / exp_avg_sq, the
      // parameter's group and index in it.
      if (runs.dim() != 2 || runs.size(1) != 5 || runs.scalar_type() != torch::kInt64) {
        throw std::runtime_error("its part.runs is " + runs.toString() + " of shape " +
                                 c10::str(runs.sizes()) + ", not int64 rows of 5");
      }
      const auto exp_avg = read(archive, "part.exp_avg");
      const auto exp_avg_sq = read(archive, "part.exp_avg_sq");
      std::istringstream names(names_value.toStringRef());
      const int64_t* run = runs.data_ptr<int64_t>();
      for (int64_t i = 0; i < runs.size(0); ++i, run += runs.size(1)) {
        std::string parameter_name;
        std::getline(names, parameter_name);
        const auto parameter = parameters.find(parameter_name);
        if (parameter == parameters.end()) {
          throw std::runtime_error("it holds moments of " + parameter_name +
                                   ", which this model does not have");
        }
        optimizer.load_moments(parameter->second, step, run[0], exp_avg.narrow(0, run[2], run[1]),
                               exp_avg_sq.narrow(0, run[2], run[1]));
      }
    } catch (const c10::Error& e) {
      throw std::runtime_error("checkpoint part " + part_path +
                               " is unreadable: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw std::runtime_error("checkpoint part " + part_path + " is unreadable: " + e.what());
    }
  }
}

}  // namespace vqa::train
