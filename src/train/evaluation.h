// Distributed evaluation: every rank evaluates its shard of the test split
// (padding rows excluded) and the answer counts are summed over the ranks.
#pragma once

#include <torch/torch.h>

#include "data/loader.h"           // ShardedLoader
#include "model/m3ae.h"            // M3AE
#include "runtime/communicator.h"  // Communicator
#include "train/run_state.h"       // EvalStats

namespace vqa::train {

// Collective. Runs under NoGradGuard with the model in eval mode, and puts
// it back in train mode. `epoch` picks the loader's epoch (its order does not
// matter: the split is not shuffled).
EvalStats evaluate(model::M3AE& model, data::ShardedLoader& loader, runtime::Communicator& comm,
                   const torch::Device& device, int64_t epoch, bool bf16_autocast);

}  // namespace vqa::train
