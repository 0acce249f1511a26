#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "process.h"

namespace vqa::testing {

ProcessResult run_process(const std::string& command, double timeout_seconds) {
  ProcessResult result;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return result;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // own process group, so a timeout kills mpirun and its ranks
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipe_fds[1]);
  // Read on a thread so a chatty child never blocks on a full pipe.
  std::thread reader([&] {
    char chunk[4096];
    ssize_t n;
    while ((n = read(pipe_fds[0], chunk, sizeof(chunk))) > 0) result.output.append(chunk, n);
  });
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > timeout_seconds) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  reader.join();
  close(pipe_fds[0]);
  if (WIFEXITED(status))
    result.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status))
    result.exit_code = 128 + WTERMSIG(status);
  return result;
}

std::string mpirun_prefix(int ranks) {
  return "mpirun -np " + std::to_string(ranks) +
         " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 ";
}

namespace {

// The folders make_temp_dir made, removed when the test program exits (by
// the process that made them, not by a forked child that exits).
struct TempDirs {
  std::vector<std::string> paths;
  pid_t owner = getpid();
  ~TempDirs() {
    if (getpid() != owner) return;
    for (const auto& path : paths) {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  }
};

TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string make_temp_dir(const std::string& tag) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("vqa-" + tag + "-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) return {};
  temp_dirs().paths.push_back(pattern);
  return pattern;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

double value_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key + "=");
  return at == std::string::npos ? -1.0 : std::atof(text.c_str() + at + key.size() + 1);
}

}  // namespace vqa::testing
