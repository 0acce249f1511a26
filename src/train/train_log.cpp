#include "train/train_log.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "runtime/communicator.h"  // nccl_version_loaded

namespace vqa::train {

namespace {

// "12.4" from a CUDA version code (major x 1000 + minor x 10).
std::string cuda_version_text(long code) {
  return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10);
}

// "9.1.0" from a cuDNN version code (major x 1000 + minor x 100 + patch up
// to 8; major x 10000 + minor x 100 + patch from 9 on).
std::string cudnn_version_text(long code) {
  const bool old_code = code < 10000;
  return std::to_string(old_code ? code / 1000 : code / 10000) + "." +
         std::to_string((old_code ? code % 1000 : code % 10000) / 100) + "." +
         std::to_string(code % 100);
}

}  // namespace

std::string libtorch_cuda_version() {
  // A CPU-only LibTorch has no CUDA hooks: asking them for a version throws.
  try {
    return cuda_version_text(at::detail::getCUDAHooks().versionCUDART());
  } catch (const c10::Error&) {
    return "";
  }
}

std::string libraries_line() {
  const std::string cuda = libtorch_cuda_version();
  std::string cudnn = "none";
  try {
    if (at::detail::getCUDAHooks().compiledWithCuDNN()) {
      cudnn = cudnn_version_text(at::detail::getCUDAHooks().versionCuDNN());
    }
  } catch (const c10::Error&) {
  }
  const std::string nccl = runtime::nccl_version_loaded();
  return std::string("LibTorch ") + TORCH_VERSION +
         (cuda.empty() ? " (CPU build)" : " (CUDA build)") + "; CUDA " +
         (cuda.empty() ? "none" : cuda) + "; cuDNN " + cudnn + "; NCCL " +
         (nccl.empty() ? "none" : nccl);
}

RunLog::RunLog(const std::string& out_dir, bool writer) : writer_(writer) {
  open_files(out_dir, libraries_line());
}

RunLog::RunLog(const std::string& out_dir, bool writer, const c10::Device& device)
    : writer_(writer) {
  open_files(out_dir, "device " + device.str() + "; " + libraries_line());
}

void RunLog::open_files(const std::string& out_dir, const std::string& first_line) {
  if (!writer_) return;
  out_dir_ = out_dir;
  std::filesystem::create_directories(out_dir);
  text_.open(std::filesystem::path(out_dir) / "train.log", std::ios::app);
  json_.open(std::filesystem::path(out_dir) / "metrics.jsonl", std::ios::app);
  info(first_line);
}

void RunLog::info(const std::string& line) {
  if (!writer_) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  text_ << line << "\n";
  text_.flush();
}

void RunLog::warn(const std::string& line) {
  if (!writer_) return;
  std::fflush(stdout);  // keeps the order of stdout and stderr lines in a merged log
  std::fprintf(stderr, "[vqa] warning: %s\n", line.c_str());
  std::fflush(stderr);
  text_ << "warning: " << line << "\n";
  text_.flush();
}

void RunLog::progress(const std::string& line) {
  if (!writer_) return;
  std::printf("\r%s", line.c_str());
  std::fflush(stdout);
}

void RunLog::clear_progress() {
  if (!writer_) return;
  std::printf("\r%80s\r", "");
  std::fflush(stdout);
}

void RunLog::epoch_header() {
  char line[256];
  std::snprintf(line, sizeof(line), "%5s %8s %8s %8s %9s %10s %8s %10s", "epoch", "overall", "open",
                "closed", "loss", "lr", "time(s)", "samples/s");
  info(line);
}

util::TensorBoardWriter* RunLog::tensorboard() {
  if (!writer_ || tensorboard_tried_) return tensorboard_.get();
  tensorboard_tried_ = true;
  if (!util::tensorboard_writer_built()) {
    info("TensorBoard: no event file (this build has no writer: CMake found no Protocol Buffers)");
    return nullptr;
  }
  try {
    tensorboard_ = std::make_unique<util::TensorBoardWriter>(out_dir_);
  } catch (const std::exception& e) {
    warn(std::string("TensorBoard: ") + e.what());
  }
  return tensorboard_.get();
}

void RunLog::configuration(const std::string& config_ini, int64_t global_step) {
  if (!writer_) return;
  if (auto* events = tensorboard()) {
    // Four spaces make Markdown (the text plugin's) show it as written.
    std::string text;
    size_t begin = 0;
    while (begin < config_ini.size()) {
      const size_t end = std::min(config_ini.find('\n', begin), config_ini.size());
      text += "    " + config_ini.substr(begin, end - begin) + "\n";
      begin = end + 1;
    }
    events->text("config", text, global_step);
  }
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> values;
  auto add = [&](const std::string& tag, const nlohmann::json& from, const char* key) {
    if (from.contains(key) && from[key].is_number())
      values.emplace_back(tag, from[key].get<double>());
  };
  add("train/loss", record, "train_loss");
  add("train/learning_rate", record, "lr");
  add("train/samples_per_second", record, "samples_per_second");
  add("train/loss_scale", record, "loss_scale");
  add("train/skipped_steps", record, "skipped_steps");
  add("eval/overall", record, "overall");
  add("eval/open", record, "open");
  add("eval/closed", record, "closed");
  add("eval/loss", record, "test_loss");
  if (record.contains("step_seconds")) add("step/seconds_p50", record["step_seconds"], "p50");
  if (record.contains("phases") && record["phases"].is_object()) {
    for (const auto& [phase, numbers] : record["phases"].items()) {
      add("step/" + phase + "_seconds", numbers, "mean");
    }
  }
  add("step/slowest_rank_excess", record, "slowest_rank_excess");
  add("step/bus_gbps", record, "bus_gbps");
  return values;
}

