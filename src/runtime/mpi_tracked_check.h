// The check of an MPI call made inside a tracked collective: a failure names
// the collective, the training position and any rank on this host whose
// process has ended (collective_call_failed). Private to the runtime folder.
#pragma once

#include "runtime/check.h"          // mpi_error_string
#include "runtime/watchdog_impl.h"  // collective_call_failed

#define VQA_CHECK_MPI_IN(tracker, call)                                                      \
  do {                                                                                       \
    const int vqa_mpi_rc_ = (call);                                                          \
    if (vqa_mpi_rc_ != 0) {                                                                  \
      ::vqa::runtime::collective_call_failed((tracker), "MPI", #call, __FILE__, __LINE__,    \
                                             ::vqa::runtime::mpi_error_string(vqa_mpi_rc_)); \
    }                                                                                        \
  } while (0)
