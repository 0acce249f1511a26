#include "runtime/mpi_collectives.h"

#include "runtime/tracked_check.h"  // VQA_CHECK_MPI_IN

namespace vqa::runtime {

namespace {

MPI_Op mpi_op(ScalarOp op) {
  switch (op) {
    case ScalarOp::kSum:
      return MPI_SUM;
    case ScalarOp::kMax:
      return MPI_MAX;
    case ScalarOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace

double mpi_allreduce_scalar(MPI_Comm comm, double value, ScalarOp op,
                            const CollectiveTracker* tracker) {
  double result = 0.0;
  VQA_CHECK_MPI_IN(tracker, MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, mpi_op(op), comm));
  return result;
}

std::vector<std::string> mpi_allgather_strings(MPI_Comm comm, const std::string& value,
                                               const CollectiveTracker* tracker) {
  int world_size = 1;
  VQA_CHECK_MPI_IN(tracker, MPI_Comm_size(comm, &world_size));
  const int length = static_cast<int>(value.size());
  std::vector<int> lengths(world_size);
  VQA_CHECK_MPI_IN(tracker, MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  std::vector<int> offsets(world_size, 0);
  int total = 0;
  for (int r = 0; r < world_size; ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  VQA_CHECK_MPI_IN(tracker, MPI_Allgatherv(value.data(), length, MPI_CHAR, all.data(),
                                           lengths.data(), offsets.data(), MPI_CHAR, comm));
  std::vector<std::string> result;
  for (int r = 0; r < world_size; ++r) result.push_back(all.substr(offsets[r], lengths[r]));
  return result;
}

}  // namespace vqa::runtime
