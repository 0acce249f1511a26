// The checks of an MPI or NCCL call made inside a collective that a
// CollectiveTracker counts: a failure names the collective, the training
// position and any rank on this host whose process has ended. With a null
// tracker (a collective nobody tracks) they act as VQA_CHECK_MPI and
// VQA_CHECK_NCCL. The same family as check.h's macros; private to the
// runtime folder.
#pragma once

#include <string>

#include "runtime/check.h"  // mpi_error_string

namespace vqa::runtime {

class CollectiveTracker;

// Prints the call, file:line, the library's error, the collective and the
// training position, names ranks on this host whose process has ended, and
// ends the job; with tracker == nullptr, fatal_error. Any thread.
[[noreturn]] void collective_call_failed(const CollectiveTracker* tracker, const char* library,
                                         const char* call, const char* file, int line,
                                         const std::string& detail);

}  // namespace vqa::runtime

// tracker: const CollectiveTracker* (may be null).
#define VQA_CHECK_MPI_IN(tracker, call)                                                      \
  do {                                                                                       \
    const int vqa_mpi_rc_ = (call);                                                          \
    if (vqa_mpi_rc_ != 0) {                                                                  \
      ::vqa::runtime::collective_call_failed((tracker), "MPI", #call, __FILE__, __LINE__,    \
                                             ::vqa::runtime::mpi_error_string(vqa_mpi_rc_)); \
    }                                                                                        \
  } while (0)

// Expands only where nccl.h is included (the NCCL backend).
#define VQA_CHECK_NCCL_IN(tracker, call)                                                   \
  do {                                                                                     \
    const ncclResult_t vqa_nccl_rc_ = (call);                                              \
    if (vqa_nccl_rc_ != ncclSuccess) {                                                     \
      ::vqa::runtime::collective_call_failed((tracker), "NCCL", #call, __FILE__, __LINE__, \
                                             ncclGetErrorString(vqa_nccl_rc_));            \
    }                                                                                      \
  } while (0)
