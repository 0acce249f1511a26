#include "train/setup.h"

#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "model/layers.h"          // set_packed_projections
#include "model/m3ae_import.h"     // m3ae_import
#include "model/safetensors.h"     // SafetensorsFile
#include "runtime/check.h"         // fatal_user_error
#include "runtime/communicator.h"  // cuda_device_for, cuda_device_choice, nccl_backend_built
#include "runtime/cuda_graph.h"    // cuda_graph_unavailable_reason
#include "runtime/distributed.h"   // distributed_gather_strings, distributed_broadcast_bytes
#include "runtime/system_info.h"   // blas_description
#include "train/autocast.h"        // autocast_runs
#include "train/checkpoint.h"      // checkpoint_latest, checkpoint_load, checkpoint_load_model
#include "util/durable_file.h"     // write_file_atomically
#include "util/options.h"          // option_text

namespace vqa::train {

namespace {

// The path of `program` on PATH, "" when it is not there.
std::string find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  for (size_t begin = 0; begin <= dirs.size();) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > begin ? dirs.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  return "";
}

// NVIDIA GPUs on this host, whether or not this process can drive them: the
// "GPU n: ..." lines of `nvidia-smi -L`, else the /dev/nvidiaN device files
// (a container may have either without the other). "" when there are none,
// else e.g. "1 NVIDIA GPU (nvidia-smi -L)". Runs nvidia-smi only when it is
// on PATH, so a host without the driver forks nothing.
std::string host_nvidia_gpus() {
  const std::string nvidia_smi = find_on_path("nvidia-smi");
  int listed = 0;
  if (!nvidia_smi.empty()) {
    // A driver that hangs must not hang the job: timeout(1) ends it.
    const std::string command = "timeout 10 '" + nvidia_smi + "' -L 2>/dev/null";
    if (FILE* pipe = ::popen(command.c_str(), "r")) {
      char line[512];
      while (std::fgets(line, sizeof(line), pipe) != nullptr) {
        if (std::strncmp(line, "GPU ", 4) == 0) ++listed;
      }
      ::pclose(pipe);
    }
  }
  if (listed > 0) {
    return std::to_string(listed) + " NVIDIA GPU" + (listed == 1 ? "" : "s") + " (nvidia-smi -L)";
  }
  int files = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.compare(0, 6, "nvidia") == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++files;
    }
  }
  if (files == 0) return "";
  return std::to_string(files) + " NVIDIA GPU" + (files == 1 ? "" : "s") + " (/dev/nvidia0" +
         (files > 1 ? ".." + std::to_string(files - 1) : std::string()) + ")";
}

// True when CUDA_VISIBLE_DEVICES hides every GPU ("", "-1", "none"): a run
// told so means to stay on the CPU.
bool gpus_hidden_on_purpose() {
  const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
  if (mask == nullptr) return false;
  std::string list;
  for (const char* c = mask; *c != '\0'; ++c) {
    if (!std::isspace(static_cast<unsigned char>(*c))) list += *c;
  }
  return list.empty() || list == "-1" || list == "none";
}

// Why this process has no GPU to train on, and what gives it one.
std::string why_no_usable_gpu() {
  if (libtorch_cuda_version().empty()) {
    return "this LibTorch " TORCH_VERSION
           " is a CPU-only build. Build vqa-hpc against a CUDA LibTorch: "
           "cmake -DVQA_TORCH_FROM_PYTHON=ON -DVQA_WITH_NCCL=ON (the LibTorch inside a CUDA "
           "PyTorch from pip; VQA_PYTHON names its python) or cmake "
           "-DCMAKE_PREFIX_PATH=/path/to/libtorch -DVQA_WITH_NCCL=ON (the CUDA LibTorch archive "
           "from pytorch.org), in a fresh build folder";
  }
  if (!torch::cuda::is_available()) {
    return "LibTorch's CUDA sees no usable GPU (" + libraries_line() +
           "; torch::cuda::is_available() is false: a driver older than that CUDA, or "
           "CUDA_VISIBLE_DEVICES=" +
           (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)") +
           " hides them)";
  }
  if (!runtime::nccl_backend_built()) {
    return "this vqa-hpc build has no GPU communicator (it was configured without the CUDA "
           "toolkit and NCCL: reconfigure with -DVQA_WITH_NCCL=ON, which names what is missing)";
  }
  return "the CUDA runtime of the GPU communicator sees no device";
}

}  // namespace

