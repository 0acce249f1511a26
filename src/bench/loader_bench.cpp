// vqa_loader_bench: how much of a training step the data path costs. A
// consumer takes a fixed time per batch (a stand-in for the model step);
// the bench reports samples/s and the fraction of step time next() spent
// waiting for the prefetch thread. Run it under mpirun like the job.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "data/loader.h"          // ShardedLoader
#include "runtime/check.h"        // fatal_user_error
#include "runtime/distributed.h"  // distributed_init, distributed_sum, distributed_max

namespace po = boost::program_options;

namespace {

struct BenchOptions {
  std::string data, split = "train";
  int64_t batch = 32;
  int prefetch = 2;
  double compute_ms = 20.0;
  int64_t epochs = 2;
};

BenchOptions parse_options(int argc, char** argv) {
  BenchOptions options;
  po::options_description description("vqa_loader_bench options");
  description.add_options()("help,h", "show this help")(
      "data", po::value(&options.data)->required(), "dataset file (vqa_prep output)")(
      "split", po::value(&options.split)->default_value(options.split), "train or test")(
      "batch", po::value(&options.batch)->default_value(options.batch), "batch per rank")(
      "prefetch", po::value(&options.prefetch)->default_value(options.prefetch),
      "batches prepared ahead (0: none)")(
      "compute-ms", po::value(&options.compute_ms)->default_value(options.compute_ms),
      "consumer time per batch, milliseconds")(
      "epochs", po::value(&options.epochs)->default_value(options.epochs), "epochs to time");
  po::variables_map values;
  try {
    po::store(po::parse_command_line(argc, argv, description), values);
    if (values.count("help")) {
      std::cout << description;
      std::exit(0);
    }
    po::notify(values);
  } catch (const po::error& e) {
    vqa::runtime::fatal_user_error(std::string(e.what()) + " (see --help)");
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const auto& rank = vqa::runtime::distributed_init(&argc, &argv);
  const BenchOptions options = parse_options(argc, argv);
  double elapsed = 0.0, wait = 0.0;
  int64_t samples = 0, steps = 0, dataset_size = 0;
  try {
    vqa::data::LoaderOptions loader_options;
    loader_options.batch_per_rank = options.batch;
    loader_options.prefetch_depth = options.prefetch;
    loader_options.rank = rank.rank;
    loader_options.world_size = rank.world_size;
    vqa::data::ShardedLoader loader(options.data, options.split, loader_options);
    dataset_size = loader.info().num_questions;
    const auto compute = std::chrono::duration<double, std::milli>(options.compute_ms);
    vqa::data::Batch batch;
    // Epoch 0 warms the page cache and the I/O thread; epochs 1.. are timed.
    for (int64_t epoch = 0; epoch <= options.epochs; ++epoch) {
      const double wait_before = loader.wait_seconds();
      const auto start = std::chrono::steady_clock::now();
      loader.start_epoch(epoch);
      while (loader.next(batch)) {
        std::this_thread::sleep_for(compute);  // the model step
        if (epoch > 0) samples += batch.size(), ++steps;
      }
      if (epoch > 0) {
        elapsed += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        wait += loader.wait_seconds() - wait_before;
      }
    }
  } catch (const std::exception& e) {
    vqa::runtime::fatal_user_error(e.what());
  }
  const double total_samples = vqa::runtime::distributed_sum(static_cast<double>(samples));
  const double slowest =
      static_cast<double>(vqa::runtime::distributed_max(static_cast<int64_t>(elapsed * 1e6))) / 1e6;
  const double worst_wait =
      static_cast<double>(vqa::runtime::distributed_max(static_cast<int64_t>(wait * 1e6))) / 1e6;
  if (rank.rank == 0) {
    std::printf(
        "dataset %s [%s]: %ld questions; %d ranks x batch %ld, prefetch %d, consumer %.1f "
        "ms/batch\n",
        options.data.c_str(), options.split.c_str(), static_cast<long>(dataset_size),
        rank.world_size, static_cast<long>(options.batch), options.prefetch, options.compute_ms);
    std::printf(
        "%ld epochs, %ld steps per rank: %.0f samples/s (all ranks), waiting for data %.2f%% of "
        "step time (worst rank), %.3f ms per step\n",
        static_cast<long>(options.epochs), static_cast<long>(steps), total_samples / slowest,
        100.0 * worst_wait / slowest, steps ? 1e3 * worst_wait / steps : 0.0);
  }
  vqa::runtime::distributed_finalize();
  return 0;
}
