// Helper for test_failure: rank 0 waits in an allreduce that can never
// complete while the last rank makes a failing MPI call. The check must end
// every rank quickly instead of leaving rank 0 waiting.
#include <torch/torch.h>

#include <cstring>

#include "runtime/check.h"         // VQA_CHECK, fatal_user_error
#include "runtime/communicator.h"  // communicator_create
#include "runtime/distributed.h"   // distributed_init

int main(int argc, char** argv) {
  const auto& info = vqa::runtime::distributed_init(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "internal";
  auto comm = vqa::runtime::communicator_create(vqa::runtime::Backend::kMpi, torch::kCPU);
  if (info.rank == info.world_size - 1) {
    if (mode == "user") vqa::runtime::fatal_user_error("probe: bad input on purpose", 3);
    VQA_CHECK(info.world_size < 0, "probe: failing on purpose");
  }
  auto buffer = torch::ones({16});
  comm->allreduce(buffer, vqa::runtime::ReduceOp::kSum);  // never completes on rank 0
  vqa::runtime::distributed_finalize();
  return 0;
}
