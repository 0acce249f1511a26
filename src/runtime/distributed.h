// Process-level distributed state: MPI start-up and shut-down, who this rank
// is, and the few whole-job operations that are not on tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/types.h"  // RankInfo

namespace vqa::runtime {

// Starts MPI with MPI_THREAD_MULTIPLE: the loader's prefetch thread reads
// through MPI-IO and the CPU communicator's progress thread runs collectives
// while the main thread computes. Fails clearly if the MPI library cannot
// give that level. Call once, from the main thread, before anything else.
const RankInfo& distributed_init(int* argc, char*** argv);

// Ends MPI. Every rank must call it; call once, after all communicators and
// loaders are gone (DistributedSession orders that).
void distributed_finalize();

bool distributed_is_initialized();

// MPI for the scope of main(): distributed_init in the constructor,
// distributed_finalize in the destructor. Declared first in main(), it ends
// MPI after everything declared below it (loaders, communicators, the stop
// agreement) is destroyed, on every return path.
class DistributedSession {
 public:
  DistributedSession(int* argc, char*** argv) : info_(distributed_init(argc, argv)) {}
  ~DistributedSession() { distributed_finalize(); }
  DistributedSession(const DistributedSession&) = delete;
  DistributedSession& operator=(const DistributedSession&) = delete;
  const RankInfo& rank_info() const { return info_; }

 private:
  const RankInfo& info_;
};

// Valid after distributed_init; before it, a single-rank default.
const RankInfo& distributed_rank_info();

// Whole-job operations on MPI_COMM_WORLD for start-up and shut-down, before
// a Communicator exists or after it is gone (the training loop uses its
// Communicator). Main thread only.
void distributed_barrier();
// Root's bytes replace every other rank's; sizes may differ before the call.
void distributed_broadcast_bytes(std::vector<char>& bytes, int root);
// Every rank's string, in rank order (for comparing configs across ranks).
std::vector<std::string> distributed_gather_strings(const std::string& value);

// Ends every rank now with exit_code (MPI_Abort), from any thread.
[[noreturn]] void distributed_abort(int exit_code);

// Configures an HDF5 file-access property list (hid_t) for MPI-IO on a
// communicator reserved for file I/O, so reads on the loader thread never
// interleave with collectives of other threads. Every rank must open the
// file with it (H5Fopen is collective).
void distributed_configure_mpio(int64_t file_access_plist);

}  // namespace vqa::runtime
