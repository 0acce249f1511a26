#include "train/metrics.h"

namespace vqa::train {

torch::Tensor answers_correct(const torch::Tensor& logits, const torch::Tensor& targets) {
  torch::NoGradGuard no_grad;
  const auto predicted = logits.argmax(/*dim=*/1);
  const auto [best_score, best_label] = targets.max(/*dim=*/1);
  return (predicted == best_label).logical_and(best_score > 0);
}

torch::Tensor count_answers(const torch::Tensor& logits, const torch::Tensor& targets,
                            const torch::Tensor& answer_type, const torch::Tensor& valid) {
  torch::NoGradGuard no_grad;
  const auto counted = valid.to(torch::kFloat32);
  const auto correct = answers_correct(logits, targets).to(torch::kFloat32) * counted;
  const auto open = (answer_type == 1).to(torch::kFloat32) * counted;
  const auto closed = (answer_type == 0).to(torch::kFloat32) * counted;
  return torch::stack({correct.sum(), counted.sum(), (correct * open).sum(), open.sum(),
                       (correct * closed).sum(), closed.sum()});
}

Accuracy accuracy_from_counts(const torch::Tensor& counts) {
  const auto host = counts.to(torch::kCPU, torch::kFloat64);
  const auto* c = host.data_ptr<double>();
  auto ratio = [](double part, double whole) { return whole > 0 ? part / whole : 0.0; };
  Accuracy accuracy;
  accuracy.overall = ratio(c[kCorrect], c[kTotal]);
  accuracy.open = ratio(c[kOpenCorrect], c[kOpenTotal]);
  accuracy.closed = ratio(c[kClosedCorrect], c[kClosedTotal]);
  accuracy.total = static_cast<int64_t>(c[kTotal]);
  accuracy.open_total = static_cast<int64_t>(c[kOpenTotal]);
  accuracy.closed_total = static_cast<int64_t>(c[kClosedTotal]);
  return accuracy;
}

}  // namespace vqa::train
