// Crashes inside HDF5 on a damaged file, reported as bad input.
//
// HDF5 1.10 can crash on a corrupt file (fuzzing found reads of the global
// heap that segfault: tests/fuzz/hdf5_crashes/). Nothing can catch a memory
// error inside the library, but a fatal signal on a thread that is reading a
// dataset file can still name the file and what was being read, and end the
// process with the program's bad-input status instead of a bare
// "Segmentation fault". Fatal signals anywhere else go on to the handler
// that was there before (Open MPI's backtrace, or the default core dump).
#pragma once

#include <string>

namespace vqa::data {

// Installs the handler for SIGSEGV, SIGBUS, SIGFPE and SIGILL. `prefix`
// starts the message ("[vqa] error on rank 0/2 (host): "); the process ends
// with _exit(exit_code). Call once, after MPI_Init (which installs its own).
void hdf5_crash_report_install(const std::string& prefix, int exit_code);

// Marks the calling thread as reading `path` for the scope's lifetime
// (DatasetReader's constructor and reads). Scopes nest.
class Hdf5CrashScope {
 public:
  explicit Hdf5CrashScope(const std::string& path);
  ~Hdf5CrashScope();
  Hdf5CrashScope(const Hdf5CrashScope&) = delete;
  Hdf5CrashScope& operator=(const Hdf5CrashScope&) = delete;

 private:
  bool active_ = false;
};

// What the scope's thread reads now ("dataset '/train/images'"): the message
// says "<path>: <what>: HDF5 crashed (SIGSEGV) ...".
void hdf5_crash_context(const std::string& what);

}  // namespace vqa::data
