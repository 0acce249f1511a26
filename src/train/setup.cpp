#include "train/setup.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "model/m3ae_import.h"     // m3ae_import
#include "model/safetensors.h"     // SafetensorsFile
#include "runtime/check.h"         // fatal_user_error
#include "runtime/communicator.h"  // cuda_device_for, cuda_device_choice
#include "runtime/distributed.h"   // distributed_gather_strings, distributed_broadcast_bytes
#include "runtime/system_info.h"   // blas_description
#include "train/checkpoint.h"      // checkpoint_latest, checkpoint_load, checkpoint_load_model
#include "util/durable_file.h"     // write_file_atomically
#include "util/options.h"          // option_text

namespace vqa::train {

torch::Device setup_device(const TrainConfig& config, const runtime::RankInfo& rank) {
  const bool gpu = torch::cuda::is_available() && runtime::cuda_device_count() > 0;
  if (config.device == "cuda" && !gpu) {
    runtime::fatal_user_error(
        "--device cuda, but this LibTorch build or host has no usable CUDA "
        "device (torch::cuda::is_available() is false)");
  }
  int threads = config.threads;
  if (threads <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, cores / std::max(1, rank.local_size));
  }
  torch::set_num_threads(threads);
  if (config.device == "cuda" || (config.device == "auto" && gpu)) {
    const int index = runtime::cuda_device_for(rank);
    const auto choice =
        runtime::cuda_device_choice(runtime::cuda_device_count(), rank.local_rank, rank.local_size);
    if (!choice.note.empty() && rank.local_rank == 0) {
      std::fprintf(stderr, "[vqa] host %s: %s\n", rank.host.c_str(), choice.note.c_str());
    }
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return torch::Device(torch::kCPU);
}

std::unique_ptr<LossScaler> setup_loss_scaler(const TrainConfig& config,
                                              const torch::Device& device, const TrainState& state,
                                              RunLog& log) {
  if (config.precision != "fp16") return nullptr;
  LossScalerOptions options;
  options.growth_interval = config.loss_scale_interval;
  auto scaler = std::make_unique<LossScaler>(device, options);
  if (state.loss_scale > 0) {
    scaler->load(state.loss_scale, state.loss_scale_growth);
    char line[160];
    std::snprintf(line, sizeof(line),
                  "fp16 loss scale %.6g from the checkpoint (%lld finite steps towards growth)",
                  state.loss_scale, static_cast<long long>(state.loss_scale_growth));
    log.info(line);
  }
  if (!device.is_cuda()) {
    log.info(
        "--precision fp16 on the CPU: the loss scaler runs around float32 compute (LibTorch "
        "has no float16 autocast on the CPU)");
  }
  return scaler;
}

namespace {

// Lines of `text`, also split at '|' (identity strings join their parts with it).
std::vector<std::string> text_parts(const std::string& text) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == '\n' || c == '|') {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  if (parts.back().empty()) parts.pop_back();
  return parts;
}

// "lr = 0.002 (rank 0: lr = 0.001); ..." for the parts of `other` that differ
// from `reference`, at most kMaxShown of them.
std::string describe_difference(const std::string& reference, const std::string& other) {
  constexpr size_t kMaxShown = 6;
  const auto want = text_parts(reference);
  const auto got = text_parts(other);
  std::string text;
  size_t shown = 0, differing = 0;
  for (size_t i = 0; i < std::max(want.size(), got.size()); ++i) {
    const std::string a = i < want.size() ? want[i] : "(nothing)";
    const std::string b = i < got.size() ? got[i] : "(nothing)";
    if (a == b) continue;
    if (++differing > kMaxShown) continue;
    text += (shown++ ? "; " : "") + std::string("'") + b + "' where rank 0 has '" + a + "'";
  }
  if (differing > kMaxShown) text += "; and " + std::to_string(differing - kMaxShown) + " more";
  return text.empty() ? "the same text with another hash" : text;
}

// A file's identity without HDF5: "PATH: N bytes, checksum X of its first
// and last 64 KiB", "PATH: missing or unreadable" or "PATH: not a regular
// file" (the dataset reader then says what is wrong with it).
std::string file_identity(const std::string& path) {
  constexpr std::streamoff kEdgeBytes = 64 * 1024;
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status)) return path + ": missing or unreadable";
  // A directory opens as a stream too; its size from seeking is the
  // filesystem's choice (LLONG_MAX on ext4, -1 on tmpfs), never a length.
  if (!std::filesystem::is_regular_file(status)) return path + ": not a regular file";
  std::ifstream file(path, std::ios::binary);
  if (!file) return path + ": missing or unreadable";
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  if (size < 0) return path + ": unreadable";
  std::string edges(static_cast<size_t>(std::min(size, kEdgeBytes)), '\0');
  file.seekg(0);
  file.read(edges.data(), static_cast<std::streamsize>(edges.size()));
  if (size > kEdgeBytes) {
    std::string tail(static_cast<size_t>(std::min(size - kEdgeBytes, kEdgeBytes)), '\0');
    file.seekg(size - static_cast<std::streamoff>(tail.size()));
    file.read(tail.data(), static_cast<std::streamsize>(tail.size()));
    edges += tail;
  }
  if (!file) return path + ": unreadable";
  char checksum[32];
  std::snprintf(checksum, sizeof(checksum), "%016llx",
                static_cast<unsigned long long>(stable_hash(edges)));
  return path + ": " + std::to_string(size) + " bytes, checksum " + checksum +
         " of its first and last 64 KiB";
}

