// VQA accuracy as the original M3AE/VQA-RAD scripts compute it: a question is
// right when the argmax of the logits equals the argmax of the soft target;
// a question whose answer is outside the label set (all-zero target) is
// always wrong. Overall, open and closed accuracy.
#pragma once

#include <torch/torch.h>

#include <string>

namespace vqa::train {

// Index of each count in the tensor count_answers returns.
enum AnswerCount : int64_t {
  kCorrect = 0,
  kTotal,
  kOpenCorrect,
  kOpenTotal,
  kClosedCorrect,
  kClosedTotal,
  kAnswerCounts
};

// bool [B]: the argmax of the logits is the argmax of the target, and the
// target is inside the label set (not all zero).
torch::Tensor answers_correct(const torch::Tensor& logits, const torch::Tensor& targets);

// float32 [kAnswerCounts] on the logits' device. answer_type: 0 closed, 1 open;
// valid: 1 real sample, 0 padding (not counted).
torch::Tensor count_answers(const torch::Tensor& logits, const torch::Tensor& targets,
                            const torch::Tensor& answer_type, const torch::Tensor& valid);

struct Accuracy {
  double overall = 0, open = 0, closed = 0;  // fractions in [0, 1]; 0 when nothing counted
  int64_t total = 0, open_total = 0, closed_total = 0;
};

// From summed counts (a CPU or device tensor [kAnswerCounts]).
Accuracy accuracy_from_counts(const torch::Tensor& counts);

}  // namespace vqa::train
