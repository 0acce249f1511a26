// Reading the parts of a sharded checkpoint (--shard-optimizer,
// src/train/checkpoint_shards.h) in tests: each part's header, and the
// moments of all parts put back together per parameter under the names
// load_checkpoint gives an unsharded checkpoint's ("optimizer.g<group>.p<i>.
// exp_avg"), so that a sharded run's state compares with an unsharded one's.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "checkpoint_files.h"  // load_model

namespace vqa::testing {

struct CheckpointPartHeader {
  int64_t rank = -1, parts = 0, step = 0, elements = 0;
};

inline std::string checkpoint_part_path(const std::string& checkpoint, int rank, int parts) {
  char suffix[48];
  std::snprintf(suffix, sizeof(suffix), ".part-%04d-of-%04d", rank, parts);
  return checkpoint + suffix;
}

// The number of parts the checkpoint's optimiser state is in (0: unsharded).
inline int64_t checkpoint_optimizer_parts(const std::string& checkpoint) {
  torch::serialize::InputArchive archive;
  archive.load_from(checkpoint);
  torch::Tensor parts;
  return archive.try_read("optimizer_parts", parts) ? parts.item<int64_t>() : 0;
}

inline CheckpointPartHeader read_part_header(const std::string& part) {
  torch::serialize::InputArchive archive;
  archive.load_from(part);
  const auto read = [&archive](const char* key) {
    torch::Tensor value;
    archive.read(key, value);
    return value;
  };
  return {read("part.rank").item<int64_t>(), read("part.parts").item<int64_t>(),
          read("part.step").item<int64_t>(), read("part.exp_avg").numel()};
}

// Every part's moments, whole per parameter, named as load_checkpoint names
// an unsharded checkpoint's ("optimizer.g<group>.p<i>.exp_avg" / exp_avg_sq).
inline std::map<std::string, torch::Tensor> load_sharded_moments(const std::string& checkpoint) {
  const auto model = load_model(checkpoint);
  const int64_t parts = checkpoint_optimizer_parts(checkpoint);
  EXPECT_GT(parts, 0) << checkpoint << " is not sharded";
  std::map<std::string, torch::Tensor> moments;
  for (int rank = 0; rank < parts; ++rank) {
    torch::serialize::InputArchive archive;
    archive.load_from(checkpoint_part_path(checkpoint, rank, static_cast<int>(parts)));
    torch::Tensor runs, exp_avg, exp_avg_sq;
    c10::IValue names_value;
    archive.read("part.runs", runs);
    archive.read("part.exp_avg", exp_avg);
    archive.read("part.exp_avg_sq", exp_avg_sq);
    archive.read("part.names", names_value);
    std::istringstream names(names_value.toStringRef());
    for (int64_t i = 0; i < runs.size(0); ++i) {
      std::string name;
      std::getline(names, name);
      const auto run = runs[i];
      const std::string prefix = "optimizer.g" + std::to_string(run[3].item<int64_t>()) + ".p" +
                                 std::to_string(run[4].item<int64_t>()) + ".";
      const int64_t offset = run[0].item<int64_t>(), length = run[1].item<int64_t>(),
                    flat = run[2].item<int64_t>();
      for (const auto& [suffix, source] :
           {std::pair{"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}}) {
        auto& whole = moments[prefix + suffix];
        if (!whole.defined()) whole = torch::zeros_like(model.at(name));
        whole.view({-1}).narrow(0, offset, length).copy_(source.narrow(0, flat, length));
      }
    }
  }
  return moments;
}

// The first moments (exp_avg) of a sharded checkpoint, as load_first_moments
// gives an unsharded one's.
inline std::map<std::string, torch::Tensor> load_sharded_first_moments(
    const std::string& checkpoint) {
  std::map<std::string, torch::Tensor> first;
  for (const auto& [name, tensor] : load_sharded_moments(checkpoint)) {
    if (name.size() > 8 && name.compare(name.size() - 8, 8, ".exp_avg") == 0) first[name] = tensor;
  }
  return first;
}

}  // namespace vqa::testing
