#include "train/run_log.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

namespace vqa::train {

RunLog::RunLog(const std::string& out_dir, bool writer) : writer_(writer) {
  if (!writer_) return;
  std::filesystem::create_directories(out_dir);
  text_.open(std::filesystem::path(out_dir) / "train.log", std::ios::app);
  json_.open(std::filesystem::path(out_dir) / "metrics.jsonl", std::ios::app);
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

void RunLog::epoch(int64_t epoch, const EpochStats& train, const EvalStats* eval, bool best,
                   const nlohmann::json* step_report) {
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
