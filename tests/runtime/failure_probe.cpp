// Helper for the failure tests: a small job on the real communicator that
// fails in one chosen way.
//
//   failure_probe internal | user
//       the last rank fails a check (or reports bad input) while rank 0 waits
//       in an allreduce that can never complete
//   failure_probe stall [--comm-timeout S] [--stall-rank R] [--stall-step K]
//                       [--clock-ms M]
//       allreduce steps with the training position set; rank R (default 1)
//       stops arriving at step K (default 3) and sleeps, so the others wait;
//       each of the others prints the unix time at which it enters step K's
//       allreduce, and with M > 0 every rank prints "probe: rank R clock T"
//       (unix time) to stderr every M ms, so a test can place each of the
//       watchdog's lines (same process, same stream, so in order) in time
//   failure_probe loop [--comm-timeout S] [--step-ms M] [--steps N]
//       N allreduce steps (0: until killed), M ms apart; rank 0 prints
//       "step K" every 10 steps; at the end each rank prints the longest
//       time it waited in one allreduce
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/check.h"         // VQA_CHECK, fatal_user_error
#include "runtime/communicator.h"  // communicator_create
#include "runtime/distributed.h"   // distributed_init
#include "runtime/watchdog.h"      // set_collective_timeout

namespace {

struct ProbeOptions {
  std::string mode = "internal";
  double comm_timeout = -1;  // < 0: the runtime's default
  int stall_rank = 1;
  int stall_step = 3;
  int step_ms = 20;
  int64_t steps = 0;  // 0: no end
  int clock_ms = 0;   // 0: no clock lines
};

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double steady_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Prints this rank's wall clock every `period_ms` on stderr, where the
// watchdog writes too, until the process ends.
void start_clock(int rank, int period_ms) {
  std::thread([rank, period_ms] {
    for (;;) {
      std::fprintf(stderr, "probe: rank %d clock %.3f\n", rank, unix_now());
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
    }
  }).detach();
}

ProbeOptions parse(int argc, char** argv) {
  ProbeOptions options;
  if (argc > 1) options.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const char* value = argv[i + 1];
    if (name == "--comm-timeout") {
      options.comm_timeout = std::atof(value);
    } else if (name == "--stall-rank") {
      options.stall_rank = std::atoi(value);
    } else if (name == "--stall-step") {
      options.stall_step = std::atoi(value);
    } else if (name == "--step-ms") {
      options.step_ms = std::atoi(value);
    } else if (name == "--steps") {
      options.steps = std::atoll(value);
    } else if (name == "--clock-ms") {
      options.clock_ms = std::atoi(value);
    } else {
      vqa::runtime::fatal_user_error("failure_probe: unknown option " + name);
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const auto& info = vqa::runtime::distributed_init(&argc, &argv);
  const ProbeOptions options = parse(argc, argv);
  if (options.comm_timeout >= 0) vqa::runtime::set_collective_timeout(options.comm_timeout);
  auto comm = vqa::runtime::communicator_create(vqa::runtime::Backend::kMpi, torch::kCPU);
  auto buffer = torch::ones({1024});

  if (options.mode == "internal" || options.mode == "user") {
    if (info.rank == info.world_size - 1) {
      if (options.mode == "user") vqa::runtime::fatal_user_error("probe: bad input on purpose", 3);
      VQA_CHECK(info.world_size < 0, "probe: failing on purpose");
    }
    comm->allreduce(buffer, vqa::runtime::ReduceOp::kSum);  // never completes on rank 0
  } else if (options.mode == "stall" || options.mode == "loop") {
    if (options.clock_ms > 0) start_clock(info.rank, options.clock_ms);
    double longest_wait = 0.0;
    for (int64_t step = 0; options.steps == 0 || step < options.steps; ++step) {
      comm->set_position(/*epoch=*/0, step);
      if (options.mode == "stall" && step == options.stall_step) {
        // Wall-clock times, so the test can time the watchdog from here
        // rather than from mpirun's (slow, load-dependent) start.
        if (info.rank == options.stall_rank) {
          std::fprintf(stderr, "probe: rank %d stalls before step %lld at unix time %.3f\n",
                       info.rank, static_cast<long long>(step), unix_now());
          std::this_thread::sleep_for(std::chrono::hours(1));
        }
        // Printed before the allreduce starts, so its deadline starts later.
        std::fprintf(stderr, "probe: rank %d enters step %lld at unix time %.3f\n", info.rank,
                     static_cast<long long>(step), unix_now());
      }
      const double began = steady_now();
      comm->allreduce_async(buffer, vqa::runtime::ReduceOp::kAverage)->wait();
      longest_wait = std::max(longest_wait, steady_now() - began);
      if (info.rank == 0 && step % 10 == 0) {
        std::printf("step %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(options.step_ms));
    }
    std::printf("probe: rank %d longest allreduce=%.3f s\n", info.rank, longest_wait);
    std::fflush(stdout);
  } else {
    vqa::runtime::fatal_user_error("failure_probe: unknown mode " + options.mode);
  }
  comm.reset();
  vqa::runtime::distributed_finalize();
  return 0;
}
