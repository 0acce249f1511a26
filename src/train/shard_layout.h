// The flat buffers that ZeRO-1 (--shard-optimizer) works on, as the
// gradient synchroniser lays them out and the optimiser updates them: per
// bucket, the parameters' values and their averaged gradients in one flat
// float32 buffer each (the parameters are views of `values`), and the range
// of it this rank owns.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace vqa::train {

struct ShardMember {
  torch::Tensor parameter;  // the model's parameter (a view of the bucket's values)
  int64_t offset = 0;       // elements into the bucket's flat buffers
};

struct ShardBucket {
  torch::Tensor values;        // float32, the parameters' storage
  torch::Tensor gradients;     // float32, the same layout; averaged in [begin, end) after backward
  int64_t begin = 0, end = 0;  // elements this rank updates (the whole bucket when not sharded)
  bool sharded = false;        // false: every rank holds and updates the whole bucket
  std::vector<ShardMember> members;
};

}  // namespace vqa::train
