#include "runtime/check.h"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace vqa::runtime {

namespace {

// MPI is up: initialised and not finalised (both callable at any time, from
// any thread). The check family sits below distributed.h, so it asks MPI.
bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] void end_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace

std::string rank_label() {
  char host[MPI_MAX_PROCESSOR_NAME + 1] = "?";
  if (!mpi_running()) {
    gethostname(host, sizeof(host) - 1);
    return std::string("rank ? (") + host + ")";
  }
  int size = 1, length = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(host, &length);
  return "rank " + std::to_string(world_rank()) + "/" + std::to_string(size) + " (" + host + ")";
}

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
  if (!mpi_running() || world_rank() == 0) {
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