// Stops the job before training when `text` differs between the ranks;
// rank 0 prints `headline` and the differences.
void require_same_text(const std::string& headline, const std::string& text) {
  const auto hashes = runtime::distributed_gather_strings(std::to_string(stable_hash(text)));
  if (std::all_of(hashes.begin(), hashes.end(),
                  [&](const std::string& hash) { return hash == hashes[0]; })) {
    return;
  }
  // Only on a mismatch: every rank's text and host, to show the difference.
  const auto texts = runtime::distributed_gather_strings(text);
  const auto hosts = runtime::distributed_gather_strings(runtime::distributed_rank_info().host);
  constexpr int kMaxRanksShown = 4;
  std::string report;
  int differing = 0;
  for (size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] == hashes[0]) continue;
    if (++differing > kMaxRanksShown) continue;
    report += "\n  rank " + std::to_string(r) + " (" + hosts[r] +
              "): " + describe_difference(texts[0], texts[r]);
  }
  if (differing > kMaxRanksShown) {
    report += "\n  and " + std::to_string(differing - kMaxRanksShown) + " more rank(s)";
  }
  runtime::fatal_user_error_from_rank0(headline + " (rank 0 runs on " + hosts[0] + "):" + report);
}

}  // namespace

void require_same_on_all_ranks(const std::string& what, const std::string& text) {
  require_same_text(
      "the " + what + " differs between the ranks; every rank must run with the same " + what,
      text);
}

void require_same_files_on_all_ranks(const std::vector<std::string>& paths) {
  std::string identity;
  std::vector<std::string> seen;
  for (const auto& path : paths) {
    if (std::find(seen.begin(), seen.end(), path) != seen.end()) continue;
    seen.push_back(path);
    identity += (identity.empty() ? "" : "\n") + file_identity(path);
  }
  require_same_text("the dataset files differ between the ranks; copy the same file to every node",
                    identity);
}

