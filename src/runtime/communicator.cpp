#include "runtime/communicator.h"

#include <stdexcept>

#include "runtime/check.h"              // fatal_user_error
#include "runtime/communicator_impl.h"  // backend constructors

namespace vqa::runtime {

Backend backend_from_string(const std::string& name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "mpi") return Backend::kMpi;
  if (name == "nccl") return Backend::kNccl;
  throw std::invalid_argument("unknown communicator backend '" + name +
                              "' (expected auto, mpi or nccl)");
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kMpi:
      return "mpi";
    case Backend::kNccl:
      return "nccl";
  }
  return "?";
}

Backend backend_for_device(const torch::Device& device) {
  return device.is_cuda() ? Backend::kNccl : Backend::kMpi;
}

bool nccl_backend_built() {
#ifdef VQA_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef VQA_HAVE_NCCL
  return nccl_cuda_device_count();
#else
  return 0;
#endif
}

MpiAllreduce mpi_allreduce_from_string(const std::string& name) {
  if (name == "ring") return MpiAllreduce::kRing;
  if (name == "library") return MpiAllreduce::kLibrary;
  throw std::invalid_argument("unknown MPI allreduce algorithm '" + name +
                              "' (expected ring or library)");
}

const char* mpi_allreduce_name(MpiAllreduce algorithm) {
  return algorithm == MpiAllreduce::kRing ? "ring" : "library";
}

std::unique_ptr<Communicator> communicator_create(Backend requested, const torch::Device& device,
                                                  MpiAllreduce mpi_allreduce) {
  const RankInfo& info = distributed_rank_info();
  const Backend backend = requested == Backend::kAuto ? backend_for_device(device) : requested;
  if (backend == Backend::kMpi) return mpi_communicator_create(info, mpi_allreduce);
#ifdef VQA_HAVE_NCCL
  return nccl_communicator_create(info);
#else
  fatal_user_error(
      "the NCCL backend was requested but this build has none; reconfigure with "
      "-DVQA_WITH_NCCL=ON on a machine with the CUDA toolkit and NCCL");
#endif
}

}  // namespace vqa::runtime
