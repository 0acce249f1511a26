// Distributed evaluation: every rank evaluates its shard of the test split
// (padding rows excluded) and the answer counts are summed over the ranks;
// accuracy overall, open, closed and per question type, and on request one
// prediction record per question.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "data/loader.h"           // ShardedLoader
#include "model/m3ae.h"            // M3AE
#include "runtime/communicator.h"  // Communicator
#include "train/train_state.h"     // EvalStats

namespace vqa::train {

// What the prediction records hold. Each is one JSON object:
//   {"qid": 17, "answer_type": "closed", "question_type": "PRES",
//    "target": "yes", "correct": true,
//    "top": [{"answer": "yes", "score": 0.93}, ...],   (top_k, by sigmoid score)
//    "logits": [...]}                                  (all K, with logits)
// "target" is the label with the highest target score, null for an answer
// outside the label set (always wrong); "question_type" is null when unknown.
struct PredictionOptions {
  bool enabled = false;
  int64_t top_k = 5;
  bool logits = false;
};

// Collective. Runs under NoGradGuard with the model in eval mode, and puts
// it back in train mode. `epoch` picks the loader's epoch (its order does not
// matter: the split is not shuffled). Rank 0 gets the prediction records.
// autocast_dtype: the forward's autocast where it runs (TrainConfig::
// autocast_dtype, autocast_runs).
EvalStats evaluate(model::M3AE& model, data::ShardedLoader& loader, runtime::Communicator& comm,
                   const torch::Device& device, int64_t epoch, at::ScalarType autocast_dtype,
                   const PredictionOptions& predictions = {});

}  // namespace vqa::train
