// One family of checks for every external call (MPI, CUDA, NCCL, HDF5) and for
// the job's own invariants. A failed check prints rank, host, the call,
// file:line and the library's own error string, then ends the whole job
// (MPI_Abort when MPI is up) so that no other rank is left waiting.
//
// Every macro evaluates its argument exactly once and is active in every build
// type: never wrap a call with side effects in assert().
#pragma once

#include <string>

#include "util/hdf5_error.h"  // hdf5_error_stack, for VQA_CHECK_HDF5

namespace vqa::runtime {

// Prints "[vqa] FATAL rank R/N (HOST): LIBRARY call `CALL` failed at FILE:LINE: DETAIL"
// on stderr and ends the job. Any thread may call it.
[[noreturn]] void fatal_error(const char* library, const char* call, const char* file, int line,
                              const std::string& detail);

// For errors a user caused (bad input file, bad configuration): prints
// "[vqa] error on rank R (HOST): MESSAGE" and ends the job with exit_code on
// every rank. Any thread may call it.
[[noreturn]] void fatal_user_error(const std::string& message, int exit_code = 2);

// For a difference every rank has found at once (after a gather): rank 0
// prints `message` and ends the job; the other ranks wait for that end (and
// end themselves after 30 s), so the message appears once, not once per rank.
// Main thread of every rank.
[[noreturn]] void fatal_user_error_from_rank0(const std::string& message, int exit_code = 2);

// "rank R/N (HOST)" once the runtime is up, "rank ? (HOST)" before.
std::string rank_label();

// MPI's error string for a return code.
std::string mpi_error_string(int code);

}  // namespace vqa::runtime

#define VQA_CHECK(condition, message)                                                \
  do {                                                                               \
    if (!(condition)) {                                                              \
      ::vqa::runtime::fatal_error("vqa", #condition, __FILE__, __LINE__, (message)); \
    }                                                                                \
  } while (0)

// MPI_SUCCESS is 0 in every MPI implementation (the standard fixes it).
#define VQA_CHECK_MPI(call)                                                       \
  do {                                                                            \
    const int vqa_mpi_rc_ = (call);                                               \
    if (vqa_mpi_rc_ != 0) {                                                       \
      ::vqa::runtime::fatal_error("MPI", #call, __FILE__, __LINE__,               \
                                  ::vqa::runtime::mpi_error_string(vqa_mpi_rc_)); \
    }                                                                             \
  } while (0)

// HDF5 calls return a negative herr_t/hid_t on failure; the detail is the top
// of HDF5's error stack.
#define VQA_CHECK_HDF5(call)                                         \
  do {                                                               \
    if ((call) < 0) {                                                \
      ::vqa::runtime::fatal_error("HDF5", #call, __FILE__, __LINE__, \
                                  ::vqa::util::hdf5_error_stack());  \
    }                                                                \
  } while (0)
