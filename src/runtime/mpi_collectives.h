// The MPI calls behind the collectives that are not on tensors (scalar
// allreduce, string gather), shared by distributed.cpp and both
// communicator backends. Private to the runtime folder.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "runtime/types.h"  // ScalarOp

namespace vqa::runtime {

class CollectiveTracker;

// `value` combined over `comm`. A failed call ends the job through
// VQA_CHECK_MPI_IN(tracker, ...): naming the collective when `tracker` is
// given.
double mpi_allreduce_scalar(MPI_Comm comm, double value, ScalarOp op,
                            const CollectiveTracker* tracker);

// Every rank's string on `comm`, in rank order, on every rank.
std::vector<std::string> mpi_allgather_strings(MPI_Comm comm, const std::string& value,
                                               const CollectiveTracker* tracker);

}  // namespace vqa::runtime