model::ModelConfig setup_model_config(const TrainConfig& config, const data::DatasetInfo& dataset) {
  model::ModelConfig model;
  try {
    model = model::model_config_preset(config.preset);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(std::string("--preset: ") + e.what());
  }
  auto override_if_set = [](int64_t value, int64_t& field) {
    if (value > 0) field = value;
  };
  override_if_set(config.hidden, model.hidden);
  override_if_set(config.heads, model.heads);
  override_if_set(config.ffn, model.ffn);
  override_if_set(config.vision_layers, model.vision_layers);
  override_if_set(config.text_layers, model.text_layers);
  override_if_set(config.fusion_layers, model.fusion_layers);
  override_if_set(config.patch_size, model.patch_size);
  if (config.dropout >= 0) model.dropout = config.dropout;
  if (model.hidden % model.heads != 0) {
    runtime::fatal_user_error("--hidden " + std::to_string(model.hidden) +
                              " is not divisible by --heads " + std::to_string(model.heads));
  }
  if (dataset.has_features && config.optimizer_recipe == "m3ae") {
    runtime::fatal_user_error(
        "--optimizer-recipe m3ae follows M3AE's parameter names, which "
        "cover a model over pixels; " +
        dataset.path + " holds pre-extracted features");
  }
  if (dataset.has_features && !config.export_m3ae.empty()) {
    runtime::fatal_user_error("--export-m3ae " + config.export_m3ae +
                              ": M3AE's vision encoder reads pixels, and " + dataset.path +
                              " holds pre-extracted features, so this model has no M3AE form");
  }
  model.vocab_size = dataset.vocab_size;
  model.num_answers = dataset.num_answers;
  model.max_text_length = std::max<int64_t>(model.max_text_length, dataset.max_question_length);
  model.use_features = dataset.has_features;
  if (dataset.has_features) {
    model.feature_tokens = dataset.feature_tokens;
    model.feature_dim = dataset.feature_dim;
  } else {
    model.image_size = dataset.image_size;
    if (model.image_size % model.patch_size != 0) {
      runtime::fatal_user_error("the dataset's image size " + std::to_string(model.image_size) +
                                " (" + dataset.path + ") is not a multiple of the patch size " +
                                std::to_string(model.patch_size) + "; set --patch-size");
    }
  }
  return model;
}

bool run_already_complete(const TrainConfig& config, const runtime::RankInfo& rank) {
  std::vector<char> done(1, 0);
  if (rank.rank == 0 && config.resume == "auto") {
    std::ifstream marker(std::filesystem::path(config.out) / "DONE");
    std::string word;
    int64_t epochs = -1;
    done[0] = (marker >> word >> epochs) && word == "epochs" && epochs >= config.epochs ? 1 : 0;
  }
  runtime::distributed_broadcast_bytes(done, /*root=*/0);
  return done[0] != 0;
}

data::ShardedLoader open_loader(const std::string& path, const std::string& split,
                                const TrainConfig& config, const runtime::RankInfo& rank,
                                const torch::Device& device) {
  const bool train = split == "train";
  data::LoaderOptions options;
  options.batch_per_rank = config.batch_per_rank;
  options.seed = config.seed;
  options.shuffle = train;
  options.drop_last = train && config.drop_last;
  options.prefetch_depth = config.prefetch_depth;
  options.rank = rank.rank;
  options.world_size = rank.world_size;
  options.pin_memory = device.is_cuda();
  options.trim_text_padding = config.trim_text_padding;
  // Evaluation stays deterministic: the test split reads the stored
  // (resized, centre-cropped) images.
  options.random_resized_crop = train && config.augment == "resized-crop";
  options.crop_ranges = {config.crop_scale_min, config.crop_scale_max, config.crop_ratio_min,
                         config.crop_ratio_max};
  options.augment_threads =
      config.augment_threads > 0 ? config.augment_threads : std::max(1, at::get_num_threads());
  try {
    return data::ShardedLoader(path, split, options);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(e.what());
  }
}

int64_t steps_per_epoch_or_exit(const data::ShardedLoader& train_loader,
                                const TrainConfig& config) {
  const int64_t steps = optimizer_steps_per_epoch(train_loader, config);
  if (steps < 1) {
    runtime::fatal_user_error("the train split of " + config.train_data + " has " +
                              std::to_string(train_loader.info().num_questions) +
                              " questions, fewer than one --global-batch of " +
                              std::to_string(config.global_batch));
  }
  return steps;
}

std::vector<NamedTensor> trainable_parameters(model::M3AE& model) {
  std::vector<NamedTensor> parameters;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad()) parameters.push_back({item.key(), item.value()});
  }
  return parameters;
}

