// Backend constructors behind communicator_create; private to the runtime folder.
#pragma once

#include <memory>

#include "runtime/communicator.h"  // Communicator, RankInfo

namespace vqa::runtime {

std::unique_ptr<Communicator> mpi_communicator_create(const RankInfo& info, MpiAllreduce algorithm);
// Defined only when the NCCL backend is built (VQA_HAVE_NCCL).
std::unique_ptr<Communicator> nccl_communicator_create(const RankInfo& info);
int nccl_cuda_device_count();
int nccl_runtime_version();  // ncclGetVersion's code

}  // namespace vqa::runtime
