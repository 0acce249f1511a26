#include "runtime/communicator.h"

#include <cstdlib>
#include <stdexcept>

#include "runtime/check.h"              // fatal_user_error
#include "runtime/communicator_impl.h"  // backend constructors
#include "runtime/distributed.h"        // distributed_rank_info

namespace vqa::runtime {

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

CudaDeviceChoice cuda_device_choice(int visible, int local_rank, int local_size) {
  CudaDeviceChoice choice;
  const std::string ranks = std::to_string(local_size) + " rank" + (local_size == 1 ? "" : "s");
  if (visible == 1) {
    choice.index = 0;
  } else if (visible >= local_size && local_rank < visible) {
    choice.index = local_rank;
    if (visible > local_size) {
      choice.note = std::to_string(visible) + " visible CUDA devices for " + ranks +
                    " on this host: devices " + std::to_string(local_size) + ".." +
                    std::to_string(visible - 1) + " stay idle";
    }
  } else if (visible <= 0) {
    choice.problem = "no visible CUDA device";
  } else {
    choice.problem = std::to_string(visible) + " visible CUDA devices for " + ranks +
                     " on this host: give every rank its own device (one visible device per "
                     "rank, e.g. Slurm's --gpus-per-task=1, or at least as many devices as "
                     "ranks), or start fewer ranks per host";
  }
  return choice;
}

void Communicator::library_allreduce_sum(const torch::Tensor& /*buffer*/) {
  throw std::logic_error("library_allreduce_sum: only the MPI backend runs the MPI library");
}

namespace {

// "2.18.3" from ncclGetVersion's code: major x 1000 + minor x 100 + patch up
// to 2.8, major x 10000 + minor x 100 + patch from 2.9 on.
std::string nccl_version_text(int version) {
  const bool old_code = version < 10000;
  const int major = old_code ? version / 1000 : version / 10000;
  const int minor = (old_code ? version % 1000 : version % 10000) / 100;
  const int patch = version % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace

std::string nccl_version_loaded() {
#ifdef VQA_HAVE_NCCL
  return nccl_version_text(nccl_runtime_version());
#else
  return "";
#endif
}

std::string nccl_graph_capture_unavailable(int version) {
  if (version >= 20906) return "";  // 2.9.6: collectives under stream capture
  return "NCCL " + nccl_version_text(version) +
         " cannot be captured into a CUDA graph (NCCL 2.9.6 or later can: load a newer "
         "libnccl)";
}

std::string graph_capture_unavailable(Backend requested, const torch::Device& device) {
  const Backend backend = requested == Backend::kAuto ? backend_for_device(device) : requested;
  if (backend == Backend::kMpi) {
    return "the MPI backend's collectives run on the host; NCCL's are captured";
  }
#ifdef VQA_HAVE_NCCL
  return nccl_graph_capture_unavailable(nccl_runtime_version());
#else
  return "this build has no NCCL backend";
#endif
}

int cuda_device_for(const RankInfo& info) {
  const int visible = cuda_device_count();
  const CudaDeviceChoice choice = cuda_device_choice(visible, info.local_rank, info.local_size);
  if (choice.index < 0) {
    const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
    fatal_user_error(
        "rank " + std::to_string(info.rank) + " on host " + info.host + " (local rank " +
        std::to_string(info.local_rank) + " of " + std::to_string(info.local_size) +
        ", CUDA_VISIBLE_DEVICES=" + (mask ? "'" + std::string(mask) + "'" : std::string("unset")) +
        ", visible devices " + std::to_string(visible) + "): " + choice.problem);
  }
  return choice.index;
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
