// vqa_allreduce_bench: bandwidth and correctness of the communicator's
// allreduce, in the manner of nccl-tests. For the MPI backend each size is
// also timed with a raw MPI_Allreduce on the same buffer, in slices alternating
// with ours within every round, so the overhead of our layer shows as a ratio
// that a slow spell of a shared machine affects on both sides alike.
//
//   mpirun -np 2 build/vqa_allreduce_bench -b 4 -e 256M -f 4
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/check.h"         // fatal_user_error
#include "runtime/communicator.h"  // Communicator, communicator_create
#include "runtime/distributed.h"   // DistributedSession
#include "runtime/system_info.h"   // keep_freed_memory_for_reuse, mpi_yield_when_idle
#include "util/clock.h"            // SteadyClock, seconds_since
#include "util/options.h"          // OptionTable

using vqa::runtime::Communicator;
using vqa::runtime::ReduceOp;

namespace {

enum class BufferDevice { kCpu, kCuda };

struct BenchConfig {
  std::string min_bytes = "4";
  std::string max_bytes = "64M";
  int step_factor = 4;
  int warmup_iters = 5;
  int iters = 20;
  int rounds = 5;
  double round_seconds = 0.2;
  std::string dtype = "float";
  std::string op = "sum";
  vqa::runtime::Backend backend = vqa::runtime::Backend::kAuto;
  vqa::runtime::MpiAllreduce mpi_allreduce = vqa::runtime::MpiAllreduce::kAuto;
  BufferDevice device = BufferDevice::kCpu;
  bool check = true;
  bool compare_raw = true;
};

// "256M" -> 268435456; suffixes K, M, G are powers of 1024.
int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  int64_t value = std::stoll(text, &used);
  const std::string suffix = text.substr(used);
  if (suffix == "K" || suffix == "k")
    value <<= 10;
  else if (suffix == "M" || suffix == "m")
    value <<= 20;
  else if (suffix == "G" || suffix == "g")
    value <<= 30;
  else if (!suffix.empty())
    throw std::invalid_argument("bad size '" + text + "'");
  return value;
}

// Per-rank input whose reduction is exact in float32 and bfloat16:
// small integers, so sums of up to a few hundred ranks stay exact.
void fill_input(torch::Tensor& buffer, int rank) {
  auto index = torch::arange(buffer.numel(), torch::TensorOptions().dtype(torch::kInt64));
  auto values = (index.remainder(7) + 1) * (rank + 1);
  buffer.copy_(values.to(buffer.scalar_type()).to(buffer.device()));
}

int64_t count_wrong(const torch::Tensor& result, int world_size, ReduceOp op) {
  auto index = torch::arange(result.numel(), torch::TensorOptions().dtype(torch::kInt64));
  auto expected =
      (index.remainder(7) + 1).to(torch::kFloat64) * (world_size * (world_size + 1) / 2);
  if (op == ReduceOp::kAverage) expected = expected / world_size;
  // Tolerance: float32 and bfloat16 hold these small integers exactly; an
  // average may round, by at most half a unit in the last place (2^-8 for bf16).
  const double tolerance = result.scalar_type() == torch::kBFloat16 ? 1.0 / 128 : 1e-6;
  auto error = (result.to(torch::kCPU).to(torch::kFloat64) - expected).abs() / expected;
  return (error > tolerance).sum().item<int64_t>();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Mean seconds per allreduce over `iters`: the blocking call, or launch + wait
// of the asynchronous one (which hands the work to the progress thread).
double time_ours(Communicator& comm, const torch::Tensor& buffer, ReduceOp op, int iters,
                 bool async) {
  comm.barrier();
  const auto start = vqa::util::SteadyClock::now();
  for (int i = 0; i < iters; ++i) {
    if (async) {
      comm.allreduce_async(buffer, op)->wait();
    } else {
      comm.allreduce(buffer, op);
    }
  }
  comm.barrier();
  return vqa::util::seconds_since(start) / iters;
}

// User and system CPU seconds of this process, all threads (the progress
// thread and the kernel's work for its sockets included).
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

double time_raw_mpi(Communicator& comm, const torch::Tensor& buffer, int iters) {
  comm.barrier();
  const auto start = vqa::util::SteadyClock::now();
  for (int i = 0; i < iters; ++i) {
    comm.library_allreduce_sum(buffer);
  }
  comm.barrier();
  return vqa::util::seconds_since(start) / iters;
}

}  // namespace