OptimizerSettings optimizer_settings_from(const TrainConfig& config, int64_t total_steps) {
  OptimizerSettings settings;
  settings.lr = config.lr;
  settings.fusion_multiplier = config.lr_fusion_multiplier;
  settings.head_multiplier = config.lr_head_multiplier;
  settings.weight_decay = config.weight_decay;
  settings.warmup_ratio = config.warmup_ratio;
  settings.total_steps = total_steps;
  settings.recipe = optimizer_recipe_from_string(config.optimizer_recipe);
  settings.aten_fused_on_cpu = config.faults.aten_fused_adamw;
  return settings;
}

GradientSyncOptions gradient_sync_options_from(const TrainConfig& config, double bucket_mb) {
  GradientSyncOptions options;
  options.bucket_mb = bucket_mb;
  options.bf16 = config.bf16_allreduce;
  options.skip_allreduce = config.no_comm;
  return options;
}

double gradient_bucket_mb(const TrainConfig& config, runtime::Communicator& comm,
                          const std::vector<NamedTensor>& parameters, const torch::Device& device,
                          RunLog& log) {
  constexpr double kMiB = 1024.0 * 1024.0;
  if (config.bucket_mb > 0) return config.bucket_mb;
  if (comm.world_size() < 2 || config.no_comm) return kAutoBucketMaxMiB;
  const double wire = config.bf16_allreduce ? 0.5 : 1.0;  // bytes sent per float32 byte
  int64_t gradient_bytes = 0;
  for (const auto& parameter : parameters) gradient_bytes += parameter.tensor.numel() * 4;
  const auto probe_bytes = static_cast<int64_t>(
      std::min(kAutoBucketMaxMiB * kMiB, static_cast<double>(gradient_bytes)) * wire);
  comm.tune_allreduce(probe_bytes);
  const double gbps = allreduce_probe_bus_gbps(comm, probe_bytes, device, /*repeats=*/3);
  // The auto size is in bytes sent; --bucket-mb counts float32 gradient bytes.
  const double mib = std::min(kAutoBucketMaxMiB,
                              auto_bucket_bytes(Fabric{"measured", gbps, 0.0, ""}) / wire / kMiB);
  char line[200];
  std::snprintf(line, sizeof(line),
                "gradient buckets: --bucket-mb 0 (auto): %.1f MiB, %.0f ms at the %.3g GB/s bus "
                "bandwidth measured at %.1f MB",
                mib, 1e3 * kAutoBucketSeconds, gbps, probe_bytes / 1e6);
  log.info(line);
  return mib;
}

AllreduceProbe allreduce_probe_for(const TrainConfig& config, runtime::Communicator& comm,
                                   const GradientSynchronizer& gradients,
                                   const torch::Device& device) {
  AllreduceProbe probe;
  const auto sizes = gradients.bucket_bytes();
  probe.bytes = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  if (!config.no_comm) probe.tuning = comm.tune_allreduce(probe.bytes);
  if (config.phase_timers && !config.no_comm) {
    probe.bus_gbps = allreduce_probe_bus_gbps(comm, probe.bytes, device);
    probe.latency_seconds = allreduce_probe_latency_seconds(comm, device);
  }
  return probe;
}

std::string init_model_if_asked(const TrainConfig& config, model::M3AE& model, RunLog& log) {
  const std::string& path = config.init_from;
  if (path.empty()) return "";
  const std::string suffix = ".safetensors";
  const bool safetensors = path.size() > suffix.size() &&
                           path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  try {
    if (safetensors) {
      const model::SafetensorsFile file(path);
      log.info("init-from " + path + ": " + model::m3ae_import(model, file).describe());
    } else {
      checkpoint_load_model(path, model, log);
      log.info("init-from " + path + ": the model of a vqa-hpc checkpoint");
    }
  } catch (const std::exception& e) {
    runtime::fatal_user_error(std::string("--init-from: ") + e.what());
  }
  return "--init-from " + path;
}