torch::Device setup_device(const TrainConfig& config, const runtime::RankInfo& rank) {
  const bool gpu = torch::cuda::is_available() && runtime::cuda_device_count() > 0;
  // A GPU host must not train on its CPU by accident (the base preset at
  // 384 px takes hours a step there): --device auto lands on the CPU only
  // where the host has no NVIDIA GPU or CUDA_VISIBLE_DEVICES hides them all.
  if (!gpu && config.device != DeviceMode::kCpu) {
    const std::string gpus = host_nvidia_gpus();
    if (config.device == DeviceMode::kCuda || (!gpus.empty() && !gpus_hidden_on_purpose())) {
      runtime::fatal_user_error(
          std::string(config.device == DeviceMode::kCuda
                          ? "--device cuda, but no GPU to train on: "
                          : "--device auto would train on the CPU: ") +
          (gpus.empty() ? "this host shows no NVIDIA GPU (no nvidia-smi -L, no /dev/nvidia0)"
                        : "this host has " + gpus) +
          ", but " + why_no_usable_gpu() + ". To train on the CPU on purpose, pass --device cpu");
    }
  }
  int threads = config.threads;
  if (threads <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, cores / std::max(1, rank.local_size));
  }
  torch::set_num_threads(threads);
  // --tf32: float32 matrix products on TF32 tensor cores too (cuDNN's
  // convolutions use them by default; cuBLAS's matmuls do not).
  at::globalContext().setAllowTF32CuBLAS(config.tf32);
  if (config.device == DeviceMode::kCuda || (config.device == DeviceMode::kAuto && gpu)) {
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
  if (config.precision != Precision::kFp16) return nullptr;
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

bool packed_attention_wanted(PackedAttention mode, const torch::Device& device) {
  return mode == PackedAttention::kOn || (mode == PackedAttention::kAuto && device.is_cuda());
}

void setup_packed_attention(const TrainConfig& config, const torch::Device& device,
                            model::M3AE& model, RunLog& log) {
  const bool packed = packed_attention_wanted(config.packed_attention, device);
  model::set_packed_projections(*model, packed);
  if (packed) {
    log.info(std::string("attention: q, k and v in one GEMM (--packed-attention ") +
             util::mode_name(config.packed_attention, kPackedAttentionNames) + ")");
  }
}

void setup_precision(const TrainConfig& config, const torch::Device& device, model::M3AE& model,
                     RunLog& log) {
  const at::ScalarType dtype = config.autocast_dtype();
  if (device.is_cpu() && dtype == at::kBFloat16) {
    if (autocast_runs(device, dtype)) {
      log.info("--precision bf16 on the CPU: bfloat16 autocast of the forward (LibTorch " +
               std::string(TORCH_VERSION) + ")");
    } else {
      log.warn("--precision bf16 on the CPU: computing in float32. LibTorch " +
               std::string(TORCH_VERSION) +
               " is not used for bf16 autocast on the CPU (1.13's CPU LayerNorm refuses "
               "bfloat16 input with float32 weights); LibTorch 2.4 or later autocasts it");
    }
  }
  if (!config.weight_copies || !autocast_runs(device, dtype)) return;
  model->use_weight_copies(dtype);
  const auto* copies = model->weight_copies();
  log.info("weight copies: " + std::to_string(copies->size()) + " weight and bias tensors in " +
           (dtype == at::kBFloat16 ? "bf16" : "fp16") + " (" +
           std::to_string(copies->bytes() >> 20) +
           " MiB), refreshed once per forward; autocast casts none of them (--weight-copies)");
}

model::ModelConfig setup_model_config(const TrainConfig& config, const data::DatasetInfo& dataset) {
  model::ModelConfig model;
  try {
    model = model::model_config_preset(config.preset);
  } catch (const std::exception& e) {
    runtime::fatal_user_error(std::string("--preset: ") + e.what());
  }
  require_dataset_fits_recipe(config, dataset, model.image_size);
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
  model.bf16_hidden_states = config.bf16_hidden_states;
  if (model.hidden % model.heads != 0) {
    runtime::fatal_user_error("--hidden " + std::to_string(model.hidden) +
                              " is not divisible by --heads " + std::to_string(model.heads));
  }
  if (dataset.has_features && config.optimizer_recipe == OptimizerRecipe::kM3ae) {
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

std::vector<NamedTensor> trainable_parameters(model::M3AE& model) {
  std::vector<NamedTensor> parameters;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad()) {
      parameters.push_back({item.key(), item.value(), model->weight_copy(item.key())});
    }
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
  settings.recipe = config.optimizer_recipe;
  settings.aten_fused_on_cpu = config.faults.aten_fused_adamw;
  return settings;
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
  // The configuration as the run uses it, which start-up may have changed
  // from `config_ini` (--cuda-graph pads questions where it captures): a
  // run read back from config.ini must be this one. The given values that
  // changed are noted as comments.
  std::string text = config_to_ini(config);
  std::istringstream given(config_ini);
  std::string changes;
  for (std::string line; std::getline(given, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t equals = line.find(" = ");
    if (equals == std::string::npos) continue;
    if (text.find("\n" + line + "\n") == std::string::npos) {
      changes += "# changed at start-up from the value given: " + line + "\n";
    }
  }
  if (!changes.empty()) {
    // After the header comments, before the first "key = value" line.
    size_t body = 0;
    while (body < text.size() && text[body] == '#') {
      const size_t end = text.find('\n', body);
      body = end == std::string::npos ? text.size() : end + 1;
    }
    text.insert(body, changes);
  }
  std::filesystem::create_directories(config.out);
  util::write_file_atomically((std::filesystem::path(config.out) / "config.ini").string(), text);
  std::printf("%s", text.c_str());
}

void report_run_start(const TrainingParts& parts, const data::ShardedLoader& train_loader,
                      const data::ShardedLoader& test_loader,
                      const model::ModelConfig& model_config, const AllreduceProbe& probe,
                      const std::string& resumed_from, const TrainState& state) {
  const TrainConfig& config = parts.config;
  RunLog& log = parts.log;
  const auto& dataset = train_loader.info();
  const int world_size = parts.comm.world_size();
  // Where the ranks run, as runs of consecutive ranks per host (collective):
  // "node1 0-3; node2 4-7".
  const auto hosts = parts.comm.gather_strings(parts.comm.host());
  std::string placement;
  for (size_t first = 0, last = 0; first < hosts.size(); first = last + 1) {
    last = first;
    while (last + 1 < hosts.size() && hosts[last + 1] == hosts[first]) ++last;
    placement += (placement.empty() ? "" : "; ") + hosts[first] + " " + std::to_string(first) +
                 (last > first ? "-" + std::to_string(last) : std::string());
  }
  log.info("vqa_train: " + std::to_string(world_size) + " rank(s), device " + parts.device.str() +
           ", " + std::to_string(torch::get_num_threads()) + " thread(s)/rank, communicator " +
           runtime::backend_name(parts.comm.backend()) + ", BLAS: " + runtime::blas_description());
  log.info("ranks by host: " + placement);
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
  if (config.augment == data::Augment::kResizedCrop) {
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
