// Start-up steps of vqa_train that main() reads as one line each.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "data/loader.h"          // DatasetInfo
#include "model/m3ae.h"           // ModelConfig
#include "runtime/distributed.h"  // RankInfo
#include "train/config.h"         // TrainConfig

namespace vqa::train {

// cuda:<local rank> for --device cuda (or auto with a GPU), else cpu. Sets
// the CPU threads per rank (--threads, default host cores / ranks on the host).
torch::Device setup_device(const TrainConfig& config, const runtime::RankInfo& rank);

// Every rank hashes `text`; on a mismatch the job stops before training,
// and rank 0 prints which ranks differ from it and how: the differing lines
// ("key = value" of an INI text, or '|'-separated parts), each rank's value
// next to rank 0's. Collective; main thread.
void require_same_on_all_ranks(const std::string& what, const std::string& text);

// Every rank describes each file by its size and a checksum of its first and
// last 64 KiB (HDF5 keeps its superblock and most metadata there) without
// opening it as HDF5; on a mismatch (node-local copies that differ, a stale
// copy on one node) the job stops before any rank opens the files, naming
// the file, the ranks and their sizes and checksums. A missing file is
// described as missing. Collective; main thread; call before the loaders.
void require_same_files_on_all_ranks(const std::vector<std::string>& paths);

// The preset, with the job's size flags and the dataset's vocabulary, answer
// count, image size or feature shape filled in.
model::ModelConfig setup_model_config(const TrainConfig& config, const data::DatasetInfo& dataset);

}  // namespace vqa::train
