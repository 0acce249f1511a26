// Process helpers of the test suites: run a command (mpirun, the job's
// binaries) with a timeout, temporary folders, searching its output.
#pragma once

#include <string>

namespace vqa::testing {

struct ProcessResult {
  int exit_code = -1;  // the process's exit status; 128+N when killed by signal N
  bool timed_out = false;
  double seconds = 0.0;
  std::string output;  // stdout and stderr together
};

// Runs `command` with /bin/sh, merging stderr into stdout; kills its whole
// process group after timeout_seconds. For tests that start mpirun or the
// job's binaries themselves and check exit status, time and message.
ProcessResult run_process(const std::string& command, double timeout_seconds);

// mpirun as the tests start it (root-safe, oversubscribed), ending with a space.
std::string mpirun_prefix(int ranks);

// A fresh empty directory under the system's temporary folder, removed with
// its contents when the test program exits.
std::string make_temp_dir(const std::string& tag);

// Whether `text` holds `part` (for process output).
bool contains(const std::string& text, const std::string& part);

// The number after the first `key=` in `text` ("took=3.2 s" -> 3.2), or -1.
double value_after(const std::string& text, const std::string& key);

}  // namespace vqa::testing