void RunLog::epoch(int64_t epoch, int64_t global_step, const EpochStats& train,
                   const EvalStats* eval, bool best, const nlohmann::json* step_report) {
  if (!writer_) return;
  const double throughput = train.seconds > 0 ? train.timed_samples / train.seconds : 0.0;
  char line[256];
  if (eval) {
    std::snprintf(line, sizeof(line), "%5lld %7.2f%% %7.2f%% %7.2f%% %9.4f %10.3e %8.1f %10.1f%s",
                  (long long)epoch, 100 * eval->accuracy.overall, 100 * eval->accuracy.open,
                  100 * eval->accuracy.closed, train.mean_loss, train.learning_rate, train.seconds,
                  throughput, best ? "  *best" : "");
  } else {
    std::snprintf(line, sizeof(line), "%5lld %8s %8s %8s %9.4f %10.3e %8.1f %10.1f",
                  (long long)epoch, "-", "-", "-", train.mean_loss, train.learning_rate,
                  train.seconds, throughput);
  }
  info(line);
  if (eval && !eval->by_question_type.empty()) {
    info("      by question type: " + question_type_line(*eval));
  }

  nlohmann::json record = {{"epoch", epoch},
                           {"global_step", global_step},
                           {"train_loss", train.mean_loss},
                           {"lr", train.learning_rate},
                           {"epoch_seconds", train.seconds},
                           {"samples", train.samples},
                           {"samples_per_second", throughput},
                           {"optimizer_steps", train.optimizer_steps},
                           {"skipped_steps", train.skipped_steps},
                           {"data_wait_seconds_rank0", train.data_wait_seconds},
                           {"comm_wait_seconds_rank0", train.comm_wait_seconds}};
  if (train.loss_scale > 0) record["loss_scale"] = train.loss_scale;
  if (eval) {
    record["overall"] = eval->accuracy.overall;
    record["open"] = eval->accuracy.open;
    record["closed"] = eval->accuracy.closed;
    record["test_loss"] = eval->mean_loss;
    record["test_questions"] = eval->accuracy.total;
    record["eval_seconds"] = eval->seconds;
    record["best"] = best;
    record["question_types"] = question_type_json(*eval);
  }
  if (step_report) {
    for (const auto& [key, value] : step_report->items()) {
      if (!record.contains(key)) record[key] = value;
    }
  }
  json_ << record.dump() << "\n";
  json_.flush();
  if (auto* events = tensorboard()) {
    try {
      events->scalars(tensorboard_scalars(record), global_step);
    } catch (const std::exception& e) {
      warn(std::string("TensorBoard: ") + e.what() + "; no more events this run");
      tensorboard_.reset();
    }
  }
}

void RunLog::evaluation(const EvalStats& eval, const std::string& model_source) {
  if (!writer_) return;
  char line[256];
  std::snprintf(line, sizeof(line),
                "evaluation of %s: overall %.2f%% (open %.2f%%, closed %.2f%%) on %lld test "
                "questions, loss %.4f, %.1f s",
                model_source.c_str(), 100 * eval.accuracy.overall, 100 * eval.accuracy.open,
                100 * eval.accuracy.closed, static_cast<long long>(eval.accuracy.total),
                eval.mean_loss, eval.seconds);
  info(line);
  if (!eval.by_question_type.empty()) info("  by question type: " + question_type_line(eval));
  const nlohmann::json record = {{"eval_only", true},
                                 {"model", model_source},
                                 {"overall", eval.accuracy.overall},
                                 {"open", eval.accuracy.open},
                                 {"closed", eval.accuracy.closed},
                                 {"test_loss", eval.mean_loss},
                                 {"test_questions", eval.accuracy.total},
                                 {"eval_seconds", eval.seconds},
                                 {"question_types", question_type_json(eval)}};
  json_ << record.dump() << "\n";
  json_.flush();
}

std::string question_type_line(const EvalStats& stats) {
  std::string line;
  for (const auto& type : stats.by_question_type) {
    char part[160];
    std::snprintf(part, sizeof(part), "%s%s %.1f%% (%lld)", line.empty() ? "" : ", ",
                  type.name.c_str(), type.total ? 100.0 * type.correct / type.total : 0.0,
                  static_cast<long long>(type.total));
    line += part;
  }
  return line;
}

nlohmann::json question_type_json(const EvalStats& stats) {
  nlohmann::json types = nlohmann::json::object();
  for (const auto& type : stats.by_question_type) {
    types[type.name] = {{"accuracy", type.total ? double(type.correct) / type.total : 0.0},
                        {"correct", type.correct},
                        {"total", type.total}};
  }
  return types;
}

}  // namespace vqa::train