int run_bench(const BenchConfig& config, int64_t min_bytes, int64_t max_bytes,
              const vqa::runtime::RankInfo& info);

int main(int argc, char** argv) {
  // The process set up as vqa_train's (system_info.h): freed memory kept for
  // reuse, MPI's blocking waits yielding; both change how MPI_Allreduce runs.
  vqa::runtime::keep_freed_memory_for_reuse();
  vqa::runtime::mpi_yield_when_idle();
  vqa::runtime::DistributedSession session(&argc, &argv);  // MPI ends after everything below
  const auto& info = session.rank_info();
  BenchConfig config;
  vqa::util::OptionTable options("vqa_allreduce_bench options");
  options
      .add("minbytes,b", &config.min_bytes, "smallest message, bytes per rank (suffixes K, M, G)")
      .add("maxbytes,e", &config.max_bytes, "largest message, bytes per rank (suffixes K, M, G)")
      .add("stepfactor,f", &config.step_factor,
           "multiply the size by this factor from one row to the next", vqa::util::Range{2, 1024})
      .add("warmup_iters,w", &config.warmup_iters,
           "untimed allreduces before each size (at least 1: it gives the time per call "
           "that --round-seconds needs)",
           vqa::util::Range{0, 1e6})
      .add("iters,n", &config.iters, "timed allreduces per round", vqa::util::Range{1, 1e6})
      .add("round-seconds", &config.round_seconds,
           "more timed allreduces per round where -n would take less than this many seconds "
           "(from the warm-up's time per call), so one pause of a shared machine's scheduler "
           "does not dominate a round; 0: exactly -n",
           vqa::util::Range{0, 60})
      .add("rounds,r", &config.rounds,
           "rounds per size; the table shows the median round (ours and raw MPI alternate)",
           vqa::util::Range{1, 1e4})
      .add_choice("datatype,d", &config.dtype, "element type: float (float32) or bf16 (bfloat16)",
                  {"float", "bf16"})
      .add_choice("op,o", &config.op,
                  "reduction: sum or avg (sum, then divide by the number of ranks)", {"sum", "avg"})
      .add_choice("backend", &config.backend, "communicator: auto (from --device), mpi or nccl",
                  vqa::runtime::kBackendNames)
      .add_choice("mpi-allreduce", &config.mpi_allreduce,
                  "the MPI backend's algorithm for buffers of 64 KiB and more: auto (per size, "
                  "the faster of library and ring in a start-up probe, as vqa_train), ring (the "
                  "project's pipelined ring) or library (MPI_Allreduce)",
                  vqa::runtime::kMpiAllreduceNames)
      .add_choice("device", &config.device,
                  "where the buffer lives: cpu or cuda (the only visible GPU, or the local rank's)",
                  vqa::util::ModeNames<BufferDevice>{{"cpu", BufferDevice::kCpu},
                                                     {"cuda", BufferDevice::kCuda}})
      .add("check,c", &config.check,
           "verify every size's result (true) or not (false); wrong elements make the exit "
           "status 1")
      .add("raw", &config.compare_raw,
           "also time raw MPI_Allreduce on the same buffer (MPI backend, float, sum only)");
  try {
    if (!options.parse(argc, argv)) {
      if (info.rank == 0) options.print_help(stdout, "usage: vqa_allreduce_bench [options]");
      return 0;
    }
  } catch (const vqa::util::OptionError& e) {
    vqa::runtime::fatal_user_error(std::string("vqa_allreduce_bench: ") + e.what() +
                                   " (see --help)");
  }

  int64_t min_bytes = 0, max_bytes = 0;
  try {
    min_bytes = parse_bytes(config.min_bytes);
    max_bytes = parse_bytes(config.max_bytes);
  } catch (const std::exception& e) {
    vqa::runtime::fatal_user_error(std::string("vqa_allreduce_bench: -b/-e: ") + e.what());
  }
  constexpr int64_t kMaxBytes = int64_t{16} << 30;
  if (min_bytes < 1 || max_bytes < min_bytes || max_bytes > kMaxBytes) {
    vqa::runtime::fatal_user_error("need 1 <= -b <= -e <= 16G, got -b " + config.min_bytes +
                                   " -e " + config.max_bytes);
  }
  // Nothing a user types may end in std::terminate (an allocation that
  // fails, a device that is not there): the error line, exit 2, every rank.
  try {
    return run_bench(config, min_bytes, max_bytes, info);
  } catch (const c10::Error& e) {
    vqa::runtime::fatal_user_error(std::string("vqa_allreduce_bench: ") +
                                   e.what_without_backtrace());
  } catch (const std::exception& e) {
    vqa::runtime::fatal_user_error(std::string("vqa_allreduce_bench: ") + e.what());
  }
}

