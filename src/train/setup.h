// Start-up steps of vqa_train that main() reads as one line each.
#pragma once

#include <torch/torch.h>

#include <string>

#include "data/loader.h"          // DatasetInfo
#include "model/m3ae.h"           // ModelConfig
#include "runtime/distributed.h"  // RankInfo
#include "train/config.h"         // TrainConfig

namespace vqa::train {

// cuda:<local rank> for --device cuda (or auto with a GPU), else cpu. Sets
// the CPU threads per rank (--threads, default host cores / ranks on the host).
torch::Device setup_device(const TrainConfig& config, const runtime::RankInfo& rank);

// Every rank hashes `text`; on a mismatch every rank stops, naming `what`
// and the ranks whose hash differs from rank 0's.
void require_same_on_all_ranks(const std::string& what, const std::string& text);

// The preset, with the job's size flags and the dataset's vocabulary, answer
// count, image size or feature shape filled in.
model::ModelConfig setup_model_config(const TrainConfig& config, const data::DatasetInfo& dataset);

}  // namespace vqa::train
