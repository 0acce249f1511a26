#include "runtime/check.h"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "runtime/distributed.h"  // distributed_rank_info, distributed_abort

namespace vqa::runtime {

std::string rank_label() {
  if (!distributed_is_initialized()) {
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    return std::string("rank ? (") + host + ")";
  }
  const RankInfo& info = distributed_rank_info();
  return "rank " + std::to_string(info.rank) + "/" + std::to_string(info.world_size) + " (" +
         info.host + ")";
}

namespace {
[[noreturn]] void end_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (distributed_is_initialized()) distributed_abort(exit_code);
  std::_Exit(exit_code);
}
}  // namespace

void fatal_error(const char* library, const char* call, const char* file, int line,
                 const std::string& detail) {
  std::fprintf(stderr, "[vqa] FATAL %s: %s call `%s` failed at %s:%d: %s\n", rank_label().c_str(),
               library, call, file, line, detail.c_str());
  end_job(1);
}

void fatal_user_error(const std::string& message, int exit_code) {
  std::fprintf(stderr, "[vqa] error on %s: %s\n", rank_label().c_str(), message.c_str());
  end_job(exit_code);
}

void fatal_user_error_from_rank0(const std::string& message, int exit_code) {
  if (!distributed_is_initialized() || distributed_rank_info().rank == 0) {
    fatal_user_error(message, exit_code);
  }
  // Rank 0's MPI_Abort ends this process; this is the fallback if it never comes.
  std::this_thread::sleep_for(std::chrono::seconds(30));
  fatal_user_error("stopping (rank 0 found a difference between the ranks)", exit_code);
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

}  // namespace vqa::runtime