int run_bench(const BenchConfig& config, int64_t min_bytes, int64_t max_bytes,
              const vqa::runtime::RankInfo& info) {
  const bool cuda = config.device == BufferDevice::kCuda;
  const torch::Device device(cuda ? torch::kCUDA : torch::kCPU,
                             cuda ? vqa::runtime::cuda_device_for(info) : -1);
  torch::set_num_threads(1);
  auto comm = vqa::runtime::communicator_create(config.backend, device, config.mpi_allreduce);
  const auto dtype = config.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  const ReduceOp op = config.op == "avg" ? ReduceOp::kAverage : ReduceOp::kSum;
  const bool raw = config.compare_raw && comm->backend() == vqa::runtime::Backend::kMpi &&
                   dtype == torch::kFloat32 && op == ReduceOp::kSum;
  const int n = info.world_size;
  // The MPI backend picks its algorithm per size (auto) or the ring its
  // segment size for this fabric, as vqa_train does at start-up.
  const std::string tuning = comm->tune_allreduce(max_bytes);

  if (info.rank == 0) {
    std::printf(
        "# vqa_allreduce_bench: %d ranks, backend %s (%s allreduce), device %s, %d warm-up + %d "
        "x (at least %d, and %.3g s) timed iterations per size (median round)\n",
        n, vqa::runtime::backend_name(comm->backend()).c_str(),
        comm->backend() == vqa::runtime::Backend::kMpi
            ? vqa::runtime::mpi_allreduce_name(config.mpi_allreduce).c_str()
            : "nccl",
        device.str().c_str(), config.warmup_iters, config.rounds, config.iters,
        config.round_seconds);
    std::printf(
        "# time = blocking allreduce; async = allreduce_async + wait (progress thread);\n"
        "# busbw = algbw * 2(n-1)/n; raw = MPI_Allreduce on the same buffer and MPI communicator; "
        "ratio = median over rounds of time / raw in the round (8 alternating slices each);\n"
        "# cpu = this process's CPU time (all threads, user + system) per MB sent and received, "
        "2(n-1)/n of the size (the busiest rank's); iters = timed calls per round\n");
    if (!tuning.empty()) std::printf("# %s\n", tuning.c_str());
    std::printf("%12s %12s %6s %5s %11s %9s %9s %7s %11s %11s %7s %10s %7s\n", "size(B)", "count",
                "type", "redop", "time(us)", "algbw", "busbw", "#wrong", "async(us)", "raw(us)",
                "ratio", "cpu", "iters");
    std::printf("%12s %12s %6s %5s %11s %9s %9s %7s %11s %11s %7s %10s %7s\n", "", "(elements)", "",
                "", "", "(GB/s)", "(GB/s)", "", "", "", "", "(us/MB)", "");
  }

  int64_t total_wrong = 0;
  const int64_t element_size = dtype == torch::kBFloat16 ? 2 : 4;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= config.step_factor) {
    const int64_t count = std::max<int64_t>(1, bytes / element_size);
    auto buffer = torch::empty({count}, torch::TensorOptions().dtype(dtype).device(device));

    fill_input(buffer, info.rank);
    comm->allreduce(buffer, op);
    comm->barrier();
    int64_t wrong = 0;
    if (config.check) {
      wrong = static_cast<int64_t>(comm->sum(static_cast<double>(count_wrong(buffer, n, op))));
    }
    total_wrong += wrong;

    // Timed values grow with every in-place sum (doubling at 2 ranks, so
    // long runs reach infinity, which adds as fast); each timing starts
    // from small ones. The warm-up calls are timed to the end of their work:
    // time_ours waits at a barrier, which drains the NCCL stream (else a
    // GPU's per-call time is the host's launch cost, the rounds far too long).
    buffer.fill_(1.0 / 1024);
    const double per_call =
        comm->max(time_ours(*comm, buffer, op, std::max(config.warmup_iters, 1), false));
    constexpr double kMostIters = 1e6;
    const int iters =
        static_cast<int>(std::clamp(std::ceil(config.round_seconds / std::max(per_call, 1e-9)),
                                    static_cast<double>(config.iters), kMostIters));
    // A round: ours and raw MPI in kSlices alternating slices of the round's
    // calls (raw first in every other pair), so a slow spell of a shared
    // machine that lasts longer than a slice falls on both; the round's ratio
    // is ours over raw summed over its slices.
    constexpr int kSlices = 8;
    const int slice_iters = std::max(1, iters / kSlices);
    std::vector<double> ours, ours_async, baseline, ratios, cpu;
    for (int round = 0; round < config.rounds; ++round) {
      double ours_seconds = 0.0, raw_seconds = 0.0, cpu_seconds = 0.0;
      for (int slice = 0; slice < kSlices; ++slice) {
        for (int turn = 0; turn < 2; ++turn) {
          const bool raw_turn = (turn == 0) == (slice % 2 == 1);
          if (raw_turn && !raw) continue;
          buffer.fill_(1.0 / 1024);
          if (raw_turn) {
            raw_seconds += comm->sum(time_raw_mpi(*comm, buffer, slice_iters)) / n;
          } else {
            const double cpu_before = process_cpu_seconds();
            ours_seconds += comm->sum(time_ours(*comm, buffer, op, slice_iters, false)) / n;
            cpu_seconds += comm->max(process_cpu_seconds() - cpu_before);
          }
        }
      }
      ours.push_back(ours_seconds / kSlices);
      cpu.push_back(cpu_seconds / (kSlices * slice_iters));
      if (raw) {
        baseline.push_back(raw_seconds / kSlices);
        ratios.push_back(ours_seconds / raw_seconds);
      }
      buffer.fill_(1.0 / 1024);
      ours_async.push_back(comm->sum(time_ours(*comm, buffer, op, iters, true)) / n);
    }
    const double seconds = median(ours);
    const double actual_bytes = static_cast<double>(count * element_size);
    const double algbw = actual_bytes / seconds / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (info.rank == 0) {
      std::printf("%12lld %12lld %6s %5s %11.2f %9.3f %9.3f %7lld %11.2f",
                  (long long)(count * element_size), (long long)count, config.dtype.c_str(),
                  config.op.c_str(), seconds * 1e6, algbw, busbw, (long long)wrong,
                  median(ours_async) * 1e6);
      if (raw) {
        const double raw_seconds = median(baseline);
        std::printf(" %11.2f %7.3f", raw_seconds * 1e6, median(ratios));
      } else {
        std::printf(" %11s %7s", "-", "-");
      }
      const double traffic_mb = actual_bytes * 2.0 * (n - 1) / n / 1e6;
      std::printf(" %10.1f %7d\n", n > 1 ? median(cpu) * 1e6 / traffic_mb : 0.0,
                  kSlices * slice_iters);
      std::fflush(stdout);
    }
  }
  if (info.rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", (long long)total_wrong,
                total_wrong == 0 ? "OK" : "FAILED");
  }
  return total_wrong == 0 ? 0 : 1;
}
