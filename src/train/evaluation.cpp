#include "train/evaluation.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <utility>

#include "train/autocast.h"  // AutocastScope
#include "train/batches.h"   // next_batch_or_exit, batch_to_device
#include "train/metrics.h"   // answers_correct, count_answers, accuracy_from_counts
#include "util/clock.h"      // SteadyClock, seconds_since

namespace vqa::train {

namespace {

// The prediction records of one batch's real rows, with their question ids.
void add_prediction_records(const data::DatasetInfo& info, const data::Batch& batch,
                            const torch::Tensor& logits, const PredictionOptions& options,
                            std::vector<std::pair<int64_t, std::string>>& records) {
  const auto host_logits = logits.to(torch::kCPU, torch::kFloat32).contiguous();
  const auto targets = batch.targets.to(torch::kCPU);
  const auto correct = answers_correct(host_logits, targets);
  const auto [best_score, best_label] = targets.max(/*dim=*/1);
  const int64_t k = std::min<int64_t>(options.top_k, host_logits.size(1));
  const auto [top_scores, top_labels] = torch::sigmoid(host_logits).topk(k, /*dim=*/1);
  const auto valid = batch.valid.to(torch::kCPU);
  const auto answer_type = batch.answer_type.to(torch::kCPU);
  const auto question_type = batch.question_type.to(torch::kCPU);
  const auto label_name = [&info](int64_t label) { return info.answer_labels.at(label); };
  for (int64_t row = 0; row < batch.size(); ++row) {
    if (valid[row].item<float>() == 0) continue;  // wrap-around padding
    nlohmann::json record;
    const int64_t qid = batch.question_ids[row].item<int64_t>();
    record["qid"] = qid;
    record["answer_type"] = answer_type[row].item<int64_t>() == 1 ? "open" : "closed";
    const int64_t type = question_type[row].item<int64_t>();
    record["question_type"] = type >= 0 && type < static_cast<int64_t>(info.question_types.size())
                                  ? nlohmann::json(info.question_types[type])
                                  : nlohmann::json(nullptr);
    record["target"] = best_score[row].item<float>() > 0
                           ? nlohmann::json(label_name(best_label[row].item<int64_t>()))
                           : nlohmann::json(nullptr);
    record["correct"] = correct[row].item<bool>();
    nlohmann::json top = nlohmann::json::array();
    for (int64_t i = 0; i < k; ++i) {
      top.push_back({{"answer", label_name(top_labels[row][i].item<int64_t>())},
                     {"score", top_scores[row][i].item<float>()}});
    }
    record["top"] = std::move(top);
    if (options.logits) {
      const float* values = host_logits[row].data_ptr<float>();
      record["logits"] = std::vector<float>(values, values + host_logits.size(1));
    }
    records.emplace_back(qid, record.dump());
  }
}

// Every rank's records to rank 0, in question-id order. Collective.
std::vector<std::string> gather_records(runtime::Communicator& comm,
                                        std::vector<std::pair<int64_t, std::string>>& mine) {
  std::string text;
  for (const auto& [qid, line] : mine) text += std::to_string(qid) + " " + line + "\n";
  const auto all = comm.gather_strings(text);
  std::vector<std::pair<int64_t, std::string>> records;
  if (comm.rank() != 0) return {};
  for (const auto& part : all) {
    std::istringstream lines(part);
    std::string line;
    while (std::getline(lines, line)) {
      const size_t space = line.find(' ');
      records.emplace_back(std::stoll(line.substr(0, space)), line.substr(space + 1));
    }
  }
  std::sort(records.begin(), records.end());
  std::vector<std::string> sorted;
  for (auto& record : records) sorted.push_back(std::move(record.second));
  return sorted;
}

}  // namespace

EvalStats evaluate(model::M3AE& model, data::ShardedLoader& loader, runtime::Communicator& comm,
                   const torch::Device& device, int64_t epoch, at::ScalarType autocast_dtype,
                   const PredictionOptions& predictions) {
  const auto start = util::SteadyClock::now();
  torch::NoGradGuard no_grad;
  model->eval();
  loader.start_epoch(epoch);
  const auto& info = loader.info();
  const auto types = static_cast<int64_t>(info.question_types.size());
  const auto options = torch::TensorOptions().device(device);
  auto counts = torch::zeros({kAnswerCounts + 1}, options);
  // Row 0: questions without a type; row t + 1: type t. Columns: correct, total.
  auto type_counts = torch::zeros({types + 1, 2}, options);
  std::vector<std::pair<int64_t, std::string>> records;
  data::Batch host_batch;
  while (next_batch_or_exit(loader, host_batch)) {
    const data::Batch batch = batch_to_device(host_batch, device);
    torch::Tensor logits;
    {
      AutocastScope autocast(device, autocast_dtype);
      logits =
          model->forward(batch.images, batch.token_ids, batch.attention_mask).to(torch::kFloat32);
    }
    counts.narrow(0, 0, kAnswerCounts) +=
        count_answers(logits, batch.targets, batch.answer_type, batch.valid);
    // Per-sample loss, padding excluded.
    const auto per_sample =
        torch::binary_cross_entropy_with_logits(logits, batch.targets, {}, {}, at::Reduction::None)
            .sum(/*dim=*/1);
    counts[kAnswerCounts] += (per_sample * batch.valid).sum();
    const auto valid = batch.valid.to(torch::kFloat32);
    const auto correct = answers_correct(logits, batch.targets).to(torch::kFloat32) * valid;
    const auto row = (batch.question_type.clamp(-1, types - 1) + 1).to(torch::kLong);
    type_counts.index_add_(0, row, torch::stack({correct, valid}, /*dim=*/1));
    if (predictions.enabled) add_prediction_records(info, host_batch, logits, predictions, records);
  }
  comm.allreduce(counts, runtime::ReduceOp::kSum);
  comm.allreduce(type_counts, runtime::ReduceOp::kSum);
  EvalStats stats;
  const auto host = counts.to(torch::kCPU);
  stats.accuracy = accuracy_from_counts(host.narrow(0, 0, kAnswerCounts));
  stats.mean_loss =
      stats.accuracy.total > 0 ? host[kAnswerCounts].item<float>() / stats.accuracy.total : 0.0;
  const auto host_types = type_counts.to(torch::kCPU, torch::kFloat64);
  for (int64_t t = 0; t <= types; ++t) {
    const auto total = static_cast<int64_t>(host_types[t][1].item<double>());
    if (total == 0) continue;
    stats.by_question_type.push_back({t == 0 ? "unknown" : info.question_types[t - 1],
                                      static_cast<int64_t>(host_types[t][0].item<double>()),
                                      total});
  }
  if (predictions.enabled) stats.predictions = gather_records(comm, records);
  stats.seconds = util::seconds_since(start);
  model->train();
  return stats;
}

}  // namespace vqa::train