std::string resume_if_asked(const TrainConfig& config, model::M3AE& model, VqaOptimizer& optimizer,
                            TrainState& state, RunLog& log) {
  const std::string path =
      config.resume == "auto" ? checkpoint_latest(config.out, log) : config.resume;
  if (path.empty()) return path;
  try {
    checkpoint_load(path, model, optimizer, state, log);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(std::string("--resume: ") + e.what());
  }
  return path;
}

void save_resolved_config(const TrainConfig& config, const std::string& config_ini,
                          const runtime::RankInfo& rank) {
  if (rank.rank != 0) return;
  std::filesystem::create_directories(config.out);
  util::write_file_atomically((std::filesystem::path(config.out) / "config.ini").string(),
                              config_ini);
  std::printf("%s", config_ini.c_str());
}

void report_run_start(const TrainingParts& parts, const data::ShardedLoader& train_loader,
                      const data::ShardedLoader& test_loader,
                      const model::ModelConfig& model_config, const AllreduceProbe& probe,
                      const std::string& resumed_from, const TrainState& state) {
  const TrainConfig& config = parts.config;
  RunLog& log = parts.log;
  const auto& dataset = train_loader.info();
  const int world_size = parts.comm.world_size();
  log.info("vqa_train: " + std::to_string(world_size) + " rank(s), device " + parts.device.str() +
           ", " + std::to_string(torch::get_num_threads()) + " thread(s)/rank, communicator " +
           runtime::backend_name(parts.comm.backend()) + ", BLAS: " + runtime::blas_description());
  log.info("model: " + model::model_config_describe(model_config) + ", " +
           std::to_string(model::parameter_count(*parts.model)) + " parameters");
  log.info("data: " + std::to_string(dataset.num_questions) + " train / " +
           std::to_string(test_loader.info().num_questions) +
           " test questions, K=" + std::to_string(dataset.num_answers) + " answers; global batch " +
           std::to_string(config.global_batch) + " = " + std::to_string(config.batch_per_rank) +
           " per rank x " + std::to_string(world_size) + " ranks x " +
           std::to_string(config.accumulation_steps) + " accumulation step(s); " +
           std::to_string(optimizer_steps_per_epoch(train_loader, config)) +
           " optimiser steps per epoch");
  if (config.augment == "resized-crop") {
    log.info("augmentation: train images are random resized crops of the source images (area " +
             util::option_text(config.crop_scale_min) + ".." +
             util::option_text(config.crop_scale_max) + ", aspect " +
             util::option_text(config.crop_ratio_min) + ".." +
             util::option_text(config.crop_ratio_max) + ", bicubic to " +
             std::to_string(dataset.image_size) + " px), " +
             std::to_string(config.augment_threads > 0 ? config.augment_threads
                                                       : torch::get_num_threads()) +
             " crop thread(s) per rank; evaluation reads the stored centre crops");
  }
  const auto& sync = parts.gradients.stats();
  log.info("gradients: " + std::to_string(sync.buckets) + " bucket(s), " +
           std::to_string(sync.bytes_per_step) + " bytes per step" +
           (config.no_comm ? " (communication OFF)" : ""));
  // Rank 0's value; mpirun gives every rank the same environment.
  const char* yield = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  log.info(std::string("MPI waits: mpi_yield_when_idle=") + (yield ? yield : "unset") +
           " (1: a waiting collective yields the core to compute; runtime/system_info.h)");
  if (!probe.tuning.empty()) log.info(probe.tuning);
  if (probe.bus_gbps > 0) {
    char line[200];
    std::snprintf(line, sizeof(line),
                  "allreduce probe: %.1f MB (the largest bucket) at %.3g GB/s bus bandwidth; "
                  "%.0f us per message round (4 bytes)",
                  probe.bytes / 1e6, probe.bus_gbps, probe.latency_seconds * 1e6);
    log.info(line);
  }
  if (!resumed_from.empty()) {
    log.info("resumed from " + resumed_from + " at epoch " + std::to_string(state.next_epoch) +
             (state.step_in_epoch > 0
                  ? " (after " + std::to_string(state.step_in_epoch) + " of its optimiser steps)"
                  : std::string()) +
             ", global step " + std::to_string(state.global_step));
  }
}

}  // namespace vqa::train
